// planner.h — the budget planner. What a newcomer needs:
// - A plan (Plan below) gives every saved group (one saved storage) a Decision: Keep, Recompute (freed
//   after forward, its producer re-run in backward) or Offload (copied out, fetched back before use),
//   with the Prediction (peak bytes at every node boundary) showing that it fits the budget.
// - make_plan (planner.cpp) runs: one measured StepProfile (profile.h) -> PlanGraph, the profile as flat
//   arrays read once (graph.h) -> PlanContext, the groups, budget, floor and predictions every strategy
//   shares (context.h) -> the strategy's decisions (strategies.cpp; chain.h for binomial chain schedules)
//   -> the user's overrides (--keep-groups / --keep-bytes, planner.cpp) -> the final prediction.
// - Predictions: simulator.h replays a whole step; incremental.h keeps a keep/recompute peak up to date as
//   single groups change (the descents' thousands of tries), giving the simulator's numbers to the byte;
//   offload_peak.h does the same with an offload tier (a try the model cannot price exactly is simulated).
// - Around it: report.h (JSON, table) and html.h print a plan; runtime/budget_policy.h executes it.
//
// From a measured StepProfile and a device-memory budget, decide for every saved group whether it is
// kept, recomputed or offloaded so that the predicted peak at every point of forward and backward
// (recompute transients and copies included) fits the budget. The method is described in
// docs/METHODS.md, "Keep / recompute / offload planning".
// Owns: the plan as data (groups, decisions, prediction), the strategy names, make_plan (strategy, user
//       overrides, final prediction), the public simulator entry points. Does not own: executing the plan
//       (budget_policy.h), the simulator's rules (plan/simulator.h), the strategies' bodies
//       (plan/strategies.cpp over plan/context.h), the chain schedule (plan/chain.h), printing a plan
//       (plan/report.h, plan/html.h).
//
// Terms: a group is one saved storage (views share their base's storage), owned by the node that
// allocated it; a node set is the module a group's producer belongs to ("blocks.3", "conv1").
// Capacity for saved activations = budget − fixed occupancy, where fixed occupancy is the measured peak
// of everything that is not a saved activation (parameters, gradients, optimiser state, data, workspace
// and backward transients).
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ration/plan/profile.h"

