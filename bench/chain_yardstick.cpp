// chain_yardstick.cpp — how many recomputations the knapsack planner needs on a chain-shaped model,
// next to the Revolve (Griewank binomial) optimum for the same memory, counted in activation slots.
// The chain: an MLP of n equal hidden layers (each layer saves one activation-sized group). For each
// budget from the unconstrained peak down to the minimum: knapsack's kept groups, its re-run producers
// per step (simulated, the executor matches it), the memory it uses in slots, and revolve(n, slots).
//
// usage: bench_chain_yardstick [--layers N] [--width W] [--batch B] [--out FILE.json]
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "ration/core/check.h"
#include "ration/memory/allocator.h"
#include "ration/memory/planner.h"
#include "ration/train/budget.h"
#include "ration/train/config.h"

using namespace ration;

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int64_t layers = 16, width = 512, batch = 256;
  std::string out = "bench/results/chain_yardstick.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--layers") layers = std::stoll(argv[i + 1]);
    else if (a == "--width") width = std::stoll(argv[i + 1]);
    else if (a == "--batch") batch = std::stoll(argv[i + 1]);
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
  const memory::StepProfile profile = train::profile_step(*model, b, 1);

  memory::PlanOptions loose;
  loose.budget_bytes = int64_t{1} << 40;
  const memory::Plan full = memory::make_plan(profile, loose);
  const int64_t slot = batch * width * 4;  // one layer's activation
  const int64_t hi = full.unconstrained_peak_bytes, lo = full.minimum_peak_bytes;
  std::printf("chain: %lld layers of %lld, batch %lld; one slot = %s; %zu groups\n", static_cast<long long>(layers),
              static_cast<long long>(width), static_cast<long long>(batch), memory::format_bytes(slot).c_str(),
              full.groups.size());
  std::printf("%12s %8s %8s %14s %12s %10s\n", "budget", "slots", "kept", "knapsack steps", "revolve", "ratio");
  nlohmann::json rows = nlohmann::json::array();
  for (int k = 0; k <= 10; ++k) {
    memory::PlanOptions o;
    o.budget_bytes = hi - (hi - lo) * k / 10;
    memory::Plan plan;
    try {
      plan = memory::make_plan(profile, o);
    } catch (const Error&) {
      continue;
    }
    // Memory for activations in slots: what the plan's peak leaves above the fixed occupancy.
    const int64_t slots = std::max<int64_t>(1, (plan.prediction.peak_bytes - full.fixed_bytes) / slot);
    const int64_t n = layers;
    const int64_t revolve = memory::revolve_min_recomputes(n, std::min(slots, n));
    // Each layer is two nodes (linear, relu): a layer step re-run is one pair.
    const int64_t ours = plan.prediction.recomputed_nodes / 2;
    std::printf("%12s %8lld %8lld %14lld %12lld %10s\n", memory::format_bytes(o.budget_bytes).c_str(),
                static_cast<long long>(slots), static_cast<long long>(plan.kept_groups), static_cast<long long>(ours),
                static_cast<long long>(revolve),
                revolve > 0 ? std::to_string(static_cast<double>(ours) / static_cast<double>(revolve)).substr(0, 5).c_str() : "-");
    rows.push_back({{"budget_bytes", o.budget_bytes}, {"slots", slots}, {"kept_groups", plan.kept_groups},
                    {"knapsack_recomputed_layer_steps", ours}, {"revolve_min_recomputes", revolve},
                    {"predicted_peak_bytes", plan.prediction.peak_bytes}});
  }
  std::printf("(knapsack steps = layer forward steps re-run per training step (linear+relu pairs); revolve = the binomial\n"
              " optimum's re-run steps for the chain with that many activation slots)\n");
  const auto slash = out.find_last_of('/');
  if (slash != std::string::npos) std::system(("mkdir -p " + out.substr(0, slash)).c_str());
  std::ofstream(out) << nlohmann::json{{"benchmark", "chain_yardstick"}, {"layers", layers}, {"width", width},
                                       {"batch", batch}, {"rows", rows}}.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
