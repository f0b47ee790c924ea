// bench_setup.h — the set-up protocol the model benches share (bench programs only, not part of the library).
// Owns: turning a config (a file plus --set overrides) into data, model and the one fixed batch a bench
//       times, with every section `ration train` reads read and validated ([optim]/[train], [memory],
//       [offload]; build_setup applies train.threads to ATen's and OpenBLAS's pools together, see
//       core/compute_threads.h) and the model in training mode; comparing two steps' gradients bit for
//       bit; timing a planned step runtime interleaved with the plain one.
// Does not own: installing the counting allocator (each program does, first, as its measurements need),
//       each program's flags, tables and JSON.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/data/dataset.h"
#include "ration/runtime/budget.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

namespace ration::bench {

// The seed of the batch every model bench times (and its PyTorch peers mirror in size).
inline constexpr uint64_t kBatchSeed = 7;

struct ModelBench {
  train::Setup setup;
  train::RunSettings run;        // [optim] and the rest of [train]
  train::MemorySettings memory;  // [memory] and [offload]
  data::Batch batch;             // setup.batch_size samples of the training set
  models::Model& model() const { return *setup.model; }
  Config& config() { return setup.config; }
};

// `batch_seed` nullopt: the config's train.seed.
inline ModelBench load_model_bench(const std::string& config_path, const std::vector<std::string>& overrides,
                                   std::optional<uint64_t> batch_seed = kBatchSeed) {
  ModelBench b{train::build_setup(train::load_config(config_path, overrides)), {}, {}, {}};
  b.run = train::read_run_settings(b.setup.config);
  b.memory = train::read_memory_settings(b.setup.config);
  b.setup.model->train();
  b.batch = train::sample_batch(b.setup, b.setup.batch_size, batch_seed.value_or(b.setup.seed));
  return b;
}

// Whether two steps collected the same gradients (StepOptions::collecting): same parameters, bit for bit.
inline bool same_gradients(const train::StepStats& a, const train::StepStats& b) {
  if (a.gradients.size() != b.gradients.size()) return false;
  for (size_t i = 0; i < a.gradients.size(); ++i)
    if (a.gradients[i].first != b.gradients[i].first || !at::equal(a.gradients[i].second, b.gradients[i].second))
      return false;
  return true;
}

// Forward + backward steps (gradients cleared) alternating between `runtime` and the unconstrained `plain`
// runtime, step i of both with dropout seed 100 + i, so drift on a shared machine hits both alike. The
// first `warmup` pairs are not timed; the peaks are `runtime`'s over every step, warm-up included.
struct PairedSteps {
  std::vector<double> ms, cpu_ms, recompute_ms;  // `runtime`'s timed steps
  std::vector<double> plain_ms, plain_cpu_ms;    // `plain`'s, each beside them
  int64_t peak_bytes = 0, peak_above = 0;        // absolute, and above the step's baseline
};
inline PairedSteps paired_steps(models::Model& model, const data::Batch& batch, train::StepRuntime& runtime,
                                train::StepRuntime& plain, int warmup, int steps) {
  PairedSteps p;
  for (int s = 0; s < warmup + steps; ++s) {
    train::StepOptions o;
    o.seed = 100 + static_cast<uint64_t>(s);
    o.gradients = train::GradientsAfter::Cleared;
    const train::StepStats a = runtime.measure_step(model, batch, o);
    const train::StepStats b = plain.measure_step(model, batch, o);
    p.peak_bytes = std::max(p.peak_bytes, a.peak_bytes);
    p.peak_above = std::max(p.peak_above, a.peak_above_baseline());
    if (s < warmup) continue;
    p.ms.push_back(a.ms);
    p.cpu_ms.push_back(a.cpu_ms);
    p.recompute_ms.push_back(a.recompute_ms);
    p.plain_ms.push_back(b.ms);
    p.plain_cpu_ms.push_back(b.cpu_ms);
  }
  return p;
}

}  // namespace ration::bench
