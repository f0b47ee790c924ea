#include "ration/train/setup.h"

#include <cmath>
#include <algorithm>
#include <limits>
#include <sstream>
#include <thread>

#include "ration/base/allocator.h"
#include "ration/base/check.h"
#include "ration/base/host_malloc.h"
#include "ration/core/compute_threads.h"
#include "ration/core/node.h"
#include "ration/data/ctr_data.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/data/fashion_mnist.h"
#include "ration/data/tensor_file.h"
#include "ration/data/text.h"
#include "ration/models/families.h"
#include "ration/models/torchscript.h"
#include "ration/optim/adamw.h"
#include "ration/optim/sgd.h"

namespace ration::train {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- data.kind: one loader per kind, and the table naming them ------------------------------------------
// Each fills the setup's training and evaluation sets (and what its task reports next to the loss); a
// text loader returns the largest byte value in its corpus (checked against the model's vocabulary),
// the others -1.

int64_t load_ctr(Config& cfg, const char* kind, Setup& s) {
  data::CtrSets sets = data::make_ctr_datasets(cfg, kind);
  s.train_set = sets.train;
  s.eval_set = sets.eval;
  s.planted_auc = sets.planted_auc;
  return -1;
}

int64_t load_fashion_mnist(Config& cfg, const char*, Setup& s) {
  const std::string dir = cfg.get_string("data.dir", data::kFashionMnistDir);
  s.train_set = std::make_shared<data::FashionMnist>(data::FashionMnist::Split::Train, dir);
  s.eval_set = std::make_shared<data::FashionMnist>(data::FashionMnist::Split::Test, dir);
  return -1;
}

int64_t load_text(Config& cfg, const char*, Setup& s) {
  const auto files = split_list(cfg.get_string("data.files", data::kDefaultTextFile));
  RATION_CHECK(!files.empty(), cfg.origin(), ": data.files must name at least one file (comma-separated)");
  const double val_fraction = cfg.get_double("data.val_fraction", 0.1);
  RATION_CHECK(val_fraction > 0 && val_fraction < 1, cfg.origin(), ": data.val_fraction must be in (0, 1)");
  data::TextCorpus corpus(files, val_fraction);
  // The window length: data.seq_len, defaulting to the model's block_size when it has one.
  const int64_t block = cfg.has("model.block_size") ? cfg.get_int("model.block_size", 64) : 64;
  const int64_t seq_len = cfg.get_int("data.seq_len", block);
  RATION_CHECK(seq_len > 0, cfg.origin(), ": data.seq_len must be positive");
  s.train_set = std::make_shared<data::TextWindows>(corpus.train(), seq_len, 1);
  s.eval_set = std::make_shared<data::TextWindows>(corpus.val(), seq_len, seq_len);
  s.unigram_entropy_nats = corpus.unigram_entropy(/*bits=*/false);
  return std::max(corpus.train().max().item<int64_t>(), corpus.val().max().item<int64_t>());
}

// data.train / data.test: files torch.save wrote ({"inputs": ..., "target": ...}; data/tensor_file.h).
int64_t load_tensors(Config& cfg, const char*, Setup& s) {
  RATION_CHECK(cfg.has("data.train"), cfg.origin(), ": data.kind = \"tensors\" needs data.train (and data.test), ",
               "files written with torch.save({\"inputs\": x, \"target\": y}, path)");
  s.train_set = std::make_shared<data::TensorFile>(cfg.get_string("data.train", ""));
  s.eval_set = cfg.has("data.test") ? std::make_shared<data::TensorFile>(cfg.get_string("data.test", "")) : s.train_set;
  return -1;
}

// A tensor file's inputs against what an imported module's forward takes, before any step runs.
void check_tensor_inputs(Config& cfg, const Setup& s) {
  const auto* module = dynamic_cast<const models::TorchScriptModel*>(s.model.get());
  if (module == nullptr) return;
  const size_t expected = module->data_inputs();
  for (const auto* set : {s.train_set.get(), s.eval_set.get()}) {
    const auto* file = dynamic_cast<const data::TensorFile*>(set);
    if (file == nullptr) continue;
    RATION_CHECK(file->num_inputs() == expected, cfg.origin(), ": data file '", file->path(), "': \"inputs\" holds ",
                 file->num_inputs(), " tensor(s) per item but forward of model.path '", module->options().path,
                 "' takes ", expected, " input(s)", module->options().loss.empty() ? " before the target" : "",
                 "; hint: save {\"inputs\": (x1, ..., x", expected, "), \"target\": y}, one tensor per forward ",
                 "argument in order");
  }
}

struct DataKind {
  const char* name;
  Task task;
  int64_t (*load)(Config& cfg, const char* kind, Setup& s);
};

const DataKind kDataKinds[] = {
    {"fashion_mnist", {Task::Kind::Classification, "img/s", true}, load_fashion_mnist},
    {"text", {Task::Kind::LanguageModel, "tok/s", false}, load_text},
    {"synthetic_ctr", {Task::Kind::ClickThrough, "samples/s", true}, load_ctr},
    {"movielens", {Task::Kind::ClickThrough, "samples/s", true}, load_ctr},
    {"tensors", {Task::Kind::Classification, "samples/s", true}, load_tensors},
};

const DataKind& data_kind(Config& cfg) {
  std::vector<std::string> names;
  for (const DataKind& k : kDataKinds) names.emplace_back(k.name);
  const std::string chosen = cfg.get_choice("data.kind", names.front(), names);
  for (const DataKind& k : kDataKinds)
    if (chosen == k.name) return k;
  RATION_ASSERT(false, "data.kind '", chosen, "' missing from the table");
}

}  // namespace

