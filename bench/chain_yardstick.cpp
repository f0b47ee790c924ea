// chain_yardstick.cpp — the knapsack planner on a chain-shaped model next to the `optimal-chain` strategy
// (the binomial Revolve/Griewank schedule executed with recompute-without-storing), both run for real.
// The chain: an MLP of n equal hidden layers (each layer step, linear + relu, saves one activation-sized
// group). For budgets one activation slot apart, from the unconstrained peak down to the minimum: each
// plan's slots (activation memory of its predicted peak in layer-sized units), predicted and measured
// layer steps re-run per training step, predicted and measured peak, median step time, whether the
// gradients equal the unconstrained step's bit for bit, and the binomial optimum for that many slots.
// Measured peaks are the step's peak above the bytes live before it, plus the profiled baseline (the
// reference gradients this program keeps would otherwise shift every measurement).
//
// The yardstick: the chain's n layer states plus its head (the output layer and loss, whose backward
// needs state n) is Revolve's chain of n + 1 steps, the free input its first checkpoint; with s slots the
// fewest re-run steps is revolve_min_recomputes(n + 1, s).
//
// usage: bench_chain_yardstick [--layers N] [--width W] [--batch B] [--steps K] [--out FILE.json]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/plan/planner.h"
#include "ration/runtime/budget.h"
#include "ration/config/config.h"
#include "ration/runtime/step_runtime.h"

using namespace ration;

