// plan_scaling.cpp — planner time against model depth: gpt with n_layer from 4 to 384 (n_embd 64,
// 4 heads), one profiling step each (timed on its own), then the knapsack plan at several budgets
// between the feasible minimum and the unconstrained peak, and the loose plan that finds the minimum.
// The figure of merit is planning time (make_plan, profiling excluded) and how it grows with the number
// of saved groups; there is no peer (PyTorch has no budget planner), the measurements of the
// previous planner are the comparison.
//
// usage: bench_plan_scaling [--layers 4,12,...] [--reps N] [--out FILE.json] [CONFIG.toml] [--set k=v ...]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/core/check.h"
#include "ration/memory/allocator.h"
#include "ration/memory/planner.h"
#include "ration/train/budget.h"
#include "ration/train/step_runtime.h"
#include "ration/train/trainer.h"

using namespace ration;

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<int> layers = {4, 12, 24, 48, 96, 192, 384};
  std::vector<double> fractions = {0.1, 0.5, 0.9};  // budget = minimum + f * (unconstrained - minimum)
  int reps = 1;
  std::string out = "bench/results/plan_scaling.json", config = "configs/gpt.toml";
  std::vector<std::string> overrides = {"model.n_embd=64", "model.n_head=4"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layers" && i + 1 < argc) {
      layers.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) layers.push_back(std::stoi(t));
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--set" && i + 1 < argc) {
      overrides.push_back(argv[++i]);
    } else {
      config = a;
    }
  }
  try {
    memory::install_counting_allocator();
    std::printf("gpt, %s, plan time (make_plan only; median of %d) vs depth\n", config.c_str(), reps);
    std::printf("%8s %8s %8s %11s %11s %11s %11s %11s %11s\n", "n_layer", "groups", "nodes", "profile_ms",
                "minimum_ms", "plan@0.1_ms", "plan@0.5_ms", "plan@0.9_ms", "minimum");
    nlohmann::json rows = nlohmann::json::array();
    for (int L : layers) {
      std::vector<std::string> o = overrides;
      o.push_back("model.n_layer=" + std::to_string(L));
      train::Setup setup = train::build_setup(train::load_config(config, o));
      const train::RunSettings run = train::read_run_settings(setup.config);
      (void)train::read_budget_settings(setup.config);
      setup.model->train();
      const data::Batch batch = train::sample_batch(setup, setup.batch_size, setup.seed);
      auto t0 = std::chrono::steady_clock::now();
      const memory::StepProfile profile = train::profile_step(*setup.model, batch, setup.seed + 1);
      const double profile_ms = ms_since(t0);
      memory::PlanOptions loose;
      loose.budget_bytes = int64_t{1} << 50;
      loose.extra_fixed_bytes = train::unseen_optimizer_bytes(run.optimizer, run.momentum, run.amsgrad, *setup.model);
      std::vector<double> minimum_ms;
      memory::Plan lp;
      for (int r = 0; r < reps; ++r) {
        lp = memory::make_plan(profile, loose);
        minimum_ms.push_back(lp.plan_ms);
      }
      const int64_t lo = lp.minimum_peak_bytes, hi = lp.unconstrained_peak_bytes;
      nlohmann::json plans = nlohmann::json::array();
      std::vector<double> plan_ms;
      for (double f : fractions) {
        memory::PlanOptions po = loose;
        po.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
        std::vector<double> ms;
        memory::Plan p;
        for (int r = 0; r < reps; ++r) {
          p = memory::make_plan(profile, po);
          ms.push_back(p.plan_ms);
        }
        plan_ms.push_back(bench::median(ms));
        plans.push_back({{"budget_fraction", f}, {"budget_bytes", po.budget_bytes}, {"plan_ms", plan_ms.back()},
                         {"predicted_peak_bytes", p.prediction.peak_bytes}, {"kept_groups", p.kept_groups},
                         {"predicted_recompute_ms", p.prediction.recompute_ms}});
      }
      std::printf("%8d %8zu %8zu %11.0f %11.1f %11.1f %11.1f %11.1f %11s\n", L, lp.groups.size(), profile.nodes.size(),
                  profile_ms, bench::median(minimum_ms), plan_ms[0], plan_ms[1], plan_ms[2],
                  memory::format_bytes(lo).c_str());
      std::fflush(stdout);
      rows.push_back({{"n_layer", L}, {"groups", lp.groups.size()}, {"nodes", profile.nodes.size()},
                      {"profile_ms", profile_ms}, {"minimum_plan_ms", bench::median(minimum_ms)},
                      {"unconstrained_peak_bytes", hi}, {"minimum_peak_bytes", lo}, {"plans", plans}});
    }
    // Growth between consecutive rows: exponent of plan time in the number of groups.
    std::printf("growth (plan@0.5): ");
    for (size_t i = 1; i < rows.size(); ++i) {
      const double g0 = rows[i - 1]["groups"].get<double>(), g1 = rows[i]["groups"].get<double>();
      const double t0 = rows[i - 1]["plans"][1]["plan_ms"].get<double>(), t1 = rows[i]["plans"][1]["plan_ms"].get<double>();
      std::printf("%d->%d: n^%.2f  ", rows[i - 1]["n_layer"].get<int>(), rows[i]["n_layer"].get<int>(),
                  std::log(t1 / t0) / std::log(g1 / g0));
    }
    std::printf("\n");
    nlohmann::json j = {{"bench", "plan_scaling"}, {"config", config}, {"overrides", overrides}, {"reps", reps},
                        {"machine", "2 vCPU Xeon KVM guest, Debian 12"}, {"rows", rows}};
    std::ofstream(out) << j.dump(2) << "\n";
    std::printf("wrote %s\n", out.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