namespace ration::memory {

// The planner's strategies; their names come from one table (plan/strategies.cpp) used by the CLI, the
// config check and the JSON output. OptimalChain: the binomial (Revolve, Griewank) schedule for
// chain-shaped models: which values to keep in forward and, for the dropped ones, in which backward
// re-run sweep each is stored as a temporary checkpoint. Errors for graphs that are not chains.
enum class Strategy { Knapsack, Ordered, OrderedSets, Uniform, Sqrt, OptimalChain, OrderedCount };
Strategy parse_strategy(const std::string& name);  // throws listing the valid names
const char* to_string(Strategy s);
// Every strategy's name, in table order ("knapsack" first: the default).
const std::vector<std::string>& strategy_names();
// "knapsack, ordered, ... or optimal-chain" for help texts and error messages.
std::string strategy_name_list();

// What the plan does with one saved group.
enum class Decision : uint8_t {
  Keep,       // stays resident from its save until its last use in backward
  Recompute,  // freed after forward; its producer is re-run in backward before the first use
  Offload,    // copied to the offload tier after its save and fetched back before its first use
};
const char* to_string(Decision d);  // "keep", "recompute", "offload"

// Where the offload engine reads offloaded storages back into (docs/METHODS.md, "Threshold offload").
enum class CopyInMemory : uint8_t {
  Fresh,   // a buffer allocated at each copy-in, freed when backward releases the value
  Pooled,  // the engine's copy-in pool: a buffer is reused once backward releases its value; under a plan
           // the pool is kept from its first read to the end of the step (CopyInRetention::Step)
};

// Measured cost of the offload tier for the joint keep/recompute/offload plan: the bandwidths the
// offload engine achieves through its queues while compute runs beside them (measure_offload_costs).
struct OffloadCosts {
  double write_bytes_per_ms = 0;  // copy-out bandwidth (Q2)
  double read_bytes_per_ms = 0;   // copy-in bandwidth (Q4)
  double per_copy_ms = 0;         // fixed cost of one copy on the compute thread (queueing, views)
  int64_t min_bytes = 0;          // smaller groups are never offloaded
  int min_prefetch = 0;           // fetch back at least this many backward nodes ahead
  // What the tier can hold (measured free space, less a margin): the plan's offloaded bytes, each
  // rounded up to a file-system page, stay within it; a tier too small to measure has 0.
  int64_t capacity_bytes = std::numeric_limits<int64_t>::max();
  CopyInMemory copy_in = CopyInMemory::Fresh;  // Pooled: the prediction holds the engine's copy-in pool
  // Copy-out deadlines are set where each copy lands if every copy took this many times as long as
  // measured (the serial queue simulated at 1/margin of the bandwidth), so a copy slowed by compute or
  // other processes still meets its deadline; the storage is counted resident until then, so the
  // planner keeps or recomputes instead where that does not fit. 1: no margin.
  double deadline_margin = 2.0;
};

// When each offloaded storage is copied out and fetched back (by storage id; -1 = not offloaded).
struct OffloadSchedule {
  std::vector<int64_t> deadline;  // forward ordinal by whose end the copy-out must be done
  std::vector<int> prefetch;      // fetch back when backward is this many ordinals above its first use
  double stall_ms = 0;            // predicted time compute waits for copies (forward + backward)
  CopyInMemory copy_in = CopyInMemory::Fresh;  // OffloadCosts::copy_in
};

struct PlanOptions {
  int64_t budget_bytes = 0;                 // whole device budget
  Strategy strategy = Strategy::Knapsack;
  int64_t extra_fixed_bytes = 0;            // memory the profile did not see (e.g. optimiser state)
  int64_t checkpoint_every = 1;             // uniform: keep block boundaries of every k-th block
  std::optional<int64_t> keep_groups;       // user override: keep at most this many groups
  std::optional<int64_t> keep_bytes;        // user override: keep at most this many bytes
  std::optional<OffloadCosts> offload;      // set: offload is a third choice next to keep/recompute
  // Compute the feasible minimum for the report even when the strategy meets the budget (it is always
  // computed to explain a budget that cannot be met). A re-plan that does not print it may skip it.
  bool report_minimum = true;
  // Knapsack: try exchanges after the descent (keep/recompute plans of at most 256 groups; docs/METHODS.md,
  // "The exact yardstick"). Off: the descent's plan, as before exchanges (the yardstick's comparison).
  bool exchanges = true;
  // Knapsack with offload: a descent prices its tries by the offload-aware incremental peak
  // (plan/offload_peak.h; copy-ins into fresh buffers or the pool). Off: a whole-step simulation per try, as before
  // it; the same plans either way (tests/test_plan_offload_peak.cpp compares them, bench_plan_scaling times
  // both).
  bool offload_peak = true;
  // The floor's descents restart where they stall at their own re-runs (PlanContext's memory orders; a
  // ResNet's stem). Off: the two memory orders alone, as before restarts (the tests' and the yardstick's
  // comparison).
  bool floor_restarts = true;
};

struct Prediction {
  int64_t peak_bytes = 0;
  std::string peak_at;             // "forward <op>#k" or "backward <op>#k"
  double recompute_ms = 0;         // predicted: sum of re-run producers' measured forward times
  int64_t recomputed_nodes = 0;
  double offload_stall_ms = 0;     // predicted: compute waiting for offload copies
  int64_t offloaded_bytes = 0;
  std::vector<int64_t> forward_peaks;   // predicted peak during each forward node (by ordinal)
  std::vector<int64_t> backward_peaks;  // predicted peak during each backward node (execution order)
  // CopyInMemory::Pooled: the copy-in pool the engine makes in backward, buffer bytes -> count (the
  // most offloaded storages of that size resident at once). A buffer is counted in the backward peaks
  // from the read that made it to the end of the step; fetched storages live inside it.
  std::map<int64_t, int64_t> copy_in_pool;
  int64_t copy_in_pool_bytes = 0;
};

struct Group {
  int64_t storage = -1;
  int64_t bytes = 0;
  int64_t producer = -1;           // ordinal of the node that allocated it
  std::string op, node_set;
  double recompute_ms = 0;         // producer chain cost if this group alone were dropped
  Decision decision = Decision::Keep;
  int64_t deadline = -1;           // offloaded: forward ordinal by whose end the copy is done
  int prefetch = 0;                // offloaded: backward ordinals ahead of first use to fetch back
  bool kept() const { return decision == Decision::Keep; }
};

struct Plan {
  Strategy strategy = Strategy::Knapsack;
  int64_t budget_bytes = 0;
  int64_t fixed_bytes = 0;         // fixed occupancy
  int64_t capacity_bytes = 0;      // budget − fixed
  int64_t unconstrained_peak_bytes = 0;  // predicted with everything kept
  // The lowest peak the planner can reach for this profile (PlanOptions::report_minimum; 0 = not computed).
  int64_t minimum_peak_bytes = 0;
  int64_t initial_kept_groups = 0, initial_kept_bytes = 0;  // before user overrides
  int64_t kept_groups = 0, kept_bytes = 0, dropped_groups = 0, dropped_bytes = 0;
  int64_t offloaded_groups = 0, offloaded_bytes = 0;  // counted among the dropped
  std::optional<OffloadCosts> offload_costs;
  std::vector<Group> groups;       // in forward order
  // Transient re-runs: producer ordinal -> index (in backward order) of the first backward node during
  // which a re-run of it, made to feed another re-run, stores its dropped outputs; before that step
  // such re-runs keep nothing (recompute without storing). Producers absent here always store (the
  // default). A re-run for a value backward reads right now always stores it.
  std::map<int64_t, int64_t> store_from;
  int64_t chain_slots = 0;         // a binomial chain schedule's slots (activation states resident at once)
  Prediction prediction;
  bool fits = false;
  double plan_ms = 0;              // wall time make_plan took (profiling excluded)

