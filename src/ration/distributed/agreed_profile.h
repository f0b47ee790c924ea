// agreed_profile.h — one step profile for every rank of a process group whose ranks must follow the same
// memory plan (a tensor-parallel group: a dropped row-parallel output is recomputed by re-running its
// all-reduce in backward, and a replicated value offloaded by one rank is all-gathered by all, so every
// rank must drop and offload the same values; docs/DISTRIBUTED.md, "Tensor parallelism").
// Owns: replacing the measured figures of a profile (times, bytes) by the group's rank 0's, so that the
//       deterministic planner makes the same plan on every rank. Does not own: profiling or planning.
#pragma once
#include "ration/distributed/world.h"
#include "ration/plan/profile.h"

namespace ration::dist {

// Every rank of `group` profiled the same step (the same graph: equal node and storage counts, else an
// error); afterwards each holds rank 0's measured times and byte figures. A collective.
void agree_profile(memory::StepProfile& profile, const World& group);

}  // namespace ration::dist
