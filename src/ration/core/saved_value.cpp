#include "ration/core/saved_value.h"

#include <atomic>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"

namespace ration {
namespace {
std::atomic<uint64_t> g_next_id{1};
thread_local MemoryPolicy* t_policy = nullptr;
}  // namespace

const char* to_string(SavedState s) {
  switch (s) {
    case SavedState::Unsaved: return "unsaved";
    case SavedState::Resident: return "resident";
    case SavedState::Dropped: return "dropped";
    case SavedState::Offloaded: return "offloaded";
    case SavedState::Released: return "released";
  }
  return "?";
}

SavedValue::SavedValue(std::shared_ptr<Node> producer, int output_nr, int64_t nbytes)
    : id_(g_next_id++), producer_(producer), producer_seq_(producer->seq), output_nr_(output_nr), nbytes_(nbytes) {
  RATION_ASSERT(producer_seq_ != 0, "a recorded node has sequence number 0");
  label_ = detail::str(producer->spec.name, "#", producer->seq, ":", output_nr_);
}

std::shared_ptr<Node> SavedValue::live_producer() const {
  std::shared_ptr<Node> p = producer_.lock();
  RATION_ASSERT(p != nullptr, "the producer of saved value ", label_, " is gone while the value is still read ",
                "(every reader holds the producer through its edge)");
  return p;
}

SavedValue::SavedValue(const at::Tensor& leaf) : id_(g_next_id++), data_(leaf), state_(SavedState::Resident) {
  nbytes_ = static_cast<int64_t>(leaf.numel()) * static_cast<int64_t>(leaf.element_size());
  label_ = "leaf";
}

uint32_t SavedValue::save(const at::Tensor& data) {
  if (pinned()) return data_._version();
  if (state_ == SavedState::Dropped || state_ == SavedState::Offloaded) {
    // Another consumer saves a value the policy already moved: it stays where the policy put it.
    ++pending_uses_;
    return data._version();
  }
  if (state_ != SavedState::Resident) {
    data_ = data;
    state_ = SavedState::Resident;
    // A view of a parameter (w.t()) stays accounted as the parameter it is.
    const memory::Category c = memory::category_of(data_);
    if (c != memory::Category::Parameters && c != memory::Category::Optimizer)
      memory::retag(data_, memory::Category::SavedActivations);
  }
  ++pending_uses_;
  return data_._version();
}

at::Tensor SavedValue::unpack(uint32_t expected_version) {
  if (state_ == SavedState::Offloaded) {
    MemoryPolicy* policy = current_policy();
    RATION_CHECK(policy != nullptr, "saved value ", label_,
                 " was offloaded but no memory policy is installed to fetch it back; keep the "
                 "OffloadScope/StepRuntime step alive until backward finishes");
    at::Tensor t = policy->fetch(*this);
    if (state_ == SavedState::Offloaded) {
      restore(t);
      return data_;
    }
    // The tier lost it: fetch marked it Dropped (offload_failed), rebuilt below like any dropped value.
  }
  switch (state_) {
    case SavedState::Resident:
      break;
    case SavedState::Dropped:
    case SavedState::Unsaved:
      live_producer()->recompute(/*store_required=*/true);
      RATION_ASSERT(state_ == SavedState::Resident, "recompute did not restore ", label_);
      return data_;  // rebuilt: version is fresh
    case SavedState::Offloaded:
      RATION_ASSERT(false, "unreachable: offloaded values were fetched above");
      break;
    case SavedState::Released:
      RATION_CHECK(false, "Trying to backward through the graph a second time (saved value ", label_,
                   " was already freed). Pass retain_graph=true to the first backward if you need to "
                   "backward twice.");
  }
  RATION_CHECK(data_._version() == expected_version, "a tensor saved for backward (", label_,
               ") was modified in place after it was saved: version ", data_._version(), ", expected ",
               expected_version, ". Use an out-of-place op or clone before modifying.");
  return data_;
}

at::Tensor SavedValue::materialize() {
  if (state_ == SavedState::Resident) return data_;
  if (state_ == SavedState::Offloaded) return unpack(0);
  RATION_CHECK(!pinned(), "constant input ", label_, " has no data");
  std::vector<at::Tensor> outs = live_producer()->recompute();
  return outs.at(static_cast<size_t>(output_nr_));
}

void SavedValue::release_use(bool retain) {
  if (pinned()) return;
  RATION_ASSERT(pending_uses_ > 0, "release of ", label_, " with no pending use");
  --pending_uses_;
  if (pending_uses_ == 0 && !retain) {
    data_ = at::Tensor();
    state_ = SavedState::Released;
  }
}

void SavedValue::accept_rebuilt(const at::Tensor& data) {
  if (state_ != SavedState::Dropped) return;
  restore(data);
  memory::retag(data_, memory::Category::SavedActivations);
}

void SavedValue::drop() {
  RATION_CHECK(!pinned(), "cannot drop a leaf/constant value");
  RATION_ASSERT(state_ == SavedState::Resident, "drop of ", label_, " in state ", to_string(state_));
  data_ = at::Tensor();
  state_ = SavedState::Dropped;
}

void SavedValue::mark_offloaded() {
  RATION_ASSERT(state_ == SavedState::Resident, "offload of ", label_, " in state ", to_string(state_));
  data_ = at::Tensor();
  state_ = SavedState::Offloaded;
}

void SavedValue::offload_failed() {
  RATION_ASSERT(state_ == SavedState::Offloaded, "offload_failed of ", label_, " in state ", to_string(state_));
  state_ = SavedState::Dropped;
}

void SavedValue::restore(const at::Tensor& data) {
  data_ = data;
  state_ = SavedState::Resident;
}

at::Tensor MemoryPolicy::fetch(SavedValue& value) {
  RATION_CHECK(false, "memory policy cannot fetch offloaded value ", value.label());
}

MemoryPolicy* current_policy() { return t_policy; }
PolicyScope::PolicyScope(MemoryPolicy* policy) : prev_(t_policy) { t_policy = policy; }
PolicyScope::~PolicyScope() { t_policy = prev_; }

}  // namespace ration
