// plan_yardstick.cpp — how far the knapsack's plan is from the best keep/recompute plan: per model and budget,
// the knapsack's predicted recompute time over the exact program's (plan/milp.h, solved by CBC), the
// solver's time, and whether the program's own peak equals the simulator's for its answer.
// Models: gpt at 2 and 4 layers, cnn, lstm_lm and mlp from configs/ (their batch); budgets at five points
// between the feasible floor and the unconstrained peak (on a chain, mlp: between the lowest peak of any
// keep/recompute decision and the unconstrained peak; below it Revolve is the yardstick,
// bench_chain_yardstick). Nothing is executed: both sides are predictions of
// the same simulator (tests/test_plan_milp.cpp executes the program's plans).
//
// usage: bench_plan_yardstick [--time-limit S] [--out FILE.json] [--models gpt2,gpt4,cnn,lstm_lm,mlp] [--groups]
//                             [--config FILE.toml [--set key=value ...]]   (that model instead, named "config")
//                             [--program-floor]   (also the program's own floor, by bisection, beside the planner's)
//                             [--profiles N]      (each model profiled N times: the node times, so the instance,
//                                                  differ from profile to profile; the worst ratio over all)
//                             [--fractions 0.8,0.6,...]  (the budgets, as fractions of the way from the floor up)
//                             [--save-times PREFIX]  (each profile's node times to PREFIX.<model>.<k>.json)
//                             [--times FILE]      (the node times from such a file instead of the profile's:
//                                                  one instance again, for a planner change judged on it)
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/base/allocator.h"
#include "ration/plan/context.h"
#include "ration/plan/graph.h"
#include "ration/plan/milp.h"
#include "ration/plan/planner.h"

using namespace ration;