std::unique_ptr<optim::Optimizer> build_optimizer(const RunSettings& r, const optim::NamedParams& params) {
  if (r.optimizer == "sgd" || r.optimizer == "es" || r.optimizer == "kfac") {
    optim::SGDOptions o;
    o.lr = r.lr;
    o.momentum = r.momentum;
    o.dampening = r.dampening;
    o.weight_decay = r.weight_decay;
    o.nesterov = r.nesterov;
    return std::make_unique<optim::SGD>(params, o);
  }
  optim::AdamWOptions o;
  o.lr = r.lr;
  o.beta1 = r.beta1;
  o.beta2 = r.beta2;
  o.eps = r.eps;
  o.weight_decay = r.weight_decay;
  o.amsgrad = r.amsgrad;
  return std::make_unique<optim::AdamW>(params, o);
}

RunSettings read_run_settings(Config& cfg) {
  RunSettings r;
  r.optimizer = cfg.get_choice("optim.name", r.optimizer, {"adamw", "sgd", "es", "kfac"});
  r.lr = cfg.get_double("optim.lr", r.lr);
  // The update runs in float32: a rate it cannot hold (overflow, or rounding to 0) is an input error.
  RATION_CHECK(r.lr >= std::numeric_limits<float>::min() && r.lr <= std::numeric_limits<float>::max(), cfg.origin(),
               ": optim.lr must be a number > 0 that float32 holds (from 1.2e-38 to 3.4e+38), got ", r.lr);
  const bool sgd = r.optimizer == "sgd" || r.optimizer == "es" || r.optimizer == "kfac";
  if (r.optimizer == "kfac") {
    r.kfac_update_every = cfg.get_int("optim.kfac_update_every", r.kfac_update_every);
    r.kfac_damping = cfg.get_double("optim.kfac_damping", r.kfac_damping);
    r.kfac_stat_decay = cfg.get_double("optim.kfac_stat_decay", r.kfac_stat_decay);
    r.kfac_kl_clip = cfg.get_double("optim.kfac_kl_clip", r.kfac_kl_clip);
    RATION_CHECK(r.kfac_update_every >= 1 && r.kfac_damping > 0 && r.kfac_stat_decay >= 0 && r.kfac_stat_decay < 1 &&
                     r.kfac_kl_clip >= 0,
                 cfg.origin(), ": optim.kfac_update_every must be an integer >= 1, optim.kfac_damping a number > 0, "
                 "optim.kfac_stat_decay in [0, 1) and optim.kfac_kl_clip >= 0 (0: no clipping); got ",
                 r.kfac_update_every, ", ", r.kfac_damping, ", ", r.kfac_stat_decay, ", ", r.kfac_kl_clip);
  }
  if (r.optimizer == "es") {
    r.es_population = cfg.get_int("optim.es_population", r.es_population);
    RATION_CHECK(r.es_population >= 2 && r.es_population % 2 == 0, cfg.origin(), ": optim.es_population must be an "
                 "even integer >= 2 (antithetic pairs: theta + sigma eps and theta - sigma eps), got ", r.es_population);
    r.es_sigma = cfg.get_double("optim.es_sigma", r.es_sigma);
    RATION_CHECK(r.es_sigma > 0 && std::isfinite(r.es_sigma), cfg.origin(),
                 ": optim.es_sigma must be a number > 0 (the perturbations' scale), got ", r.es_sigma);
  }
  r.weight_decay = cfg.get_double("optim.weight_decay", sgd ? 0.0 : r.weight_decay);
  if (sgd) {
    r.momentum = cfg.get_double("optim.momentum", r.momentum);
    r.dampening = cfg.get_double("optim.dampening", r.dampening);
    r.nesterov = cfg.get_bool("optim.nesterov", r.nesterov);
  } else {
    r.beta1 = cfg.get_double("optim.beta1", r.beta1);
    r.beta2 = cfg.get_double("optim.beta2", r.beta2);
    r.eps = cfg.get_double("optim.eps", r.eps);
    r.amsgrad = cfg.get_bool("optim.amsgrad", r.amsgrad);
  }
  r.schedule = cfg.get_choice("optim.schedule", r.schedule, {"cosine", "constant"});
  r.warmup_steps = cfg.get_int("optim.warmup_steps", r.warmup_steps);
  r.min_lr = cfg.get_double("optim.min_lr", r.schedule == "constant" ? r.lr : r.lr * 0.1);
  r.clip_grad_norm = cfg.get_double("optim.clip_grad_norm", r.clip_grad_norm);
  RATION_CHECK(r.warmup_steps >= 0 && r.clip_grad_norm >= 0 && r.min_lr >= 0, cfg.origin(),
               ": optim.warmup_steps, optim.min_lr and optim.clip_grad_norm must be >= 0");
  r.epochs = cfg.get_int("train.epochs", r.epochs);
  r.steps = cfg.get_int("train.steps", r.steps);
  r.eval_every = cfg.get_int("train.eval_every", r.eval_every);
  r.eval_batches = cfg.get_int("train.eval_batches", r.eval_batches);
  r.log_every = cfg.get_int("train.log_every", r.log_every);
  r.checkpoint_dir = cfg.get_string("train.checkpoint_dir", r.checkpoint_dir);
  r.checkpoint_every = cfg.get_int("train.checkpoint_every", r.checkpoint_every);
  r.keep_checkpoints = cfg.get_int("train.keep_checkpoints", r.keep_checkpoints);
  RATION_CHECK(r.epochs > 0, cfg.origin(), ": train.epochs must be >= 1, got ", r.epochs);
  RATION_CHECK(r.steps >= 0, cfg.origin(), ": train.steps must be >= 0 (0: use train.epochs), got ", r.steps);
  RATION_CHECK(r.keep_checkpoints >= 1, cfg.origin(), ": train.keep_checkpoints must be >= 1 (how many checkpoints ",
               "to keep), got ", r.keep_checkpoints);
  RATION_CHECK(r.eval_every >= 0, cfg.origin(), ": train.eval_every must be >= 0 (0: at each epoch's end), got ",
               r.eval_every);
  RATION_CHECK(r.eval_batches >= 0, cfg.origin(), ": train.eval_batches must be >= 0 (0: the whole set), got ",
               r.eval_batches);
  RATION_CHECK(r.checkpoint_every >= 0, cfg.origin(), ": train.checkpoint_every must be >= 0 (0: only at the end), got ",
               r.checkpoint_every);
  RATION_CHECK(r.log_every >= 1, cfg.origin(), ": train.log_every must be >= 1, got ", r.log_every);
  if (cfg.has("train.tbptt")) {
    r.tbptt = cfg.get_int("train.tbptt", 0);
    RATION_CHECK(r.tbptt >= 1, cfg.origin(), ": train.tbptt must be a chunk length >= 1 (time steps per ",
                 "truncated-BPTT chunk; leave it out for full backpropagation through time); got ", r.tbptt);
  }
  return r;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config cfg = Config::from_file(path);
  for (const auto& o : overrides) cfg.set_override(o);
  return cfg;
}

