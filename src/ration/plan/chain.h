// plan/chain.h — plans for chain-shaped models: the binomial (Revolve, Griewank) checkpoint schedule,
// which keeps some states in forward and re-runs the rest in backward sweeps, storing each dropped state
// only during the sweep that needs it (recompute without storing before that). See docs/METHODS.md,
// "Keep / recompute / offload planning".
// Owns: the binomial schedule, the chain candidates (one per slot count, simulated), the chain test and
//       the Revolve yardstick. Does not own: choosing between candidates and greedy plans
//       (plan/strategies.cpp), the simulator (plan/simulator.h).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "ration/plan/planner.h"
#include "ration/plan/profile.h"

namespace ration::memory {

// One candidate plan for a chain: the binomial schedule with a given number of slots.
struct ChainCandidate {
  int64_t slots = 0;
  std::vector<Decision> decisions;        // per plan group: Keep or Recompute
  std::map<int64_t, int64_t> store_from;  // Plan::store_from
  Prediction prediction;
};

// Every binomial schedule (slots = m .. 1) for a chain profile, simulated; `groups` in forward order.
std::vector<ChainCandidate> chain_candidates(const StepProfile& profile, const std::vector<Group>& groups,
                                             int64_t extra);

// The candidate that fits `budget` with the fewest re-run nodes (null if none fits).
const ChainCandidate* best_chain_fit(const std::vector<ChainCandidate>& cs, int64_t budget);

}  // namespace ration::memory
