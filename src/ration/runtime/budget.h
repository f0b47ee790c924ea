// budget.h — the [memory] and [offload] config keys (and the CLI flags that set them), read and
// validated. train::StepRuntime (step_runtime.h)
// is built from these settings.
// Keys: memory.budget ("2GiB"; absent = unconstrained), memory.plan (knapsack | ordered | ordered-count | ordered-sets | optimal-chain |
//       uniform | sqrt), memory.checkpoint_every (uniform), memory.keep_groups,
//       memory.keep_bytes (user overrides that may only lower what is kept).
//       [offload]: offload.enabled (--offload), offload.tier (disk | host | host+disk),
//       offload.dir, offload.t1/t2/t3 (sizes), offload.min_bytes, offload.prefetch (nodes),
//       offload.host_limit, offload.disk_limit, offload.throttle (bytes per second; tests/benches).
//       Without a budget offload runs the threshold loop; with one, the planner decides
//       keep / recompute / offload per group from the measured tier bandwidth.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "ration/offload/engine.h"
#include "ration/plan/planner.h"
#include "ration/config/config.h"

namespace ration::train {

struct BudgetSettings {
  memory::PlanOptions plan;  // plan.budget_bytes: the budget (memory.budget), 0 when unconstrained
  bool has_budget() const { return plan.budget_bytes > 0; }
  int64_t budget_bytes() const { return plan.budget_bytes; }
};
BudgetSettings read_budget_settings(Config& cfg);

struct OffloadSettings {
  bool enabled = false;
  memory::OffloadOptions options;
};
OffloadSettings read_offload_settings(Config& cfg);

// The [memory] and [offload] settings together: what train::StepRuntime is built from.
struct MemorySettings {
  BudgetSettings budget;
  OffloadSettings offload;
};
MemorySettings read_memory_settings(Config& cfg);

}  // namespace ration::train
