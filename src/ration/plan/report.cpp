// plan/report.cpp — a plan as JSON and as a table (the JSON is part of `ration plan --json` and of the
// training report). Owns: the output format of a plan. Does not own: the plan (planner.h).
#include "ration/plan/report.h"

#include <array>
#include <limits>
#include <cstdio>
#include <map>
#include <sstream>

#include "ration/base/allocator.h"

namespace ration::memory {

nlohmann::json to_json(const Plan& plan) {
  const auto& groups = plan.groups;
  nlohmann::json sets = nlohmann::json::object();
  for (const auto& g : groups) {
    auto& s = sets[g.node_set];
    if (s.is_null()) s = {{"kept_groups", 0}, {"kept_bytes", 0}, {"dropped_groups", 0}, {"dropped_bytes", 0}};
    const char* count = g.kept() ? "kept_groups" : "dropped_groups";
    const char* bytes = g.kept() ? "kept_bytes" : "dropped_bytes";
    s[count] = s[count].get<int64_t>() + 1;
    s[bytes] = s[bytes].get<int64_t>() + g.bytes;
  }
  nlohmann::json gs = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json j = {{"storage", g.storage}, {"bytes", g.bytes}, {"producer", g.producer}, {"op", g.op},
                        {"node_set", g.node_set}, {"recompute_ms", g.recompute_ms},
                        {"decision", to_string(g.decision)}};
    if (g.decision == Decision::Offload) {
      j["copy_deadline"] = g.deadline;
      j["prefetch"] = g.prefetch;
    }
    gs.push_back(j);
  }
  nlohmann::json j = {{"strategy", to_string(plan.strategy)},
          {"budget_bytes", plan.budget_bytes},
          {"fixed_bytes", plan.fixed_bytes},
          {"activation_capacity_bytes", plan.capacity_bytes},
          {"unconstrained_peak_bytes", plan.unconstrained_peak_bytes},
          {"minimum_peak_bytes", plan.minimum_peak_bytes},
          {"initial_kept_groups", plan.initial_kept_groups},
          {"initial_kept_bytes", plan.initial_kept_bytes},
          {"kept_groups", plan.kept_groups},
          {"kept_bytes", plan.kept_bytes},
          {"dropped_groups", plan.dropped_groups},
          {"dropped_bytes", plan.dropped_bytes},
          {"predicted_peak_bytes", plan.prediction.peak_bytes},
          {"predicted_peak_at", plan.prediction.peak_at},
          {"predicted_recompute_ms", plan.prediction.recompute_ms},
          {"predicted_recomputed_nodes", plan.prediction.recomputed_nodes},
          {"transient_producers", plan.store_from.size()},
          {"chain_slots", plan.chain_slots},
          {"node_sets", sets},
          {"groups", gs}};
  if (plan.offload_costs) {
    j["offloaded_groups"] = plan.offloaded_groups;
    j["offloaded_bytes"] = plan.offloaded_bytes;
    j["predicted_offload_stall_ms"] = plan.prediction.offload_stall_ms;
    j["offload_costs"] = {{"write_bytes_per_ms", plan.offload_costs->write_bytes_per_ms},
                          {"read_bytes_per_ms", plan.offload_costs->read_bytes_per_ms},
                          {"per_copy_ms", plan.offload_costs->per_copy_ms},
                          {"min_bytes", plan.offload_costs->min_bytes},
                          {"capacity_bytes", plan.offload_costs->capacity_bytes == std::numeric_limits<int64_t>::max()
                                                 ? nlohmann::json(nullptr)
                                                 : nlohmann::json(plan.offload_costs->capacity_bytes)}};
  }
  j["plan_ms"] = plan.plan_ms;
  return j;
}

std::string Plan::to_table() const {
  std::ostringstream os;
  char line[320];
  std::snprintf(line, sizeof line, "plan (%s): budget %s = fixed occupancy %s + activation capacity %s\n",
                to_string(strategy), format_bytes(budget_bytes).c_str(), format_bytes(fixed_bytes).c_str(),
                format_bytes(capacity_bytes).c_str());
  os << line;
  std::snprintf(line, sizeof line, "  keep %lld of %lld groups (%s of %s); initial figure %lld groups / %s (the most --keep-groups / --keep-bytes may ask)\n",
                static_cast<long long>(kept_groups), static_cast<long long>(groups.size()),
                format_bytes(kept_bytes).c_str(), format_bytes(kept_bytes + dropped_bytes).c_str(),
                static_cast<long long>(initial_kept_groups), format_bytes(initial_kept_bytes).c_str());
  os << line;
  std::snprintf(line, sizeof line,
                "  predicted peak %s at %s (unconstrained %s, feasible minimum %s); predicted recompute %.2f ms "
                "(%lld node re-runs)\n",
                format_bytes(prediction.peak_bytes).c_str(), prediction.peak_at.c_str(),
                format_bytes(unconstrained_peak_bytes).c_str(), format_bytes(minimum_peak_bytes).c_str(),
                prediction.recompute_ms, static_cast<long long>(prediction.recomputed_nodes));
  os << line;
  if (offload_costs) {
    std::snprintf(line, sizeof line,
                  "  offload %lld groups (%s) of the dropped; predicted copy stall %.2f ms (tier: write %.0f MB/s, "
                  "read %.0f MB/s)\n",
                  static_cast<long long>(offloaded_groups), format_bytes(offloaded_bytes).c_str(),
                  prediction.offload_stall_ms, offload_costs->write_bytes_per_ms / 1e3,
                  offload_costs->read_bytes_per_ms / 1e3);
    os << line;
  }
  if (!store_from.empty() && dropped_groups > 0) {
    std::snprintf(line, sizeof line, "  %zu producers re-run without storing until their planned backward step\n",
                  store_from.size());
    os << line;
  }
  std::map<std::string, std::array<int64_t, 4>> sets;
  std::vector<std::string> order;
  for (const auto& g : groups) {
    if (!sets.count(g.node_set)) order.push_back(g.node_set);
    auto& s = sets[g.node_set];
    s[g.kept() ? 0 : 2] += 1;
    s[g.kept() ? 1 : 3] += g.bytes;
  }
  std::snprintf(line, sizeof line, "  %-24s %8s %12s %8s %12s\n", "node set", "kept", "kept bytes", "dropped", "dropped bytes");
  os << line;
  for (const auto& name : order) {
    const auto& s = sets[name];
    std::snprintf(line, sizeof line, "  %-24s %8lld %12s %8lld %12s\n", name.c_str(), static_cast<long long>(s[0]),
                  format_bytes(s[1]).c_str(), static_cast<long long>(s[2]), format_bytes(s[3]).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace ration::memory
