// budget_policy.h — executes a keep/recompute/offload plan on every training step (docs/METHODS.md,
// "Keep/recompute/offload planning").
// Owns: the plan's decisions for this step's nodes: checking each node is the one profiled at its
//       position, dropping the planned saved values right after their node's forward, handing the
//       planned offloads (with their copy deadline and prefetch distance) to an OffloadEngine, and
//       deciding for each re-run made to feed another re-run whether it stores its outputs
//       (Plan::store_from: until that backward step the re-run is transient).
// Does not own: node positions and step boundaries (StepOrder, train::StepRuntime), the copy mechanism
//       (OffloadEngine), or recompute itself (SavedValue / Node::recompute).
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ration/offload/engine.h"
#include "ration/plan/planner.h"
#include "ration/plan/profile.h"
#include "ration/core/step_order.h"
#include "ration/core/step_policy.h"

namespace ration::memory {

class BudgetPolicy : public StepPolicy {
 public:
  // Executes `plan`, made from `profile`; the profiled op names detect a graph that differs from it.
  // `order` gives this step's node positions; a plan with offloaded groups needs `engine`. Both are
  // kept by the caller for the policy's lifetime.
  BudgetPolicy(const Plan& plan, const StepProfile& profile, const StepOrder& order, OffloadEngine* engine);
  void begin_step() override;
  void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) override;
  void begin_backward() override { backward_step_ = -1; }
  void before_backward_node(Node& node) override;
  bool store_rebuilt(Node& producer) override;
  int64_t dropped_values() const { return dropped_values_; }      // this step
  int64_t offloaded_values() const { return offloaded_values_; }  // this step

 private:
  std::set<ValueKey> dropped_;
  std::map<ValueKey, Plan::OffloadOrder> offloaded_;
  const StepOrder& order_;
  OffloadEngine* engine_;
  std::map<int64_t, int64_t> store_from_;  // producer ordinal -> first backward step that stores
  int64_t backward_step_ = -1;             // index of the running backward node in this step's order
  std::vector<std::string> ops_;
  int64_t dropped_values_ = 0;
  int64_t offloaded_values_ = 0;
};

}  // namespace ration::memory