namespace {

struct ModelCase {
  std::string name, config;
  std::vector<std::string> overrides;
};

const std::vector<ModelCase>& model_cases() {
  static const std::vector<ModelCase> c = {
      {"gpt2", "configs/gpt.toml", {"model.n_layer=2"}},
      {"gpt4", "configs/gpt.toml", {}},
      {"cnn", "configs/cnn.toml", {}},
      {"lstm_lm", "configs/lstm_lm.toml", {"data.seq_len=16"}},
      {"mlp", "configs/mlp.toml", {"train.batch_size=1024"}},
  };
  return c;
}

// Both sides priced with the same per-node times: each node's measured forward time replaced by the median
// over the nodes doing the same work (what the knapsack's costs read, memory::typical_forward_ms), so the
// ratio compares plans, not one noisy measurement that an optimum would exploit.
memory::StepProfile with_typical_times(const memory::StepProfile& measured) {
  memory::StepProfile p = measured;
  const std::vector<double> ms = memory::typical_forward_ms(memory::PlanGraph(measured));
  for (size_t k = 0; k < p.nodes.size(); ++k) p.nodes[k].forward_ms = ms[k];
  return p;
}

// The lowest budget the program meets, between `lo` (the planner's floor) and `hi`, by bisection: on a chain
// the planner's floor is a binomial schedule's, which recomputes without storing (Plan::store_from) and goes
// below what any keep/recompute decision reaches; the program covers keep/recompute decisions only.
int64_t program_floor(const memory::StepProfile& profile, int64_t lo, int64_t hi) {
  for (int k = 0; k < 20 && lo < hi; ++k) {
    memory::PlanOptions o;
    o.budget_bytes = lo + (hi - lo) / 2;
    if (memory::solve_exact_plan(profile, o).status == memory::ExactPlan::Status::NoSolution) lo = o.budget_bytes + 1;
    else hi = o.budget_bytes;
  }
  return hi;
}

const char* status_name(memory::ExactPlan::Status s) {
  switch (s) {
    case memory::ExactPlan::Status::Optimal: return "optimal";
    case memory::ExactPlan::Status::TimeLimit: return "time-limit";
    case memory::ExactPlan::Status::NoSolution: return "none";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  double time_limit = 120;
  std::string out = "bench/results/plan_yardstick.json", only;
  bool list_groups = false, program_floor_everywhere = false;
  int profiles = 1;
  std::string save_times, load_times;
  std::vector<double> fractions = {0.8, 0.6, 0.4, 0.2, 0.05};  // of the way from the floor up
  std::vector<ModelCase> cases = model_cases();
  ModelCase custom{"config", "", {}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--groups") {
      list_groups = true;
      continue;
    }
    if (a == "--program-floor") {
      program_floor_everywhere = true;
      continue;
    }
    if (i + 1 >= argc) break;
    if (a == "--time-limit") time_limit = std::stod(argv[i + 1]);
    else if (a == "--out") out = argv[i + 1];
    else if (a == "--models") only = "," + std::string(argv[i + 1]) + ",";
    else if (a == "--config") custom.config = argv[i + 1];
    else if (a == "--set") custom.overrides.push_back(argv[i + 1]);
    else if (a == "--save-times") save_times = argv[i + 1];
    else if (a == "--times") load_times = argv[i + 1];
    else if (a == "--profiles") profiles = std::max(1, std::stoi(argv[i + 1]));
    else if (a == "--fractions") {
      fractions.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string f; std::getline(list, f, ',');) fractions.push_back(std::stod(f));
    }
    ++i;
  }
  std::printf("%-8s %6s %10s %5s %8s %11s %11s %8s %9s %9s %9s %-10s %10s %5s %8s %7s %7s %4s\n", "model", "groups",
              "budget", "at", "before", "knap ms", "exact ms", "ratio", "bound ms", "plan", "plan bef.", "status", "peak",
              "=sim", "solve s", "cols", "rows", "cuts");
  nlohmann::json rows = nlohmann::json::array(), floors = nlohmann::json::array();
  double worst = 0;
  if (custom.config.empty() && !custom.overrides.empty()) {
    std::fprintf(stderr, "bench_plan_yardstick: --set applies to --config FILE.toml only\n");
    return 2;
  }
  if (!custom.config.empty()) cases = {custom};
  nlohmann::json times;  // --times: read once, applied to every profile
  if (!load_times.empty()) {
    std::ifstream in(load_times);
    RATION_CHECK(in.good(), "bench_plan_yardstick: cannot read --times ", load_times);
    times = nlohmann::json::parse(in);
  }
  std::vector<std::pair<ModelCase, int>> runs;  // each model case once per profile
  for (const ModelCase& mc : cases)
    if (only.empty() || !custom.config.empty() || only.find("," + mc.name + ",") != std::string::npos)
      for (int k = 0; k < profiles; ++k) runs.emplace_back(mc, k);
  for (const auto& [mc, profile_index] : runs) {
    const std::string path = mc.config.front() == '/' ? mc.config : std::string(RATION_SOURCE_DIR) + "/" + mc.config;
    bench::ModelBench mb = bench::load_model_bench(path, mc.overrides);
    train::StepRuntime runtime;
    memory::StepProfile profile = with_typical_times(runtime.profile(mb.model(), mb.batch, 100));
    if (!times.is_null()) {
      RATION_CHECK(times.size() == profile.nodes.size(), "bench_plan_yardstick: ", load_times, " has ", times.size(),
                   " node times, the profile ", profile.nodes.size(), " nodes");
      for (size_t k = 0; k < profile.nodes.size(); ++k) profile.nodes[k].forward_ms = times[k].get<double>();
    }
    if (!save_times.empty()) {
      nlohmann::json saved = nlohmann::json::array();
      for (const auto& n : profile.nodes) saved.push_back(n.forward_ms);
      bench::write_json(save_times + "." + mc.name + "." + std::to_string(profile_index) + ".json", saved);
    }
    memory::PlanOptions loose;
    loose.budget_bytes = int64_t{1} << 40;
    const memory::Plan full = memory::make_plan(profile, loose);
    const int64_t hi = full.unconstrained_peak_bytes;
    const bool chain = memory::why_not_chain(profile).empty();
    const int64_t lo = chain ? program_floor(profile, full.minimum_peak_bytes, hi) : full.minimum_peak_bytes;
    if (program_floor_everywhere && !chain) {  // the program's own floor: how far below the planner's it reaches
      const int64_t exact_floor = program_floor(profile, full.fixed_bytes, hi);
      memory::PlanOptions no_restarts = loose;
      no_restarts.floor_restarts = false;
      const int64_t before = memory::make_plan(profile, no_restarts).minimum_peak_bytes;
      auto above = [&](int64_t b) {
        return static_cast<double>(b - full.fixed_bytes) / static_cast<double>(std::max<int64_t>(1, exact_floor - full.fixed_bytes));
      };
      std::printf("%-8s floor: planner %s (%lld B; without restarts %s), program %s (%lld B); above fixed, planner / "
                  "program %.4f (without restarts %.4f)\n",
                  mc.name.c_str(), memory::format_bytes(lo).c_str(), static_cast<long long>(lo),
                  memory::format_bytes(before).c_str(), memory::format_bytes(exact_floor).c_str(),
                  static_cast<long long>(exact_floor), above(lo), above(before));
      floors.push_back({{"model", mc.name}, {"planner_floor_bytes", lo}, {"planner_floor_without_restarts_bytes", before},
                        {"program_floor_bytes", exact_floor}, {"fixed_bytes", full.fixed_bytes}});
    }
    for (double f : fractions) {
      memory::PlanOptions o;
      o.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
      const memory::Plan knap = memory::make_plan(profile, o);
      memory::PlanOptions before = o;  // the knapsack without exchanges, on the same profile
      before.exchanges = false;
      const memory::Plan descent = memory::make_plan(profile, before);
      memory::ExactPlanOptions eo;
      eo.time_limit_s = time_limit;
      const memory::ExactPlan exact = memory::solve_exact_plan(profile, o, eo);
      const double k = knap.prediction.recompute_ms, e = exact.simulated_recompute_ms;
      const double ratio = e > 0 ? k / e : (k > 0 ? 1e9 : 1.0);
      const double kd = descent.prediction.recompute_ms, ratio_before = e > 0 ? kd / e : (kd > 0 ? 1e9 : 1.0);
      const bool solved = exact.status != memory::ExactPlan::Status::NoSolution;
      if (solved) worst = std::max(worst, ratio);
      const bool same_peak = exact.predicted_peak_bytes == exact.simulated_peak_bytes;
      std::printf("%-8s %6zu %10s %5.2f %8.4f %11.3f %11.3f %8.4f %9.3f %7.1fms %7.1fms %-10s %10s %5s %8.2f %7d %7d %4d\n",
                  mc.name.c_str(), full.groups.size(), memory::format_bytes(o.budget_bytes).c_str(), f, ratio_before, k, e,
                  ratio, exact.bound_ms, knap.plan_ms, descent.plan_ms, status_name(exact.status),
                  memory::format_bytes(exact.simulated_peak_bytes).c_str(), same_peak ? "yes" : "NO", exact.solve_s,
                  exact.columns, exact.rows, exact.cuts);
      std::fflush(stdout);
      if (list_groups && solved)  // --groups: each group with both decisions
        for (size_t i = 0; i < knap.groups.size(); ++i)
          std::printf("   %3zu %-28s %-12s %9s %8.3f  knap %-9s exact %s\n", i, knap.groups[i].op.c_str(), knap.groups[i].node_set.c_str(),
                      memory::format_bytes(knap.groups[i].bytes).c_str(), knap.groups[i].recompute_ms,
                      memory::to_string(knap.groups[i].decision), memory::to_string(exact.decisions[i]));
      rows.push_back({{"model", mc.name}, {"profile", profile_index}, {"groups", full.groups.size()}, {"nodes", profile.nodes.size()},
                      {"budget_bytes", o.budget_bytes}, {"fraction_above_floor", f}, {"floor_bytes", lo},
                      {"unconstrained_bytes", hi}, {"knapsack_recompute_ms", k}, {"exact_recompute_ms", e},
                      {"ratio", ratio}, {"solver_bound_ms", exact.bound_ms}, {"knapsack_plan_ms", knap.plan_ms},
                      {"knapsack_without_exchanges_recompute_ms", kd}, {"ratio_without_exchanges", ratio_before},
                      {"knapsack_without_exchanges_plan_ms", descent.plan_ms},
                      {"knapsack_peak_bytes", knap.prediction.peak_bytes}, {"status", status_name(exact.status)},
                      {"exact_program_peak_bytes", exact.predicted_peak_bytes},
                      {"exact_simulated_peak_bytes", exact.simulated_peak_bytes}, {"program_peak_equals_simulator", same_peak},
                      {"solve_s", exact.solve_s}, {"columns", exact.columns}, {"rows", exact.rows}, {"cuts", exact.cuts}});
    }
  }
  std::printf("(ratio = knapsack's predicted recompute ms / the exact program's, both from the simulator; before = the\n"
              " same ratio for the knapsack without exchanges (PlanOptions::exchanges off); peak = the exact answer's\n"
              " simulated peak, =sim: the program's own peak equals it; plan, plan bef. = make_plan's time with and without)\n");
  std::printf("worst ratio %.4f (target <= 1.05: %s)\n", worst, worst <= 1.05 ? "met" : "NOT met");
  bench::write_json(out, {{"benchmark", "plan_yardstick"}, {"time_limit_s", time_limit}, {"worst_ratio", worst},
                          {"rows", rows}, {"floors", floors}});
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
