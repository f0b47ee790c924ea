#include "ration/memory/budget_policy.h"

#include "ration/core/check.h"
#include "ration/core/node.h"

namespace ration::memory {

BudgetPolicy::BudgetPolicy(const Plan& plan, const StepProfile& profile)
    : dropped_(plan.dropped_keys(profile)), store_from_(plan.store_from) {
  ops_.reserve(profile.nodes.size());
  for (const auto& n : profile.nodes) ops_.push_back(n.op);
}

void BudgetPolicy::begin_step() {
  ordinal_of_seq_.clear();
  backward_step_ = -1;
  recompute_ms_ = 0;
  recomputed_nodes_ = 0;
  dropped_values_ = 0;
}

void BudgetPolicy::after_forward_node(Node& node, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&) {
  const int64_t ordinal = static_cast<int64_t>(ordinal_of_seq_.size());
  RATION_CHECK(ordinal < static_cast<int64_t>(ops_.size()) && ops_[static_cast<size_t>(ordinal)] == node.spec.name,
               "the model's graph differs from the profiled one at node ", ordinal, " (",
               ordinal < static_cast<int64_t>(ops_.size()) ? ops_[static_cast<size_t>(ordinal)] : std::string("end"),
               " profiled, ", node.spec.name,
               " now): memory plans assume a static graph and same-shaped batches (use train.drop_last-style batching)");
  ordinal_of_seq_[node.seq] = ordinal;
  for (auto& ref : node.saved) {
    SavedValue& v = *ref.value;
    if (v.pinned() || v.state() != SavedState::Resident) continue;
    auto it = ordinal_of_seq_.find(v.producer()->seq);
    if (it == ordinal_of_seq_.end()) continue;
    if (dropped_.count({it->second, v.output_nr()})) {
      v.drop();
      ++dropped_values_;
    }
  }
}

void BudgetPolicy::before_backward_node(Node&) { ++backward_step_; }

bool BudgetPolicy::store_rebuilt(Node& producer) {
  if (store_from_.empty()) return true;
  auto it = ordinal_of_seq_.find(producer.seq);
  if (it == ordinal_of_seq_.end()) return true;
  auto from = store_from_.find(it->second);
  return from == store_from_.end() || backward_step_ >= from->second;
}

void BudgetPolicy::on_recompute(Node&, double ms) {
  recompute_ms_ += ms;
  ++recomputed_nodes_;
}

}  // namespace ration::memory