  // Keys (producer ordinal, output) of every saved value whose group is recomputed.
  std::set<ValueKey> dropped_keys(const StepProfile& profile) const;
  struct OffloadOrder {
    int64_t deadline = -1;
    int prefetch = 0;
  };
  // Keys of every saved value whose group is offloaded, with its copy deadline and prefetch distance.
  std::map<ValueKey, OffloadOrder> offloaded_keys(const StepProfile& profile) const;
  std::string to_table() const;    // plan/report.cpp; the JSON form is memory::to_json (plan/report.h)
};

// Simulate one step with the given decisions (by storage id; offloaded storages follow `schedule`,
// which must then be given). `store_from`: transient re-runs (Plan::store_from).
Prediction simulate(const StepProfile& profile, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const OffloadSchedule* schedule = nullptr);
Prediction simulate(const StepProfile& profile, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule = nullptr);
// The copy queues' timeline for the offloaded storages: FIFO copy-out after the saving node, deadline
// at the first node whose end the copy has reached; fetch-back early enough to land before first use.
OffloadSchedule schedule_offloads(const StepProfile& profile, const std::vector<Decision>& decision,
                                  const OffloadCosts& costs);
// Slack for the copy-outs: schedule_offloads puts each deadline at the node where its copy is predicted
// to land, so a copy slower than predicted (compute beside it, other processes) makes forward wait.
// Moves each deadline later while every forward node it passes stays at or below `bound` with the
// storage still held (`forward_peaks`: the prediction with `sch`); with bound = the plan's predicted
// peak, the peak, and so the measured one, is unchanged. docs/METHODS.md, "Joint keep/recompute/offload plan".
void relax_deadlines(const StepProfile& profile, const std::vector<Decision>& decision,
                     const std::vector<int64_t>& forward_peaks, int64_t bound, OffloadSchedule& sch);

// The first difference between two plans, named ("group 12 decision: offload / recompute"), in every
// field but the time planning took (plan_ms); empty where they are the same plan.
std::string plan_difference(const Plan& a, const Plan& b);

// Plan. Throws ration::Error when the budget is below the feasible minimum (stating it), when the
// strategy cannot meet the budget, or when an override asks to keep more than the initial figure.
Plan make_plan(const StepProfile& profile, const PlanOptions& options);

// The same decisions with `bytes` less fixed memory (PlanOptions::extra_fixed_bytes): fixed memory is a
// constant under the whole step, so every predicted figure (peak, per-node peaks, floor, unconstrained
// peak) moves down by exactly `bytes`. A pipeline stage settles its plan with it: planned for a bound on
// what its other micro-batches in flight hold, predicted with what they hold under the plan.
void lower_fixed_bytes(Plan& plan, int64_t bytes);

// Node set of a module scope: "blocks.3.attn.qkv" -> "blocks.3", "conv1" -> "conv1", "" -> "(top)".
std::string node_set_of(const std::string& scope);

// Revolve (Griewank) yardstick: the minimum number of forward re-evaluations needed to reverse a chain
// of n steps holding at most c checkpoints (each step's state is one checkpoint-sized value).
int64_t revolve_min_recomputes(int64_t n, int64_t c);

// A chain-shaped profile: every recorded node's non-constant inputs are outputs of the node recorded just
// before it. Returns an empty string for a chain, else why it is not one (names the offending node).
std::string why_not_chain(const StepProfile& profile);

}  // namespace ration::memory
