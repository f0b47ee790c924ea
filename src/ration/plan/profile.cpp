#include "ration/plan/profile.h"

#include <algorithm>
#include <chrono>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"

namespace ration::memory {
namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int64_t StepProfile::storage_of(const ValueKey& k) const {
  // A node output's storage is recorded twice, in its node's output_storage and in value_storage (the
  // same id: ProfilePolicy writes both): read by position, without a walk down the map.
  if (!k.is_leaf() && static_cast<size_t>(k.producer) < nodes.size() && k.output >= 0) {
    const auto& out = nodes[static_cast<size_t>(k.producer)].output_storage;
    if (static_cast<size_t>(k.output) < out.size()) return out[static_cast<size_t>(k.output)];
  }
  auto it = value_storage.find(k);
  return it == value_storage.end() ? -1 : it->second;
}

ProfilePolicy::ProfilePolicy(const StepOrder& order) : order_(order) {
  const Stats now = stats();
  excluded_bytes_ = now.current[static_cast<int>(Category::Data)];
  profile_.baseline_bytes = now.current_bytes - excluded_bytes_;
  reset_peak();
}

int64_t ProfilePolicy::storage_id(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return -1;
  const c10::Storage& st = t.storage();
  const void* impl = st.unsafeGetStorageImpl();
  auto it = storage_ids_.find(impl);
  if (it != storage_ids_.end() && !it->second.weak.expired()) return it->second.id;
  const int64_t id = static_cast<int64_t>(profile_.storages.size());
  profile_.storages.push_back({static_cast<int64_t>(st.nbytes()), -1});
  storage_ids_.erase(impl);
  storage_ids_.emplace(impl, Seen{id, st.getWeakStorageImpl()});
  return id;
}

ValueKey ProfilePolicy::key_of(const SavedValue& v) const {
  if (v.pinned()) return {-1, static_cast<int>(v.id())};
  const int64_t ordinal = order_.of(v);
  RATION_ASSERT(ordinal >= 0, "saved value ", v.label(), " from a node outside the profiled step");
  return {ordinal, v.output_nr()};
}

// Values the model code let go of since the last look were alive when the previous node ended, which is
// where the current node's measured interval (and its peak) starts: count them through `now`.
void ProfilePolicy::sweep_dead_values(int64_t now) {
  size_t kept = 0;
  for (size_t i = 0; i < live_values_.size(); ++i) {
    if (live_values_[i].second.expired()) {
      profile_.value_last_alive[live_values_[i].first] = now;
    } else {
      if (kept != i) live_values_[kept] = std::move(live_values_[i]);  // never self-move a weak_ptr
      ++kept;
    }
  }
  live_values_.resize(kept);
}

void ProfilePolicy::after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& outputs) {
  const int64_t ordinal = order_.of(node);
  RATION_ASSERT(ordinal == static_cast<int64_t>(profile_.nodes.size()), "profiled node ", node.spec.name,
                " has step position ", ordinal, ", expected ", profile_.nodes.size());
  sweep_dead_values(ordinal);
  ProfiledNode pn;
  pn.op = node.spec.name;
  pn.scope = node.scope;
  pn.forward_ms = node.forward_ms;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.inputs[i]) continue;
    const ValueKey k = key_of(*node.inputs[i]);
    pn.inputs.push_back(k);
    if (!profile_.value_storage.count(k)) profile_.value_storage[k] = storage_id(inputs[i]);
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    bool is_new = false;
    if (outputs[j].defined() && outputs[j].has_storage()) {
      auto it = storage_ids_.find(outputs[j].storage().unsafeGetStorageImpl());
      is_new = it == storage_ids_.end() || it->second.weak.expired();
    }
    const int64_t s = storage_id(outputs[j]);
    pn.output_storage.push_back(s);
    profile_.value_storage[{ordinal, static_cast<int>(j)}] = s;
    if (is_new && s >= 0) {
      profile_.storages[static_cast<size_t>(s)].allocated_by = ordinal;
      pn.allocated_storage.push_back(s);
    }
  }
  for (const auto& ref : node.saved) pn.saved.push_back(key_of(*ref.value));
  for (size_t j = 0; j < node.output_values.size(); ++j)
    live_values_.emplace_back(ValueKey{ordinal, static_cast<int>(j)}, node.output_values[j]);
  // Internal outputs (masks, statistics) never reach model code: only saved handles hold them, and the
  // op's own output list until it returns, which is after the next interval's measurement starts.
  for (size_t j = node.output_values.size(); j < outputs.size(); ++j)
    profile_.value_last_alive[{ordinal, static_cast<int>(j)}] = ordinal + 1;
  const Stats now = stats();
  pn.peak_bytes = now.peak_bytes - excluded_bytes_;
  pn.end_bytes = now.current_bytes - excluded_bytes_;
  reset_peak();
  profile_.forward_ms += node.forward_ms;
  profile_.nodes.push_back(std::move(pn));
}

void ProfilePolicy::before_backward_node(Node& node) {
  const int64_t ordinal = order_.of(node);
  RATION_ASSERT(ordinal >= 0, "backward of a node outside the profiled step");
  if (profile_.backward_order.empty()) {
    sweep_dead_values(static_cast<int64_t>(profile_.nodes.size()));
    reset_peak();  // loss seeding etc. belongs to the first backward node
  }
  current_backward_ = ordinal;
  profile_.backward_start_bytes.push_back(current_bytes() - excluded_bytes_);
  backward_start_ms_ = now_ms();
  profile_.backward_order.push_back(ordinal);
}

void ProfilePolicy::after_backward_node(Node& node) {
  const double ms = now_ms() - backward_start_ms_;
  profile_.nodes[static_cast<size_t>(current_backward_)].backward_ms = ms;
  profile_.backward_ms += ms;
  profile_.backward_peak_bytes.push_back(stats().peak_bytes - excluded_bytes_);
  reset_peak();
  (void)node;
}

StepProfile ProfilePolicy::finish() {
  int64_t peak = 0;
  for (const auto& n : profile_.nodes) peak = std::max(peak, n.peak_bytes);
  for (auto p : profile_.backward_peak_bytes) peak = std::max(peak, p);
  profile_.measured_peak_bytes = peak;
  return std::move(profile_);
}

}  // namespace ration::memory
