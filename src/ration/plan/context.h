// plan/context.h — what every planner strategy works over: the saved groups of one profiled step, the
// budget, the simulator behind a prediction for any set of decisions, the knapsack order, the greedy
// descent, and the figures only some strategies need (the feasible floor, the chain candidates), each
// computed on first use and then kept.
// Owns: the groups' static data (bytes, producer, single-drop recompute cost), predictions, the
//       knapsack order and what releasing a group means (offload where the copy hides, else recompute),
//       the descent, the lazily computed floor and chain candidates.
// Does not own: the strategies themselves (plan/strategies.cpp), user overrides and the final plan
//       (planner.cpp), the simulator's rules (plan/simulator.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ration/plan/chain.h"
#include "ration/plan/graph.h"
#include "ration/plan/incremental.h"
#include "ration/plan/planner.h"
#include "ration/plan/profile.h"

namespace ration::memory {

// One strategy's answer: a decision per plan group (forward order) and, for binomial chain schedules,
// the transient re-runs (Plan::store_from) and the slot count.
struct Choice {
  std::vector<Decision> decisions;
  std::map<int64_t, int64_t> store_from;
  int64_t chain_slots = 0;
};

// One measured forward time per node is noisy: nodes doing the same work (same op, module path up to
// block numbers, bytes allocated) get the median of their measured times (the knapsack's costs).
std::vector<double> typical_forward_ms(const PlanGraph& g);

class PlanContext {
 public:
  PlanContext(const StepProfile& profile, const PlanOptions& options);

  const PlanGraph& graph() const { return *graph_; }  // the profile as flat arrays, built once per plan
  const PlanOptions& options() const { return options_; }
  int64_t budget() const { return options_.budget_bytes; }
  const std::vector<Group>& groups() const { return groups_; }  // decisions all Keep
  // The group saved on storage s (-1: none, or s out of range).
  int group_of_storage(int64_t s) const {
    return s >= 0 && static_cast<size_t>(s) < group_of_storage_.size() ? group_of_storage_[static_cast<size_t>(s)] : -1;
  }
  size_t size() const { return groups_.size(); }
  Choice all_kept() const;

  // Prediction for decisions per group, with transient re-runs `store_from`.
  Prediction predict(const std::vector<Decision>& decisions,
                     const std::map<int64_t, int64_t>& store_from = {}) const;
  // The predicted peak where it is below `stop_at`, else a value >= stop_at (the simulation stops where the
  // peak reaches it): for a caller that only compares the peak with stop_at. A whole simulation's
  // prediction is kept for predict; a stopped one is not.
  int64_t peak_below(const std::vector<Decision>& decisions, int64_t stop_at,
                     const std::map<int64_t, int64_t>& store_from = {}) const;
  // The copy queues' predicted stall alone (Prediction::offload_stall_ms), without simulating memory.
  double offload_stall(const std::vector<Decision>& decisions) const;
  bool fits(const std::vector<Decision>& decisions, const std::map<int64_t, int64_t>& store_from = {}) const;
  bool fits(const Choice& c) const { return fits(c.decisions, c.store_from); }
  int64_t unconstrained_peak() const { return unconstrained_peak_; }  // everything kept
  int64_t fixed_bytes() const { return fixed_bytes_; }

  // Predictions for keep/recompute decisions (no offload, no transient re-runs) kept up to date as single
  // groups change: what the descents and the strategies' fit checks use (plan/incremental.h).
  bool keep_or_recompute(const std::vector<Decision>& decisions) const;
  IncrementalPeak incremental(const std::vector<Decision>& decisions) const;

  // Group indices, cheapest predicted cost (recompute, or an offload that does not hide) per byte first.
  const std::vector<size_t>& knapsack_order() const { return by_ratio_; }
  // What releasing group i means, given the other decisions: Offload where its copy alone hides under
  // compute (knapsack with offload only) and the tier still has room for it next to the groups already
  // offloaded (OffloadCosts::capacity_bytes, each rounded up to a file-system page), else Recompute. A
  // group that does not fit the tier is recomputed in the plan, never as a run-time fall-back.
  Decision release_decision(size_t i, const std::vector<Decision>& decisions) const;
  // Greedy descent: take releases in `order` when they lower the predicted peak, in passes, until the
  // prediction fits `target` or no release helps. Returns the peak reached. `reached`, if given, is left
  // holding the incremental peak of the decisions reached (keep/recompute descents; empty otherwise), so
  // that a strategy continuing from them does not build it again. `trail`, if given, gets the peak at
  // the start and, per release taken, the group, its decision and the peak after it.
  struct Trail {
    struct Release {
      size_t group;
      Decision decision;
      int64_t peak;  // after it
    };
    int64_t start = 0;
    std::vector<Release> releases;
  };
  int64_t descend(std::vector<Decision>& decisions, int64_t target, const std::vector<size_t>& order,
                  std::optional<IncrementalPeak>* reached = nullptr, Trail* trail = nullptr) const;