int64_t read_threads(Config& cfg) {
  const int64_t threads = cfg.get_int("train.threads", std::max(1u, std::thread::hardware_concurrency()));
  RATION_CHECK(threads > 0, cfg.origin(), ": train.threads must be >= 1");
  return threads;
}

Setup build_setup(Config config) {
  Setup s;
  s.config = std::move(config);
  Config& cfg = s.config;
  s.seed = static_cast<uint64_t>(cfg.get_int("train.seed", 0));
  s.batch_size = cfg.get_int("train.batch_size", 64);
  RATION_CHECK(s.batch_size > 0, cfg.origin(), ": train.batch_size must be a positive integer, got ", s.batch_size);
  set_compute_threads(static_cast<int>(read_threads(cfg)));  // ATen and OpenBLAS together
  // Freed host memory glibc keeps for the next step instead of trimming it and faulting it in again
  // (base/host_malloc.h); default 1 GiB; 0 leaves glibc's own thresholds.
  const int64_t keep_freed = cfg.get_bytes("train.malloc_keep_freed", int64_t{1} << 30);
  if (keep_freed > 0) memory::keep_freed_host_memory(keep_freed);
  at::manual_seed(s.seed);
  manual_seed(s.seed);

  const DataKind& kind = data_kind(cfg);
  s.task = kind.task;
  memory::CategoryGuard data_memory(memory::Category::Data);
  const int64_t data_max_token = kind.load(cfg, kind.name, s);  // text: the largest byte in the corpus
  const std::string device = cfg.get_choice("train.device", "cpu", {"cpu", "cuda"});
  {
    memory::CategoryGuard param_memory(memory::Category::Parameters);
    s.model = models::build_model(cfg);
  }
  if (const auto* lm = dynamic_cast<const models::LanguageModel*>(s.model.get()); lm && data_max_token >= 0) {
    RATION_CHECK(data_max_token < lm->vocab_size(), cfg.origin(), ": model.vocab_size = ", lm->vocab_size(),
                 " but the text in data.files has byte values up to ", data_max_token, "; hint: set model.vocab_size >= ",
                 data_max_token + 1, " (256 covers every byte)");
  }
  check_tensor_inputs(cfg, s);
  if (device == "cuda") {
#ifndef RATION_CUDA
    RATION_CHECK(false, cfg.origin(), ": train.device = \"cuda\" needs ration built with -DRATION_CUDA=ON");
#endif
    RATION_CHECK(at::hasCUDA(), cfg.origin(), ": train.device = \"cuda\" needs ration built with -DRATION_CUDA=ON "
                 "against a CUDA libtorch, and a visible GPU");
    RATION_CHECK(!cfg.has("memory.budget"), cfg.origin(), ": memory budgets are planned from the counting CPU "
                 "allocator; on CUDA use train.device = \"cpu\" for now (GPU planning reads the caching allocator "
                 "and is not wired yet)");
    s.model->to(at::TensorOptions().device(at::kCUDA));
  }
  for (auto& [name, p] : s.model->named_parameters()) memory::retag(p.tensor(), memory::Category::Parameters);
  return s;
}

data::Batch sample_batch(const Setup& setup, int64_t batch_size, uint64_t seed) {
  data::Loader loader(setup.train_set, {batch_size, /*shuffle=*/true, seed, /*drop_last=*/true});
  return loader.next();
}


}  // namespace ration::train