namespace {
using bench::median;

// Every step: the same dropout seed, gradients collected to compare with the plain step's.
const train::StepOptions kStep = train::StepOptions::collecting(1);

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int64_t layers = 16, width = 512, batch = 256, steps = 3;
  std::string out = "bench/results/chain_yardstick.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--layers") layers = std::stoll(argv[i + 1]);
    else if (a == "--width") width = std::stoll(argv[i + 1]);
    else if (a == "--batch") batch = std::stoll(argv[i + 1]);
    else if (a == "--steps") steps = std::stoll(argv[i + 1]);
    else if (a == "--out") out = argv[i + 1];
  }
  std::string hidden = "[";
  for (int64_t l = 0; l < layers; ++l) hidden += (l ? "," : "") + std::to_string(width);
  hidden += "]";
  Config cfg = Config::from_string("[model]\ntype='mlp'\ndropout=0.0\nhidden=" + hidden + "\n", "chain.toml");
  at::manual_seed(0);
  auto model = models::build_model(cfg);
  model->train();
  data::Batch b;
  b.input = Value(at::randn({batch, 1, 28, 28}));
  b.target = Value(at::randint(0, 10, {batch}, at::kLong));
  b.items = batch;
  train::StepRuntime runtime, plain_runtime;
  const memory::StepProfile& profile = runtime.profile(*model, b, 1);
  const train::StepStats plain = plain_runtime.measure_step(*model, b, kStep);

  memory::PlanOptions loose;
  loose.budget_bytes = int64_t{1} << 40;
  const memory::Plan full = memory::make_plan(profile, loose);
  const int64_t slot = batch * width * 4;  // one layer's activation
  const int64_t hi = full.unconstrained_peak_bytes, lo = full.minimum_peak_bytes;
  std::printf("chain: %lld layers of %lld, batch %lld; one slot = %s; %zu groups; %lld measured steps per plan\n",
              static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(batch),
              memory::format_bytes(slot).c_str(), full.groups.size(), static_cast<long long>(steps));
  std::printf("%10s %-13s %5s %5s %5s %9s %9s %8s %10s %10s %8s %5s %8s\n", "budget", "strategy", "slots", "sched", "kept",
              "pred.steps", "meas.steps", "revolve", "pred.peak", "meas.peak", "step ms", "grads", "kn/opt");
  nlohmann::json rows = nlohmann::json::array();
  bool target_met = true;
  std::vector<int64_t> budgets = {hi};
  for (int64_t s = layers - 1; s >= 1; --s) {
    const int64_t budget = full.fixed_bytes + s * slot + slot / 2;
    if (budget >= lo && budget < hi) budgets.push_back(budget);
  }
  for (const int64_t budget : budgets) {
    int64_t optimal_steps = -1;
    for (auto strategy : {memory::Strategy::OptimalChain, memory::Strategy::Knapsack}) {
      memory::PlanOptions o;
      o.budget_bytes = budget;
      o.strategy = strategy;
      memory::Plan plan;
      try {
        plan = memory::make_plan(profile, o);
      } catch (const Error& e) {
        std::printf("%10s %-13s %s\n", memory::format_bytes(budget).c_str(), memory::to_string(strategy), e.what());
        continue;
      }
      runtime.use_plan(plan);
      std::vector<double> ms;
      int64_t peak = 0, reruns = -1;
      bool same = true;
      for (int64_t k = 0; k < steps; ++k) {
        const train::StepStats r = runtime.measure_step(*model, b, kStep);
        ms.push_back(r.ms);
        peak = std::max(peak, profile.baseline_bytes + r.peak_above_baseline());  // same baseline as the prediction
        reruns = r.recomputed_nodes;
        same = same && bench::same_gradients(r, plain);
      }
      // Memory for activations in slots: what the plan's peak leaves above the fixed occupancy.
      const int64_t slots = std::max<int64_t>(1, (plan.prediction.peak_bytes - full.fixed_bytes) / slot);
      // A binomial schedule states its slots; a greedy plan's are read from its peak.
      const int64_t sched = plan.chain_slots > 0 ? plan.chain_slots : slots;
      const int64_t revolve = memory::revolve_min_recomputes(layers + 1, std::min(sched, layers + 1));
      // Each layer is two nodes (linear, relu): a layer step re-run is one pair.
      const int64_t predicted_steps = plan.prediction.recomputed_nodes / 2, measured_steps = reruns / 2;
      std::string ratio = "-";
      if (strategy == memory::Strategy::OptimalChain) {
        optimal_steps = predicted_steps;
      } else if (optimal_steps >= 0) {
        char buf[32];
        if (optimal_steps > 0) std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(predicted_steps) / static_cast<double>(optimal_steps));
        else std::snprintf(buf, sizeof buf, "%s", predicted_steps == 0 ? "=" : "inf");
        ratio = buf;
        // The target: within 10% of optimal-chain from sqrt(n) slots up.
        if (sched * sched >= layers && static_cast<double>(predicted_steps) > 1.10 * static_cast<double>(optimal_steps))
          target_met = false;
      }
      std::printf("%10s %-13s %5lld %5s %5lld %9lld %9lld %8lld %10s %10s %8.1f %5s %8s\n",
                  memory::format_bytes(budget).c_str(), memory::to_string(strategy), static_cast<long long>(slots),
                  plan.chain_slots > 0 ? std::to_string(plan.chain_slots).c_str() : "-",
                  static_cast<long long>(plan.kept_groups), static_cast<long long>(predicted_steps),
                  static_cast<long long>(measured_steps), static_cast<long long>(revolve),
                  memory::format_bytes(plan.prediction.peak_bytes).c_str(), memory::format_bytes(peak).c_str(),
                  median(ms), same ? "equal" : "DIFF", ratio.c_str());
      rows.push_back({{"budget_bytes", budget}, {"strategy", memory::to_string(strategy)}, {"slots", slots}, {"schedule_slots", plan.chain_slots},
                      {"kept_groups", plan.kept_groups}, {"predicted_recomputed_layer_steps", predicted_steps},
                      {"measured_recomputed_layer_steps", measured_steps}, {"revolve_min_recomputes", revolve},
                      {"predicted_peak_bytes", plan.prediction.peak_bytes}, {"measured_peak_bytes", peak},
                      {"median_step_ms", median(ms)}, {"gradients_bitwise_equal", same},
                      {"transient_producers", plan.store_from.size()}});
    }
  }
  std::printf("(slots = activation memory of the predicted peak in layer-sized units; sched = a binomial schedule's\n"
              " slots; steps = layer forward steps re-run per training step (linear+relu pairs); revolve =\n"
              " revolve_min_recomputes(layers + 1, sched or slots), the binomial optimum; kn/opt = knapsack / optimal-chain)\n");
  std::printf("target (knapsack within 10%% of optimal-chain at every budget from sqrt(n) slots up): %s\n",
              target_met ? "met" : "NOT met");
  bench::write_json(out, {{"benchmark", "chain_yardstick"}, {"layers", layers}, {"width", width},
                          {"batch", batch}, {"steps", steps}, {"baseline_step_ms", plain.ms},
                          {"baseline_peak_bytes", plain.peak_above_baseline()}, {"target_met", target_met},
                          {"rows", rows}});
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
