// setup.h — everything a run is built from, read once from its config: the data (by data.kind), the model,
// the task they make, the seed and batch size, and the [optim] / remaining [train] keys; shared by train,
// gradcheck, plan and the benchmarks.
// Owns: Task (what a run learns and how it is measured), Setup, RunSettings, building the optimiser.
// Does not own: the training loop (trainer.h), the model families (models/), the datasets (data/).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ration/config/config.h"
#include "ration/data/dataset.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"

namespace ration::train {

// What a run learns, from data.kind: how its throughput is counted, whether the end of an epoch
// evaluates (a language model evaluates every train.eval_every steps only), and which figures an
// evaluation reports (accuracy; bits per byte; AUC and log loss).
struct Task {
  enum class Kind { Classification, LanguageModel, ClickThrough };
  Kind kind = Kind::Classification;
  const char* throughput_unit = "img/s";
  bool evaluates_each_epoch = true;
};

// Everything a run is built from, shared by train, gradcheck and bench.
struct Setup {
  Config config;
  std::unique_ptr<models::Model> model;
  std::shared_ptr<data::Dataset> train_set;
  std::shared_ptr<data::Dataset> eval_set;
  Task task;                    // from data.kind
  double unigram_entropy_nats = 0;  // text only
  std::optional<double> planted_auc;  // synthetic_ctr only: the planted model's own eval AUC
  uint64_t seed = 0;
  int64_t batch_size = 0;
};

// The [optim] and remaining [train] keys: read once, validated, shared by train and gradcheck.
struct RunSettings {
  // "adamw" | "sgd" | "es" (SGD on an evolution-strategies estimate) | "kfac" (SGD on K-FAC's natural gradient)
  std::string optimizer = "adamw";
  double lr = 1e-3, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0.9, dampening = 0, min_lr = 1e-4, clip_grad_norm = 0;
  bool nesterov = false, amsgrad = false;
  std::string schedule = "cosine";  // "cosine" | "constant"
  int64_t warmup_steps = 0;
  int64_t epochs = 1, steps = 0, eval_every = 0, eval_batches = 0, log_every = 10;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0, keep_checkpoints = 2;
  int64_t tbptt = 0;  // train.tbptt: truncated-BPTT chunk length (0: not set, full backpropagation)
  // optim.name = "es" (train/es_step.h): perturbations per step over every rank (even), their scale.
  int64_t es_population = 32;
  double es_sigma = 0.01;
  // optim.name = "kfac" (distributed/kfac.h): optim.kfac_update_every, _damping, _stat_decay, _kl_clip.
  int64_t kfac_update_every = 10;
  double kfac_damping = 0.1, kfac_stat_decay = 0.95, kfac_kl_clip = 1e-3;
};
RunSettings read_run_settings(Config& cfg);
// The optimiser the run settings name (sgd or adamw, with their keys; "es" steps with SGD), over `params`.
std::unique_ptr<optim::Optimizer> build_optimizer(const RunSettings& r, const optim::NamedParams& params);

// train.threads: ATen's and OpenBLAS's intra-op threads (default: every core), checked >= 1.
int64_t read_threads(Config& cfg);
// Reads [data], [model] and train.seed/batch_size/threads. Leaves other sections for the caller.
Setup build_setup(Config config);
// A deterministic batch from the training set (for gradcheck and benchmarks).
data::Batch sample_batch(const Setup& setup, int64_t batch_size, uint64_t seed);

// Loads a config file and applies --set overrides, with errors naming the file.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace ration::train
