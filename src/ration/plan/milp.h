// plan/milp.h — the exact yardstick for keep/recompute plans: the choice written as a mixed-integer program
// over the same profile and the same simulator rules (plan/simulator.h), solved by COIN-OR CBC, so that a
// strategy's recompute time can be compared with the least any keep/recompute decision reaches at a budget.
// docs/METHODS.md, "The exact yardstick".
// Built as its own library (ration_plan_milp) only where CBC is installed: make_plan never calls it.
// Owns: the program (variables, rows), the solve with its time limit, checking its answer against the
//       simulator (and cutting off an answer the simulator refuses), a Plan made from its decisions.
// Does not own: the simulator's rules (plan/simulator.h), the groups (plan/context.h), executing a plan
//       (runtime/budget_policy.h).
#pragma once
#include <cstdint>
#include <vector>

#include "ration/plan/planner.h"
#include "ration/plan/profile.h"

namespace ration::memory {

struct ExactPlanOptions {
  double time_limit_s = 60;  // per solve; a solve stopped by it returns its best answer, not proven optimal
  int max_cuts = 20;         // answers the simulator refuses, cut off and solved again, before giving up
};

struct ExactPlan {
  enum class Status { Optimal, TimeLimit, NoSolution };
  Status status = Status::NoSolution;
  // Per plan group (forward order, as Plan::groups): Keep or Recompute.
  std::vector<Decision> decisions;
  double recompute_ms = 0;      // the program's objective for them: re-run producers' measured forward ms
  double bound_ms = 0;          // the solver's lower bound on any decision's recompute time
  // The program's own peak for them: its memory rows (every forward and backward node boundary) evaluated.
  int64_t predicted_peak_bytes = 0;
  // The simulator's for them (the program's rows for re-runs are a lower bound where re-runs of one step
  // overlap; an answer whose simulated peak is over the budget is cut off and the program solved again).
  int64_t simulated_peak_bytes = 0;
  double simulated_recompute_ms = 0;
  int columns = 0, rows = 0;
  int cuts = 0;                 // answers cut off
  double solve_s = 0;           // wall time of every solve together
};

// The fewest re-run milliseconds of any keep/recompute decision whose simulated peak fits
// options.budget_bytes (options.extra_fixed_bytes counted), without transient re-runs or offload.
ExactPlan solve_exact_plan(const StepProfile& profile, const PlanOptions& options, const ExactPlanOptions& exact = {});

// A plan with the given decisions (per plan group) and its simulated prediction, for StepRuntime::use_plan.
Plan plan_with_decisions(const StepProfile& profile, const PlanOptions& options, const std::vector<Decision>& decisions);

}  // namespace ration::memory
