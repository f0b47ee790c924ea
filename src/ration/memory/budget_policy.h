// budget_policy.h — executes a keep/recompute/offload plan (seed methods M0 + M2) on every training step.
// Owns: mapping this step's nodes to the profiled ordinals (checking the graph is the one profiled),
//       dropping the planned saved values right after their node's forward, handing the planned offloads
//       (with their copy deadline and prefetch distance) to an OffloadEngine, deciding for each re-run
//       made to feed another re-run whether it stores its outputs (Plan::store_from: until that backward
//       step the re-run is transient), and measuring the time spent re-running producers in backward.
//       The model code never changes: install with PolicyScope.
#pragma once
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ration/memory/offload.h"
#include "ration/memory/planner.h"
#include "ration/memory/profile.h"
#include "ration/memory/saved_value.h"

namespace ration::memory {

class BudgetPolicy : public MemoryPolicy {
 public:
  // Executes `plan`, made from `profile`; the profiled op names detect a graph that differs from it.
  // A plan with offloaded groups needs `engine` (kept by the caller for the policy's lifetime).
  BudgetPolicy(const Plan& plan, const StepProfile& profile, OffloadEngine* engine = nullptr);
  void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) override;
  void before_backward_node(Node& node) override;
  at::Tensor fetch(SavedValue& value) override;
  void on_recompute(Node& node, double ms) override;
  bool store_rebuilt(Node& producer) override;
  // Call at the start of each step.
  void begin_step();
  double recompute_ms() const { return recompute_ms_; }   // this step
  int64_t recomputed_nodes() const { return recomputed_nodes_; }
  int64_t dropped_values() const { return dropped_values_; }
  int64_t offloaded_values() const { return offloaded_values_; }

 private:
  std::set<ValueKey> dropped_;
  std::map<ValueKey, Plan::OffloadOrder> offloaded_;
  OffloadEngine* engine_;
  std::map<int64_t, int64_t> store_from_;  // producer ordinal -> first backward step that stores
  int64_t backward_step_ = -1;             // index of the running backward node in this step's order
  std::vector<std::string> ops_;
  std::unordered_map<uint64_t, int64_t> ordinal_of_seq_;
  double recompute_ms_ = 0;
  int64_t recomputed_nodes_ = 0;
  int64_t dropped_values_ = 0;
  int64_t offloaded_values_ = 0;
};

}  // namespace ration::memory