  // Computed on first use.
  const std::string& why_not_chain();                      // empty: the profile is a chain
  const std::vector<ChainCandidate>& chain_candidates();   // empty unless a chain
  // The feasible floor: the lowest peak of everything kept, full descents in the memory orders and the
  // chain candidates. It never depends on measured time, so the same model gets the same floor on every
  // run: a budget is met or refused deterministically.
  int64_t minimum_peak();
  // A descent to the budget in the first memory order that reaches it (none when the floor is a chain
  // schedule or above the budget): what the knapsack falls back to when its time-ordered descent stops
  // above the budget, so that timing only chooses between plans that fit.
  std::optional<Choice> reach_budget_by_memory_order() const;
  // The plan the budget gives without reading measured time: groups released by recompute in the first
  // memory order whose descent reaches the budget, then kept back where they still fit, latest in that
  // order first; where only a chain's binomial schedule reaches the budget, that schedule; none where only
  // an offload plan fits. Its kept groups and bytes are the plan's initial figure and user overrides are
  // decided from it, so a plan command accepts or refuses the same request on every run (docs/METHODS.md,
  // "Keep / recompute / offload planning").
  const std::optional<Choice>& stable_plan();
  // Keeps back released groups where the plan still fits, latest in `order` first (`inc` holds `decisions`
  // and follows every group kept back).
  void keep_back(IncrementalPeak& inc, std::vector<Decision>& decisions, const std::vector<size_t>& order) const;
  // Memory orders (never measured time): fewest re-run nodes per byte first; largest first (the first
  // kBaseOrders); then their restarts (restart_order), added where a floor's descent in them stalls.
  static constexpr size_t kBaseOrders = 2;
  const std::vector<std::vector<size_t>>& memory_orders() const { return memory_orders_; }
  // Throws the "below the feasible minimum" error when the budget is under minimum_peak(). Where the
  // minimum is not reported (PlanOptions::report_minimum off: a re-plan), "is the floor within the
  // budget" is answered without the floor's whole descents: see budget_within_floor.
  void check_budget_reachable();

 private:
  const StepProfile& profile_;
  const PlanOptions& options_;
  std::shared_ptr<const PlanGraph> graph_;
  std::vector<Group> groups_;
  std::vector<int> group_of_storage_;  // by storage: its group (-1: none)
  std::vector<int64_t> rerun_nodes_;  // per group: nodes a single release re-runs
  std::vector<size_t> by_ratio_;
  // Memory orders: fewest re-run nodes per byte first; largest first. Floors from the two differ by
  // model (the first is lower on transformers, the second on recurrent chains), so both are tried.
  std::vector<std::vector<size_t>> memory_orders_;
  // A descent releases one group at a time and stops where no single release lowers the peak. Releasing
  // the largest values first can move the peak to their own re-run in backward (a ResNet's stem, rebuilt
  // beside its gradients), where no later release helps, while keeping them and releasing the many values
  // live at the first peak goes lower. Where a floor's descent in one of the two memory orders stalls at a
  // backward node that re-runs released groups, a restart of that order is added as a further memory
  // order: the same order without those groups, which stay kept. Memory and structure only, like the
  // orders themselves. docs/METHODS.md, "Cost per byte" (*Restarts*).
  std::vector<char> restarted_;  // per base memory order: its restart was considered
  void restart_order(size_t o, const std::vector<Decision>& stalled);
  // The released groups a backward node re-runs to rebuild what it reads (released inputs of re-run
  // producers included): at the stalled decisions' peak, if that peak is in backward.
  std::vector<size_t> rerun_at_peak(const std::vector<Decision>& stalled) const;
  std::vector<Decision> release_as_;  // per group: Offload or Recompute
  bool any_offload_release_ = false;
  int64_t unconstrained_peak_ = 0;
  int64_t fixed_bytes_ = 0;
  std::optional<std::string> why_not_chain_;
  std::optional<std::vector<ChainCandidate>> chain_candidates_;
  std::optional<int64_t> minimum_peak_;
  // The floor's descents, one per memory order. A descent to a budget takes the same releases as the
  // descent to 0 in the same order until its peak reaches the budget (a try's answer depends only on the
  // committed plan), so reach_budget_by_memory_order reads its prefix instead of descending again.
  std::vector<Trail> floor_trails_;
  // Whether the floor is within the budget, from descents in the memory orders that stop at the budget
  // (their trails kept in floor_trails_: prefixes of the floor's own); false: not shown that way.
  bool budget_within_floor();
  bool within_floor_known_ = false;  // budget_within_floor answered true once
  std::optional<Choice> stable_plan_;
  bool stable_plan_known_ = false;
  // release_decision with the tier's room taken by the offloaded groups (each rounded to a page) given.
  Decision release_decision(size_t i, int64_t offloaded_in_tier) const;
  // The descent with offload, each try priced by the offload-aware incremental peak (plan/offload_peak.h)
  // where its answer is exact, else by a whole-step simulation; the same releases as descend's own loop.
  bool offload_peak_applies(const std::vector<Decision>& decisions) const;
  int64_t descend_by_offload_peak(std::vector<Decision>& decisions, int64_t target, const std::vector<size_t>& order,
                                  Trail* trail) const;
  // The keep/recompute descent (every release a recompute), priced by the incremental peak left in `inc`.
  int64_t descend_by_recompute(std::vector<Decision>& decisions, int64_t target, const std::vector<size_t>& order,
                               std::optional<IncrementalPeak>& inc, Trail* trail = nullptr) const;
  mutable std::optional<IncrementalPeak> all_kept_peak_;
  struct LastPrediction {
    std::vector<Decision> decisions;
    std::map<int64_t, int64_t> store_from;
    Prediction prediction;
  };
  mutable std::optional<LastPrediction> last_prediction_;  // predict's last answer
  // predict, stopped where the peak reaches stop_at (peak_below); only a whole prediction is kept.
  Prediction predict_until(const std::vector<Decision>& decisions, const std::map<int64_t, int64_t>& store_from,
                           int64_t stop_at) const;
  // Group decisions by storage, in a buffer reused by every try (valid until the next call).
  const std::vector<Decision>& by_storage(const std::vector<Decision>& decisions) const;
  mutable std::vector<Decision> by_storage_;
};

}  // namespace ration::memory
