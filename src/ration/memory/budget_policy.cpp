#include "ration/memory/budget_policy.h"

#include "ration/core/check.h"
#include "ration/core/node.h"

namespace ration::memory {

BudgetPolicy::BudgetPolicy(const Plan& plan, const StepProfile& profile, OffloadEngine* engine)
    : dropped_(plan.dropped_keys(profile)), offloaded_(plan.offloaded_keys(profile)), engine_(engine),
      store_from_(plan.store_from) {
  RATION_CHECK(offloaded_.empty() || engine_ != nullptr, "a plan that offloads needs an offload engine");
  ops_.reserve(profile.nodes.size());
  for (const auto& n : profile.nodes) ops_.push_back(n.op);
}

void BudgetPolicy::begin_step() {
  ordinal_of_seq_.clear();
  backward_step_ = -1;
  recompute_ms_ = 0;
  recomputed_nodes_ = 0;
  dropped_values_ = 0;
  offloaded_values_ = 0;
}

void BudgetPolicy::after_forward_node(Node& node, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&) {
  const int64_t ordinal = static_cast<int64_t>(ordinal_of_seq_.size());
  RATION_CHECK(ordinal < static_cast<int64_t>(ops_.size()) && ops_[static_cast<size_t>(ordinal)] == node.spec.name,
               "the model's graph differs from the profiled one at node ", ordinal, " (",
               ordinal < static_cast<int64_t>(ops_.size()) ? ops_[static_cast<size_t>(ordinal)] : std::string("end"),
               " profiled, ", node.spec.name,
               " now): memory plans assume a static graph and same-shaped batches (use train.drop_last-style batching)");
  ordinal_of_seq_[node.seq] = ordinal;
  if (engine_) {
    const int64_t engine_ordinal = engine_->on_forward_node(node);
    RATION_ASSERT(engine_ordinal == ordinal, "offload engine at node ", engine_ordinal, ", plan at ", ordinal);
  }
  for (auto& ref : node.saved) {
    SavedValue& v = *ref.value;
    if (v.pinned() || v.state() != SavedState::Resident) continue;
    auto it = ordinal_of_seq_.find(v.producer()->seq);
    if (it == ordinal_of_seq_.end()) continue;
    const ValueKey key{it->second, v.output_nr()};
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
  if (engine_) engine_->forward_node_done(ordinal);
}

void BudgetPolicy::before_backward_node(Node& node) {
  ++backward_step_;
  if (engine_) engine_->before_backward_node(node);
}

at::Tensor BudgetPolicy::fetch(SavedValue& value) {
  RATION_CHECK(engine_ != nullptr, "saved value ", value.label(), " is offloaded but this plan has no offload engine");
  return engine_->fetch(value);
}

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
