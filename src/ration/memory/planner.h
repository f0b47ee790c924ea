// planner.h — the budget planner (seed method M0): from a measured StepProfile and a device-memory
// budget, decide keep or recompute for every saved group so that the predicted peak at every point of
// forward and backward (recompute transients included) fits the budget.
// Owns: the memory simulator (which mirrors the executor's rules exactly: what is resident, what a
//       recompute rebuilds and stores, what it frees), the strategies, user overrides, and the plan as
//       data (printable, JSON). Does not own: executing the plan (budget_policy.h).
//
// Terms: a group is one saved storage (views share their base's storage), owned by the node that
// allocated it; a node set is the module a group's producer belongs to ("blocks.3", "conv1").
// Capacity for saved activations = budget − fixed occupancy, where fixed occupancy is the measured peak
// of everything that is not a saved activation (parameters, gradients, optimiser state, data, workspace
// and backward transients).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ration/memory/profile.h"

namespace ration::memory {

// OptimalChain: the binomial (Revolve, Griewank) schedule for chain-shaped models: which values to keep
// in forward and, for the dropped ones, in which backward re-run sweep each is stored as a temporary
// checkpoint (earlier sweeps pass through it without storing). Errors for graphs that are not chains.
enum class Strategy { Knapsack, Ordered, OrderedSets, Uniform, Sqrt, OptimalChain };
Strategy parse_strategy(const std::string& name);  // throws listing the valid names
const char* to_string(Strategy s);

// Measured cost of the offload tier (seed M2) for the joint keep/recompute/offload plan.
struct OffloadCosts {
  double write_bytes_per_ms = 0;  // copy-out bandwidth (Q2)
  double read_bytes_per_ms = 0;   // copy-in bandwidth (Q4)
  double per_copy_ms = 0;         // fixed cost of one copy on the compute thread (queueing, views)
  int64_t min_bytes = 0;          // smaller groups are never offloaded
  int min_prefetch = 0;           // fetch back at least this many backward nodes ahead
  // What the tier can hold (measured free space, less a margin): the plan's offloaded bytes, each
  // rounded up to a file-system page, stay within it; a tier too small to measure has 0.
  int64_t capacity_bytes = std::numeric_limits<int64_t>::max();
};

// When each offloaded storage is copied out and fetched back (by storage id; -1 = not offloaded).
struct OffloadSchedule {
  std::vector<int64_t> deadline;  // forward ordinal by whose end the copy-out must be done
  std::vector<int> prefetch;      // fetch back when backward is this many ordinals above its first use
  double stall_ms = 0;            // predicted time compute waits for copies (forward + backward)
};

struct PlanOptions {
  int64_t budget_bytes = 0;                 // whole device budget
  Strategy strategy = Strategy::Knapsack;
  int64_t extra_fixed_bytes = 0;            // memory the profile did not see (e.g. optimiser state)
  int64_t checkpoint_every = 1;             // uniform: keep block boundaries of every k-th block
  std::optional<int64_t> keep_groups;       // user override: keep at most this many groups
  std::optional<int64_t> keep_bytes;        // user override: keep at most this many bytes
  std::optional<OffloadCosts> offload;      // set: offload is a third choice next to keep/recompute
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
};

struct Group {
  int64_t storage = -1;
  int64_t bytes = 0;
  int64_t producer = -1;           // ordinal of the node that allocated it
  std::string op, node_set;
  double recompute_ms = 0;         // producer chain cost if this group alone were dropped
  bool keep = true;
  bool offload = false;            // not kept: offloaded (true) or recomputed (false)
  int64_t deadline = -1;           // offloaded: forward ordinal by whose end the copy is done
  int prefetch = 0;                // offloaded: backward ordinals ahead of first use to fetch back
};

struct Plan {
  Strategy strategy = Strategy::Knapsack;
  int64_t budget_bytes = 0;
  int64_t fixed_bytes = 0;         // fixed occupancy
  int64_t capacity_bytes = 0;      // budget − fixed
  int64_t unconstrained_peak_bytes = 0;  // predicted with everything kept
  int64_t minimum_peak_bytes = 0;  // predicted with every group dropped (the feasible floor we know)
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

  // Keys (producer ordinal, output) of every saved value whose group is recomputed.
  std::set<ValueKey> dropped_keys(const StepProfile& profile) const;
  struct OffloadOrder {
    int64_t deadline = -1;
    int prefetch = 0;
  };
  // Keys of every saved value whose group is offloaded, with its copy deadline and prefetch distance.
  std::map<ValueKey, OffloadOrder> offloaded_keys(const StepProfile& profile) const;
  nlohmann::json to_json() const;
  std::string to_table() const;
};

// Decision per storage id for the simulator.
enum : char { kKeep = 0, kRecompute = 1, kOffload = 2 };
// Simulate one step with the given decisions (by storage id: kKeep / kRecompute / kOffload; offloaded
// storages follow `schedule`, which must then be given).
Prediction simulate(const StepProfile& profile, const std::vector<char>& decision, int64_t extra_fixed_bytes,
                    const OffloadSchedule* schedule = nullptr);
// Same, with transient re-runs (Plan::store_from).
Prediction simulate(const StepProfile& profile, const std::vector<char>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule = nullptr);
// The copy queues' timeline for the offloaded storages: FIFO copy-out after the saving node, deadline
// at the first node whose end the copy has reached; fetch-back early enough to land before first use.
OffloadSchedule schedule_offloads(const StepProfile& profile, const std::vector<char>& decision,
                                  const OffloadCosts& costs);

// Plan. Throws ration::Error when the budget is below the feasible minimum (stating it), when the
// strategy cannot meet the budget, or when an override asks to keep more than the initial figure.
Plan make_plan(const StepProfile& profile, const PlanOptions& options);

// Node set of a module scope: "blocks.3.attn.qkv" -> "blocks.3", "conv1" -> "conv1", "" -> "(top)".
std::string node_set_of(const std::string& scope);

// Revolve (Griewank) yardstick: the minimum number of forward re-evaluations needed to reverse a chain
// of n steps holding at most c checkpoints (each step's state is one checkpoint-sized value).
int64_t revolve_min_recomputes(int64_t n, int64_t c);

// A chain-shaped profile: every recorded node's non-constant inputs are outputs of the node recorded just
// before it. Returns an empty string for a chain, else why it is not one (names the offending node).
std::string why_not_chain(const StepProfile& profile);

}  // namespace ration::memory
