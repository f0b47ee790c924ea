// engine_vs_libtorch.cpp — ration's autograd vs libtorch's C++ autograd on the same model and batch.
// For each config: the same forward (same modules, same ATen kernels, same dropout masks) is
// differentiated by ration's engine and by torch::autograd (OracleScope), alternating runs so both see
// the same machine state. Reports median forward+backward time and the counting allocator's measured
// peak during the step (absolute, and above the pre-step baseline).
//
// usage: bench_engine_vs_libtorch [--steps N] [--out FILE.json] CONFIG.toml [CONFIG.toml ...] [--set k=v ...]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/train/trainer.h"

using namespace ration;

namespace {
using bench::median;

struct Sample {
  double ms;
  int64_t peak;        // absolute measured peak during the step
  int64_t peak_extra;  // peak minus bytes live before the step
};

Sample one_step(models::Model& model, const data::Batch& batch, bool torch_autograd, uint64_t seed) {
  model.zero_grad();
  const int64_t before = memory::current_bytes();
  memory::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  manual_seed(seed);
  if (torch_autograd) {
    OracleScope scope(model.parameters());
    Value loss = model.loss(batch);
    loss.backward();
  } else {
    Value loss = model.loss(batch);
    loss.backward();
  }
  const double ms = bench::ms_since(t0);
  const int64_t peak = memory::stats().peak_bytes;
  model.zero_grad();
  return {ms, peak, peak - before};
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int steps = 10;
  std::string out = "bench/results/engine_vs_libtorch.json";
  std::vector<std::string> configs, overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else configs.push_back(a);
  }
  if (configs.empty()) configs = {"configs/cnn.toml", "configs/gpt.toml"};

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-22s %6s %14s %14s %8s %14s %14s %8s\n", "config", "batch", "ration ms", "libtorch ms", "ratio",
              "ration peak", "libtorch peak", "ratio");
  for (const auto& path : configs) {
    const bench::ModelBench mb = bench::load_model_bench(path, overrides);
    const train::Setup& setup = mb.setup;
    const data::Batch& batch = mb.batch;
    std::vector<double> ours_ms, theirs_ms;
    int64_t ours_peak = 0, theirs_peak = 0, ours_extra = 0, theirs_extra = 0;
    for (int w = 0; w < 2; ++w) {  // warm-up both
      one_step(*setup.model, batch, false, 1);
      one_step(*setup.model, batch, true, 1);
    }
    for (int s = 0; s < steps; ++s) {
      const bool torch_first = s % 2 == 1;
      for (int k = 0; k < 2; ++k) {
        const bool torch_autograd = (k == 0) == torch_first;
        const Sample r = one_step(*setup.model, batch, torch_autograd, 100 + static_cast<uint64_t>(s));
        if (torch_autograd) {
          theirs_ms.push_back(r.ms);
          theirs_peak = std::max(theirs_peak, r.peak);
          theirs_extra = std::max(theirs_extra, r.peak_extra);
        } else {
          ours_ms.push_back(r.ms);
          ours_peak = std::max(ours_peak, r.peak);
          ours_extra = std::max(ours_extra, r.peak_extra);
        }
      }
    }
    const double a = median(ours_ms), b = median(theirs_ms);
    std::printf("%-22s %6lld %14.2f %14.2f %8.3f %14s %14s %8.3f\n", path.c_str(),
                static_cast<long long>(setup.batch_size), a, b, a / b, memory::format_bytes(ours_extra).c_str(),
                memory::format_bytes(theirs_extra).c_str(),
                static_cast<double>(ours_extra) / static_cast<double>(std::max<int64_t>(theirs_extra, 1)));
    results.push_back({{"config", path},
                       {"batch_size", setup.batch_size},
                       {"steps", steps},
                       {"ration", {{"step_ms_median", a}, {"peak_bytes", ours_peak}, {"step_peak_above_baseline_bytes", ours_extra}, {"step_ms", ours_ms}}},
                       {"libtorch", {{"step_ms_median", b}, {"peak_bytes", theirs_peak}, {"step_peak_above_baseline_bytes", theirs_extra}, {"step_ms", theirs_ms}}},
                       {"time_ratio", a / b},
                       {"peak_ratio", static_cast<double>(ours_extra) / static_cast<double>(std::max<int64_t>(theirs_extra, 1))}});
  }
  std::printf("(time: median forward+backward; peak: measured bytes above the pre-step baseline, counting allocator)\n");
  bench::write_json(out, {{"benchmark", "engine_vs_libtorch"}, {"results", results}});
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
