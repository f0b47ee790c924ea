// seq_bptt_budget.cpp — full backpropagation through time of lstm_lm at long T under a memory budget of a
// fraction (default 10%) of its unconstrained activation memory (docs/METHODS.md, "Temporal-dependency
// buffers for sequence models", "Full BPTT under a budget"). lstm_lm is built with model.unroll = "step"
// (every saved value belongs to one time step), profiled once, planned for the budget by the budget
// planner, and run: per T, the measured peak (counting allocator) against the budget, the gradients
// against the unconstrained step (bitwise), and the step time against the unconstrained step measured
// interleaved (process CPU time, robust to a shared machine). Gruslys et al. (2016, "Memory-Efficient
// Backpropagation Through Time") is printed as the anchor: ~95% less memory for ~+33% time at T = 1000.
//
// usage: bench_seq_bptt_budget [--seq-len 1024,4096] [--fraction 0.1] [--steps N] [--strategy NAME]
//                              [--out FILE.json] [CONFIG.toml] [--set k=v ...]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/plan/planner.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

using namespace ration;

namespace {
using bench::median;

struct Row {
  int64_t seq_len = 0, activation_bytes = 0, budget_above = 0, budget_bytes = 0;
  int64_t predicted = 0, peak = 0, peak_above = 0, plain_peak_above = 0, minimum_peak = 0;
  double ms = 0, plain_ms = 0, cpu_ms = 0, plain_cpu_ms = 0, overhead = 0, recompute_ms = 0, plan_ms = 0;
  int64_t kept = 0, dropped = 0, recomputed_nodes = 0, nodes = 0;
  bool bitwise = false;
  std::string status = "ok";
};

Row run_one(const std::string& config, std::vector<std::string> overrides, int64_t T, double fraction, int steps,
            const std::string& strategy) {
  overrides.push_back("model.unroll=step");
  overrides.push_back("data.seq_len=" + std::to_string(T));
  overrides.push_back("data.val_fraction=0.5");  // both halves of the text hold a window of T = 4096
  bench::ModelBench mb = bench::load_model_bench(config, overrides);
  models::Model& model = mb.model();
  const data::Batch& batch = mb.batch;
  Row r;
  r.seq_len = T;
  train::StepRuntime planned, plain;
  // Unconstrained: the reference gradients and the activation memory (peak above the step's baseline).
  const train::StepStats ref = plain.measure_step(model, batch, train::StepOptions::collecting(11));
  r.activation_bytes = ref.peak_above_baseline();
  const memory::StepProfile& profile = planned.profile(model, batch, 11);
  r.nodes = static_cast<int64_t>(profile.nodes.size());
  r.budget_above = static_cast<int64_t>(fraction * static_cast<double>(r.activation_bytes));
  r.budget_bytes = ref.baseline_bytes + r.budget_above;
  memory::PlanOptions o;
  o.budget_bytes = r.budget_bytes;
  o.strategy = memory::parse_strategy(strategy);
  memory::Plan plan;
  try {
    plan = memory::make_plan(profile, o);
  } catch (const Error& e) {
    r.status = std::string("no plan: ") + e.what();
    return r;
  }
  r.plan_ms = plan.plan_ms;
  r.predicted = plan.prediction.peak_bytes;
  r.minimum_peak = plan.minimum_peak_bytes;
  r.kept = plan.kept_groups;
  r.dropped = plan.dropped_groups;
  planned.use_plan(std::move(plan));
  const train::StepStats first = planned.measure_step(model, batch, train::StepOptions::collecting(11));
  r.bitwise = bench::same_gradients(first, ref);
  r.peak = first.peak_bytes;
  r.peak_above = first.peak_above_baseline();
  r.recomputed_nodes = first.recomputed_nodes;
  r.plain_peak_above = ref.peak_above_baseline();
  // Interleaved timing: planned and plain steps alternate (the collecting step above was the warm-up).
  const bench::PairedSteps t = bench::paired_steps(model, batch, planned, plain, /*warmup=*/0, steps);
  r.peak = std::max(r.peak, t.peak_bytes);
  r.peak_above = std::max(r.peak_above, t.peak_above);
  r.ms = median(t.ms);
  r.plain_ms = median(t.plain_ms);
  r.cpu_ms = median(t.cpu_ms);
  r.plain_cpu_ms = median(t.plain_cpu_ms);
  r.recompute_ms = median(t.recompute_ms);
  r.overhead = r.cpu_ms / r.plain_cpu_ms - 1.0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int steps = 3;
  double fraction = 0.1;
  std::vector<int64_t> lengths = {1024, 4096};
  std::string out = "bench/results/seq_bptt_budget.json", config = "configs/lstm_lm.toml", strategy = "knapsack";
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--fraction" && i + 1 < argc) fraction = std::stod(argv[++i]);
    else if (a == "--seq-len" && i + 1 < argc) lengths = bench::numbers<int64_t>(argv[++i]);
    else if (a == "--strategy" && i + 1 < argc) strategy = argv[++i];
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else config = a;
  }
  std::printf("lstm_lm full BPTT under a budget of %.0f%% of the unconstrained activation memory (%s, %s, "
              "%d timed steps each, interleaved)\n",
              100 * fraction, config.c_str(), strategy.c_str(), steps);
  std::printf("%6s %7s %11s %11s %11s %11s %5s %9s %9s %9s %9s %8s\n", "T", "nodes", "activation", "budget",
              "peak", "saved", "bits", "plain ms", "plan ms", "plain cpu", "plan cpu", "overhead");
  nlohmann::json rows = nlohmann::json::array();
  bool all_ok = true;
  for (int64_t T : lengths) {
    const Row r = run_one(config, overrides, T, fraction, steps, strategy);
    if (r.status != "ok") {
      std::printf("%6lld  %s\n", static_cast<long long>(T), r.status.c_str());
      all_ok = false;
    } else {
      const double saved = 1.0 - static_cast<double>(r.peak_above) / static_cast<double>(r.activation_bytes);
      std::printf("%6lld %7lld %11s %11s %11s %10.1f%% %5s %9.0f %9.0f %9.0f %9.0f %7.1f%%\n",
                  static_cast<long long>(T), static_cast<long long>(r.nodes),
                  memory::format_bytes(r.activation_bytes).c_str(), memory::format_bytes(r.budget_above).c_str(),
                  memory::format_bytes(r.peak_above).c_str(), 100 * saved, r.bitwise ? "equal" : "DIFF", r.plain_ms,
                  r.ms, r.plain_cpu_ms, r.cpu_ms, 100 * r.overhead);
      all_ok = all_ok && r.bitwise && r.peak <= r.budget_bytes;
    }
    rows.push_back({{"seq_len", r.seq_len}, {"status", r.status}, {"nodes", r.nodes},
                    {"activation_bytes", r.activation_bytes}, {"budget_above_baseline_bytes", r.budget_above},
                    {"budget_bytes", r.budget_bytes}, {"predicted_peak_bytes", r.predicted},
                    {"minimum_peak_bytes", r.minimum_peak}, {"measured_peak_bytes", r.peak},
                    {"peak_above_baseline_bytes", r.peak_above}, {"within_budget", r.peak <= r.budget_bytes},
                    {"gradients_bitwise_equal", r.bitwise}, {"step_ms_median", r.ms},
                    {"plain_step_ms_median", r.plain_ms}, {"step_cpu_ms_median", r.cpu_ms},
                    {"plain_step_cpu_ms_median", r.plain_cpu_ms}, {"overhead_vs_unconstrained", r.overhead},
                    {"recompute_ms_median", r.recompute_ms}, {"recomputed_nodes", r.recomputed_nodes},
                    {"kept_groups", r.kept}, {"dropped_groups", r.dropped}, {"plan_ms", r.plan_ms}});
  }
  std::printf("anchor: Gruslys et al. 2016 (BPTT-MSM), T = 1000: ~95%% less memory for ~+33%% time\n");
  std::printf("columns: activation = unconstrained peak above the step's baseline; budget and peak likewise above "
              "the baseline; saved = 1 - peak/activation; bits = gradients vs the unconstrained step\n");
  nlohmann::json j = {{"bench", "seq_bptt_budget"}, {"config", config}, {"strategy", strategy},
                      {"fraction", fraction}, {"steps", steps}, {"rows", rows},
                      {"anchor", {{"source", "Gruslys et al. 2016"}, {"seq_len", 1000}, {"memory_saved", 0.95},
                                  {"time_overhead", 0.33}}}};
  bench::write_json(out, j);
  std::printf("wrote %s\n", out.c_str());
  return all_ok ? 0 : 1;
}
