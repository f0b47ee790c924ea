#include "ration/runtime/budget.h"

#include <algorithm>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::train {

BudgetSettings read_budget_settings(Config& cfg) {
  BudgetSettings s;
  if (cfg.has("memory.budget")) {
    s.plan.budget_bytes = cfg.get_bytes("memory.budget", 0);
    RATION_CHECK(s.plan.budget_bytes > 0, cfg.origin(), ": memory.budget must be a positive size such as 2GiB");
  }
  s.plan.strategy = memory::parse_strategy(
      cfg.get_choice("memory.plan", memory::strategy_names().front(), memory::strategy_names()));
  s.plan.checkpoint_every = cfg.get_int("memory.checkpoint_every", 1);
  RATION_CHECK(s.plan.checkpoint_every >= 1, cfg.origin(), ": memory.checkpoint_every must be >= 1");
  if (cfg.has("memory.keep_groups")) {
    s.plan.keep_groups = cfg.get_int("memory.keep_groups", 0);
    RATION_CHECK(*s.plan.keep_groups >= 0, cfg.origin(), ": memory.keep_groups must be >= 0");
  }
  if (cfg.has("memory.keep_bytes")) s.plan.keep_bytes = cfg.get_bytes("memory.keep_bytes", 0);
  RATION_CHECK(s.has_budget() || (!s.plan.keep_groups && !s.plan.keep_bytes), cfg.origin(),
               ": memory.keep_groups / memory.keep_bytes (--keep-groups / --keep-bytes) need a memory budget "
               "(--memory-budget SIZE)");
  return s;
}

OffloadSettings read_offload_settings(Config& cfg) {
  OffloadSettings s;
  const std::vector<std::string> keys = {"tier", "dir", "t1", "t2", "t3", "min_bytes", "prefetch", "host_limit",
                                         "disk_limit", "throttle"};
  bool any = false;
  for (const auto& k : keys) any = any || cfg.has("offload." + k);
  s.enabled = cfg.get_bool("offload.enabled", any);
  memory::OffloadOptions& o = s.options;
  o.tier = cfg.get_choice("offload.tier", o.tier, {"disk", "host", "host+disk"});
  o.dir = cfg.get_string("offload.dir", o.dir);
  o.t1 = cfg.get_bytes("offload.t1", o.t1);
  if (cfg.has("offload.t2")) o.t2 = cfg.get_bytes("offload.t2", 0);
  if (cfg.has("offload.t3")) o.t3 = cfg.get_bytes("offload.t3", 0);
  o.min_bytes = cfg.get_bytes("offload.min_bytes", o.min_bytes);
  o.prefetch = static_cast<int>(cfg.get_int("offload.prefetch", o.prefetch));
  o.host_limit_bytes = cfg.get_bytes("offload.host_limit", 0);
  o.disk_limit_bytes = cfg.get_bytes("offload.disk_limit", 0);
  o.throttle_bytes_per_second = static_cast<double>(cfg.get_bytes("offload.throttle", 0));
  try {
    memory::validate(o);
  } catch (const Error& e) {
    RATION_CHECK(false, cfg.origin(), ": ", e.message());
  }
  return s;
}

MemorySettings read_memory_settings(Config& cfg) {
  MemorySettings s{read_budget_settings(cfg), read_offload_settings(cfg)};
  const memory::OffloadOptions& o = s.offload.options;
  RATION_CHECK(!s.budget.has_budget() || !s.offload.enabled || (o.t1 == 0 && o.t2 == memory::kNoLimit && o.t3 == memory::kNoLimit),
               cfg.origin(), ": offload.t1/t2/t3 (--offload-t1/t2/t3) apply to threshold offload, without "
               "memory.budget; with a budget the plan sets when each copy goes out and comes back (remove the "
               "thresholds or the budget)");
  return s;
}

}  // namespace ration::train
