#include "ration/runtime/budget_policy.h"

#include "ration/base/check.h"
#include "ration/core/node.h"

namespace ration::memory {

BudgetPolicy::BudgetPolicy(const Plan& plan, const StepProfile& profile, const StepOrder& order, OffloadEngine* engine)
    : dropped_(plan.dropped_keys(profile)), offloaded_(plan.offloaded_keys(profile)), order_(order), engine_(engine),
      store_from_(plan.store_from) {
  RATION_CHECK(offloaded_.empty() || engine_ != nullptr, "a plan that offloads needs an offload engine");
  // Plan mode for the copy-in pool: nothing held across steps; buffers backward makes are freed at the
  // step's end, as the plan's simulator counts them (Prediction::copy_in_pool).
  if (engine_ != nullptr) engine_->reserve_copy_in({});
  ops_.reserve(profile.nodes.size());
  for (const auto& n : profile.nodes) ops_.push_back(n.op);
}

void BudgetPolicy::begin_step() {
  backward_step_ = -1;
  dropped_values_ = 0;
  offloaded_values_ = 0;
}

void BudgetPolicy::after_forward_node(Node& node, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&) {
  const int64_t ordinal = order_.of(node);
  const int64_t profiled = static_cast<int64_t>(ops_.size());
  RATION_CHECK(ordinal < profiled && ops_[static_cast<size_t>(ordinal)] == node.spec.name,
               "the model's graph differs from the profiled one at node ", ordinal, " (",
               ordinal < profiled ? ops_[static_cast<size_t>(ordinal)] : std::string("end"), " profiled, ",
               node.spec.name,
               " now): memory plans assume a static graph and same-shaped batches (use train.drop_last-style batching)");
  for (auto& ref : node.saved) {
    SavedValue& v = *ref.value;
    if (v.pinned() || v.state() != SavedState::Resident) continue;
    const int64_t producer = order_.of(v);
    if (producer < 0) continue;  // made before this step: not the plan's
    const ValueKey key{producer, v.output_nr()};
    bool drop = dropped_.count(key) > 0;
    if (auto off = offloaded_.find(key); off != offloaded_.end()) {
      if (engine_->offload(ref.value, off->second.deadline, off->second.prefetch)) {
        ++offloaded_values_;
        continue;
      }
      drop = true;  // not offloadable after all: recomputing it frees the same memory
    }
    if (drop) {
      v.drop();
      ++dropped_values_;
    }
  }
}

void BudgetPolicy::before_backward_node(Node&) { ++backward_step_; }

bool BudgetPolicy::store_rebuilt(Node& producer) {
  if (store_from_.empty()) return true;
  const int64_t ordinal = order_.of(producer);
  if (ordinal < 0) return true;
  auto from = store_from_.find(ordinal);
  return from == store_from_.end() || backward_step_ >= from->second;
}

}  // namespace ration::memory
