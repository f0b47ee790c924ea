// joint_plan.cpp — the joint keep/recompute/offload plan vs keep/recompute alone at the same budgets
// (BENCHMARKS.md, "Joint keep/recompute/offload plan vs keep/recompute": where offload can hide, the joint
// plan should beat keep/recompute alone on step time at the same budget). For each budget both plans are made from the same profile, and
// steps alternate joint / recompute-only / unconstrained so drift hits all alike. Offload copies run on
// their own threads, so wall time is the figure of merit (CPU time is printed too). Per budget it also
// reports the offload engine's deadline waits (planned copy-outs not done by their deadline), the time
// backward waited for copy-ins, the copy-in pool the plan holds and its misses over the timed steps.
//
// usage: bench_joint_plan [--steps N] [--dir SPILL_DIR] [--tier disk|host|host+disk] [--out FILE.json]
//                         [CONFIG.toml] [--set k=v ...]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/plan/planner.h"
#include "ration/runtime/budget.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

using namespace ration;

namespace {
using bench::median;

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int steps = 7;
  std::string out = "bench/results/joint_plan.json", config = "configs/gpt.toml", dir, tier = "disk";
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--tier" && i + 1 < argc) tier = argv[++i];
    else if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else config = a;
  }
  try {
    bench::ModelBench mb = bench::load_model_bench(config, overrides);
    models::Model& model = mb.model();
    const data::Batch& batch = mb.batch;
    // Three memory runtimes on one model: keep/recompute plans, joint plans with the tier, and plain.
    train::StepRuntime recompute, plain;
    train::MemorySettings with_tier;
    with_tier.offload.enabled = true;
    with_tier.offload.options.tier = tier;
    with_tier.offload.options.dir = dir;
    train::StepRuntime joint(with_tier);
    const memory::StepProfile& profile = recompute.profile(model, batch, 100);
    joint.set_profile(profile);
    const memory::OffloadCosts costs = joint.offload_costs();
    const std::string tier_name = joint.engine()->tier().name();
    std::printf("tier %s: write %.0f MB/s, read %.0f MB/s, per copy %.3f ms (measured now)\n", tier_name.c_str(),
                costs.write_bytes_per_ms / 1e3, costs.read_bytes_per_ms / 1e3, costs.per_copy_ms);

    memory::PlanOptions loose;
    loose.budget_bytes = int64_t{1} << 40;
    const memory::Plan full = memory::make_plan(profile, loose);
    const int64_t hi = full.unconstrained_peak_bytes, lo = full.minimum_peak_bytes;

    std::printf("\n%-11s | %-34s | %-34s | %9s | %s\n", "", "keep/recompute (knapsack)", "joint keep/recompute/offload",
                "plain", "");
    std::printf("%-11s | %9s %9s %6s %7s | %9s %9s %6s %7s | %9s | %-18s | %s\n", "budget", "measured", "wall ms", "recomp",
                "cpu ms", "measured", "wall ms", "offl", "cpu ms", "wall ms", "joint vs recompute",
                "deadline waits, fetch wait ms/step, pool, re-plans for late copies");
    nlohmann::json rows = nlohmann::json::array();
    int wins = 0, points = 0;
    for (double f : {0.75, 0.5, 0.35, 0.2, 0.1}) {
      const int64_t budget = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
      memory::PlanOptions po;
      po.budget_bytes = budget;
      memory::PlanOptions pj = po;
      pj.offload = costs;
      memory::Plan rplan;
      try {
        rplan = memory::make_plan(profile, po);
        joint.plan(pj);  // the runtime plans: it re-plans when copies miss their deadlines
      } catch (const Error& e) {
        std::printf("%-11s | does not fit: %s\n", memory::format_bytes(budget).c_str(), e.what());
        continue;
      }
      recompute.use_plan(rplan);
      std::vector<double> rw, rc, jw, jc, pw;
      int64_t rpeak = 0, jpeak = 0;
      bool equal = true;
      memory::OffloadStats timed_from;  // the joint engine's counters after the warm-up step
      int replans_timed = 0;            // re-plans after a timed step (late copies there)
      for (int s = 0; s <= steps; ++s) {
        // Same dropout masks every step: gradients comparable bitwise. They are held only in the warm-up
        // step, so they do not count in timed peaks.
        train::StepOptions o = train::StepOptions::collecting(100);
        if (s > 0) o.gradients = train::GradientsAfter::Cleared;
        const train::StepStats a = joint.measure_step(model, batch, o);
        const train::StepStats b = recompute.measure_step(model, batch, o);
        const train::StepStats c = plain.measure_step(model, batch, o);
        if (s == 0) {  // warm-up; a re-plan for late copies happens here (the runtime's first step)
          equal = bench::same_gradients(a, c) && bench::same_gradients(b, c);
          timed_from = a.offload;
          replans_timed = -joint.copy_replans();
          continue;
        }
        jw.push_back(a.ms);
        jc.push_back(a.cpu_ms);
        rw.push_back(b.ms);
        rc.push_back(b.cpu_ms);
        pw.push_back(c.ms);
        jpeak = std::max(jpeak, a.peak_bytes);
        rpeak = std::max(rpeak, b.peak_bytes);
      }
      replans_timed += joint.copy_replans();
      // The plan the timed steps ran (the last one, when late copies made the runtime re-plan).
      const memory::Plan jplan = *joint.current_plan();
      RATION_CHECK(equal, "gradients under a plan differ from the plain step at budget ", memory::format_bytes(budget));
      const memory::OffloadStats timed_to = joint.engine()->stats();
      const int64_t deadline_waits = timed_to.deadline_waits - timed_from.deadline_waits;
      const int64_t pool_misses = timed_to.pool_misses - timed_from.pool_misses;
      const int64_t by_waiter = timed_to.copies_by_waiter - timed_from.copies_by_waiter;
      const double fetch_wait_ms = (timed_to.fetch_wait_ms - timed_from.fetch_wait_ms) / std::max(steps, 1);
      const double forward_pause_ms = (timed_to.forward_pause_ms - timed_from.forward_pause_ms) / std::max(steps, 1);
      const double gain = 1.0 - median(jw) / median(rw);
      ++points;
      wins += gain > 0 ? 1 : 0;
      std::printf("%-11s | %9s %9.1f %6lld %7.1f | %9s %9.1f %6lld %7.1f | %9.1f | %+17.1f%% | %lld, %.1f, %s, %d%s\n",
                  memory::format_bytes(budget).c_str(), memory::format_bytes(rpeak).c_str(), median(rw),
                  static_cast<long long>(rplan.prediction.recomputed_nodes), median(rc), memory::format_bytes(jpeak).c_str(),
                  median(jw), static_cast<long long>(jplan.offloaded_groups), median(jc), median(pw), 100 * gain,
                  static_cast<long long>(deadline_waits), fetch_wait_ms,
                  memory::format_bytes(jplan.prediction.copy_in_pool_bytes).c_str(), joint.copy_replans(),
                  rpeak <= budget && jpeak <= budget ? "" : " OVER BUDGET");
      rows.push_back({{"budget_bytes", budget},
                      {"recompute", {{"measured_peak_bytes", rpeak}, {"predicted_peak_bytes", rplan.prediction.peak_bytes},
                                     {"step_ms_median", median(rw)}, {"step_cpu_ms_median", median(rc)},
                                     {"recomputed_nodes", rplan.prediction.recomputed_nodes},
                                     {"predicted_recompute_ms", rplan.prediction.recompute_ms}}},
                      {"joint", {{"measured_peak_bytes", jpeak}, {"predicted_peak_bytes", jplan.prediction.peak_bytes},
                                 {"step_ms_median", median(jw)}, {"step_cpu_ms_median", median(jc)},
                                 {"offloaded_groups", jplan.offloaded_groups}, {"offloaded_bytes", jplan.offloaded_bytes},
                                 {"recomputed_nodes", jplan.prediction.recomputed_nodes},
                                 {"predicted_recompute_ms", jplan.prediction.recompute_ms},
                                 {"predicted_offload_stall_ms", jplan.prediction.offload_stall_ms},
                                 {"deadline_waits", deadline_waits},
                                 {"copy_replans", joint.copy_replans()},
                                 {"copy_replans_after_timed_steps", replans_timed},
                                 {"planned_write_bytes_per_ms", jplan.offload_costs ? jplan.offload_costs->write_bytes_per_ms : 0.0},
                                 {"forward_pause_ms_per_step", forward_pause_ms},
                                 {"fetch_wait_ms_per_step", fetch_wait_ms},
                                 {"copy_in_pool_bytes", jplan.prediction.copy_in_pool_bytes},
                                 {"copy_in_pool_misses", pool_misses},
                                 {"copies_by_waiting_thread", by_waiter}}},
                      {"plain_step_ms_median", median(pw)},
                      {"joint_faster_by", gain},
                      {"gradients_bitwise_equal", equal}});
    }
    std::printf("\njoint plan faster than keep/recompute at %d of %d budgets; gradients bitwise equal to the plain "
                "step at every budget\n", wins, points);
    nlohmann::json j = {{"config", config},
                        {"tier", tier_name},
                        {"tier_costs", {{"write_bytes_per_ms", costs.write_bytes_per_ms},
                                        {"read_bytes_per_ms", costs.read_bytes_per_ms},
                                        {"per_copy_ms", costs.per_copy_ms}}},
                        {"steps", steps},
                        {"unconstrained_peak_bytes", hi},
                        {"minimum_peak_bytes", lo},
                        {"points", rows},
                        {"joint_wins", wins}};
    bench::write_json(out, j);
    std::printf("wrote %s\n", out.c_str());
  } catch (const Error& e) {
    return bench::report_error(e);
  }
  return 0;
}
