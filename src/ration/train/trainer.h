// trainer.h — `ration train`: config -> data, model, optimiser -> steps with progress, evaluation,
// checkpoints and a JSON report.
// Owns: the training loop (TrainingRun in trainer.cpp: steps, budget correction, evaluation,
//       checkpoints) and its report. Does not own: the model (models/), the data (data/), the update rule
//       (optim/), the on-disk checkpoint layout (train/checkpoint.h), or one step's execution and memory
//       runtime (runtime/step_runtime.h).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ration/data/dataset.h"
#include "ration/distributed/world.h"
#include "ration/offload/engine.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"
#include "ration/config/config.h"

namespace ration::train {

class StepRuntime;

// What the caller attaches to a run (the command line's --trace and --html, train/step_trace.h): called
// with the run's step runtime once before the first step, and once the report is built (before it is
// written, so entries added to it are saved too).
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void before_steps(StepRuntime& runtime, int64_t first_step, int64_t total_steps) {}
  virtual void after_run(StepRuntime& runtime, nlohmann::json& report) {}
};

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // "section.key=value"
  std::optional<int64_t> steps;
  std::optional<int64_t> epochs;
  std::string report_path;             // empty: no file
  std::string resume;                  // checkpoint dir, or a run dir (follows latest)
  bool json = false;                   // quiet; the report goes to stdout
  // > 0: profile this many steps (after the first) per op and per node (train/op_profile.h): the table is
  // printed at the end (stderr with --json) and the report gets "op_profile".
  int64_t profile_ops = 0;
  // Data parallel: the world to train in. Undefined (the default): joined from the environment when
  // WORLD_SIZE is set (torchrun-style variables, as `ration launch` sets them), else one process.
  dist::World world;
  RunObserver* observer = nullptr;     // optional; outlives the run
};

// Everything a run is built from, shared by train, gradcheck and bench.
struct Setup {
  Config config;
  std::unique_ptr<models::Model> model;
  std::shared_ptr<data::Dataset> train_set;
  std::shared_ptr<data::Dataset> eval_set;
  std::string data_kind;        // "fashion_mnist", "text", "synthetic_ctr" or "movielens"
  double unigram_entropy_nats = 0;  // text only
  std::optional<double> planted_auc;  // synthetic_ctr only: the planted model's own eval AUC
  uint64_t seed = 0;
  int64_t batch_size = 0;
};

// The [optim] and remaining [train] keys: read once, validated, shared by train and gradcheck.
struct RunSettings {
  std::string optimizer = "adamw";  // "adamw" | "sgd"
  double lr = 1e-3, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0.9, dampening = 0, min_lr = 1e-4, clip_grad_norm = 0;
  bool nesterov = false, amsgrad = false;
  std::string schedule = "cosine";  // "cosine" | "constant"
  int64_t warmup_steps = 0;
  int64_t epochs = 1, steps = 0, eval_every = 0, eval_batches = 0, log_every = 10;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0, keep_checkpoints = 2;
  int64_t tbptt = 0;  // train.tbptt: truncated-BPTT chunk length (0: not set, full backpropagation)
};
RunSettings read_run_settings(Config& cfg);
// The optimiser the run settings name (sgd or adamw, with their keys), over `params`.
std::unique_ptr<optim::Optimizer> build_optimizer(const RunSettings& r, const optim::NamedParams& params);

// Reads [data], [model] and train.seed/batch_size/threads. Leaves other sections for the caller.
Setup build_setup(Config config);
// A deterministic batch from the training set (for gradcheck and benchmarks).
data::Batch sample_batch(const Setup& setup, int64_t batch_size, uint64_t seed);

// Runs training; returns the report (also written to options.report_path when set, by rank 0 only).
// With WORLD_SIZE > 1 each rank trains on its shard and gradients are synchronised (distributed/reducer.h); a
// lost peer makes every rank throw ration::Error naming it.
nlohmann::json run_training(const TrainOptions& options);

// The offload engine's counters as JSON (the report's offload.totals; benchmarks).
nlohmann::json offload_stats_json(const memory::OffloadStats& stats);

// Loads a config file and applies --set overrides, with errors naming the file.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace ration::train
