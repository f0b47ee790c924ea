#include "ration/train/trainer.h"
#include "ration/base/timing.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ration/base/check.h"
#include "ration/core/compute_threads.h"
#include "ration/train/op_profile.h"
#include "ration/core/node.h"
#include "ration/data/ctr_data.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/data/fashion_mnist.h"
#include "ration/data/text.h"
#include "ration/models/families.h"
#include "ration/distributed/data_parallel.h"
#include "ration/distributed/liveness.h"
#include "ration/distributed/reducer.h"
#include "ration/base/allocator.h"
#include "ration/base/host_malloc.h"
#include "ration/optim/adamw.h"
#include "ration/optim/clip.h"
#include "ration/optim/schedule.h"
#include "ration/optim/sgd.h"
#include "ration/plan/report.h"
#include "ration/runtime/budget.h"
#include "ration/train/checkpoint.h"
#include "ration/train/progress.h"
#include "ration/train/ps_exchange.h"
#include "ration/train/signals.h"
#include "ration/streaming/tbptt.h"
#include "ration/runtime/step_runtime.h"

namespace ration::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

nlohmann::json memory_json(const memory::Stats& s) {
  nlohmann::json breakdown, peaks;
  for (int c = 0; c < memory::kNumCategories; ++c) {
    breakdown[memory::to_string(static_cast<memory::Category>(c))] = s.at_peak[static_cast<size_t>(c)];
    peaks[memory::to_string(static_cast<memory::Category>(c))] = s.peak[static_cast<size_t>(c)];
  }
  return {{"peak_bytes", s.peak_bytes},
          {"current_bytes", s.current_bytes},
          {"breakdown_at_peak", breakdown},
          {"category_peaks", peaks},
          {"allocations", s.allocations},
          {"measured_by", memory::counting_allocator_installed() ? "counting ATen CPU allocator" : "not installed"}};
}

struct EvalResult {
  double loss = 0;      // mean per item (nats)
  double accuracy = 0;  // fraction
  int64_t count = 0;
  std::optional<double> auc;  // binary tasks (ctr)
};

// Data parallel: each rank evaluates its shard of every global batch and the sums are all-reduced, so
// every rank reports the one-process figures.
EvalResult evaluate(models::Model& model, const std::shared_ptr<data::Dataset>& set, int64_t batch_size,
                    int64_t max_batches, const dist::World& world) {
  data::LoaderOptions lo{batch_size, /*shuffle=*/false, 0, /*drop_last=*/false};
  lo.shard_rank = world.rank();
  lo.shard_count = world.size();
  data::Loader loader(set, lo);
  models::EvalStats total;
  const bool was_training = model.is_training();
  model.eval();
  int64_t batches = 0;
  {
    NoGradGuard no_grad;
    while (loader.has_next_in_epoch() && (max_batches <= 0 || batches < max_batches)) {
      const std::vector<int64_t> indices = loader.next_indices();
      ++batches;
      if (indices.empty()) continue;  // a short last batch left this rank nothing
      data::Batch b = set->get(indices);
      const auto s = model.evaluate(b);
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.count += s.count;
      total.scores.insert(total.scores.end(), s.scores.begin(), s.scores.end());
      total.labels.insert(total.labels.end(), s.labels.begin(), s.labels.end());
    }
  }
  model.train(was_training);
  const std::vector<double> sums = dist::all_reduce_doubles(
      world, {total.loss_sum, static_cast<double>(total.correct), static_cast<double>(total.count)});
  total.loss_sum = sums[0];
  total.correct = static_cast<int64_t>(sums[1]);
  total.count = static_cast<int64_t>(sums[2]);
  EvalResult r;
  r.count = total.count;
  if (total.count > 0) {
    r.loss = total.loss_sum / static_cast<double>(total.count);
    r.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.count);
  }
  // AUC is not a sum: every rank ranks the scores of the whole evaluation set (all-gathered).
  const std::vector<float> scores = dist::all_gather_floats(world, total.scores);
  const std::vector<float> labels = dist::all_gather_floats(world, total.labels);
  if (!scores.empty()) r.auc = data::roc_auc(scores, labels);
  return r;
}

// Keys that do not change the weights a run computes: a run differing only in these is the same run
// (checkpoints it writes at a step hold the same weights). Budgets and offload are bitwise-neutral.
const std::vector<std::string> kWeightNeutralKeys = {
    "train.checkpoint_dir", "train.checkpoint_every", "train.keep_checkpoints", "train.log_every",
    "train.eval_every", "train.eval_batches", "train.steps", "train.epochs", "train.malloc_keep_freed", "memory.",
    "offload."};

}  // namespace

std::unique_ptr<optim::Optimizer> build_optimizer(const RunSettings& r, const optim::NamedParams& params) {
  if (r.optimizer == "sgd") {
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
  r.optimizer = cfg.get_choice("optim.name", r.optimizer, {"adamw", "sgd"});
  r.lr = cfg.get_double("optim.lr", r.lr);
  RATION_CHECK(r.lr > 0, cfg.origin(), ": optim.lr must be > 0, got ", r.lr);
  const bool sgd = r.optimizer == "sgd";
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
  RATION_CHECK(r.epochs > 0 && r.steps >= 0 && r.keep_checkpoints >= 1, cfg.origin(),
               ": train.epochs must be >= 1, train.steps >= 0 (0: use epochs), train.keep_checkpoints >= 1");
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

Setup build_setup(Config config) {
  Setup s;
  s.config = std::move(config);
  Config& cfg = s.config;
  s.seed = static_cast<uint64_t>(cfg.get_int("train.seed", 0));
  s.batch_size = cfg.get_int("train.batch_size", 64);
  RATION_CHECK(s.batch_size > 0, cfg.origin(), ": train.batch_size must be a positive integer, got ", s.batch_size);
  const int64_t threads = cfg.get_int("train.threads", std::max(1u, std::thread::hardware_concurrency()));
  RATION_CHECK(threads > 0, cfg.origin(), ": train.threads must be >= 1");
  set_compute_threads(static_cast<int>(threads));  // ATen and OpenBLAS together
  // Freed host memory glibc keeps for the next step instead of trimming it and faulting it in again
  // (base/host_malloc.h); default 1 GiB; 0 leaves glibc's own thresholds.
  const int64_t keep_freed = cfg.get_bytes("train.malloc_keep_freed", int64_t{1} << 30);
  if (keep_freed > 0) memory::keep_freed_host_memory(keep_freed);
  at::manual_seed(s.seed);
  manual_seed(s.seed);

  s.data_kind = cfg.get_choice("data.kind", "fashion_mnist", {"fashion_mnist", "text", "synthetic_ctr", "movielens"});
  int64_t data_max_token = -1;  // text: the largest byte value in the corpus
  memory::CategoryGuard data_memory(memory::Category::Data);
  if (s.data_kind == "synthetic_ctr" || s.data_kind == "movielens") {
    data::CtrSets sets = data::make_ctr_datasets(cfg, s.data_kind);
    s.train_set = sets.train;
    s.eval_set = sets.eval;
    s.planted_auc = sets.planted_auc;
  } else if (s.data_kind == "fashion_mnist") {
    const std::string dir = cfg.get_string("data.dir", data::kFashionMnistDir);
    s.train_set = std::make_shared<data::FashionMnist>(data::FashionMnist::Split::Train, dir);
    s.eval_set = std::make_shared<data::FashionMnist>(data::FashionMnist::Split::Test, dir);
  } else {
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
    data_max_token = std::max(corpus.train().max().item<int64_t>(), corpus.val().max().item<int64_t>());
  }
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

namespace {

// ---- the pieces of a run ---------------------------------------------------------------------------

// Plan, measure, correct: the simulator can under-count (a workspace the profile did not see); when a
// step's measured peak exceeds the budget, plan again for a budget lowered by the overshoot plus a
// margin, while that stays feasible.
class BudgetCorrector {
 public:
  // Each correction costs a planning pass; a plan still over after this many is reported as over
  // (memory.within_budget false, a warning) rather than chased further.
  static constexpr int kMaxReplans = 3;
  // The margin: a quarter of the overshoot on top of it, so that one correction usually suffices
  // (the under-count grows with what the new plan drops, roughly in proportion).
  static constexpr int64_t kMarginFractionOfOvershoot = 4;

  BudgetCorrector(StepRuntime& runtime, int64_t user_budget) : runtime_(runtime), user_budget_(user_budget) {}

  // After a step measured `peak`: a note for the progress output when it re-planned, else empty.
  std::string after_step(int64_t step, int64_t peak) {
    memory::Plan* plan = runtime_.current_plan();
    if (!plan || peak <= user_budget_ || replans_ >= kMaxReplans) return {};
    const int64_t over = peak - user_budget_;
    const int64_t target = planned_budget_ - over - over / kMarginFractionOfOvershoot;
    if (target < plan->minimum_peak_bytes) return {};
    planned_budget_ = target;
    runtime_.replan(target);
    runtime_.current_plan()->budget_bytes = user_budget_;  // report against the user's budget
    ++replans_;
    return "step " + std::to_string(step + 1) + " measured " + memory::format_bytes(peak) +
           " over the budget: re-planned for " + memory::format_bytes(target);
  }
  int replans() const { return replans_; }

 private:
  StepRuntime& runtime_;
  int64_t user_budget_;
  int64_t planned_budget_ = user_budget_;
  int replans_ = 0;
};

}  // namespace

nlohmann::json offload_stats_json(const memory::OffloadStats& s) {
  return {{"offloaded_values", s.offloaded_values},   {"offloaded_storages", s.offloaded_storages},
          {"written_bytes", s.written_bytes},         {"read_bytes", s.read_bytes},
          {"prefetches", s.prefetches},               {"demand_fetches", s.demand_fetches},
          {"deferred_prefetches", s.deferred_prefetches}, {"forward_pauses", s.forward_pauses},
          {"deadline_waits", s.deadline_waits},       {"fallbacks", s.fallbacks},
          {"write_ms", s.write_ms},                   {"read_ms", s.read_ms},
          {"forward_pause_ms", s.forward_pause_ms},   {"fetch_wait_ms", s.fetch_wait_ms},
          {"max_usage_bytes", s.max_usage_bytes}};
}

namespace {

// What the steps measured, summed up for the report.
struct StepRecord {
  nlohmann::json losses = nlohmann::json::array();
  std::vector<double> step_ms, recompute_ms;
  std::vector<int64_t> peaks;
  int64_t items = 0;
  double seconds = 0;

  void add(const StepStats& st, int64_t items_in_batch, bool planned) {
    step_ms.push_back(st.ms);
    peaks.push_back(st.peak_bytes);
    if (planned) recompute_ms.push_back(st.recompute_ms);
    seconds += st.ms / 1000.0;
    items += items_in_batch;
    losses.push_back(st.loss);
  }
  double items_per_second() const { return static_cast<double>(items) / std::max(seconds, 1e-9); }
  int64_t worst_peak() const { return peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end()); }
};

// A step's dropout seed is train.seed * kSeedSpread + step: 2^64 divided by the golden ratio (odd), so
// runs with nearby train.seed values draw from far-apart seeds instead of sharing most of their steps'.
constexpr uint64_t kSeedSpread = 0x9E3779B97F4A7C15ULL;

// The data-parallel keys of a run, read with the others before the world is joined.
struct DataParallelKeys {
  dist::DataParallelSettings dp;
  data::Sampling sampling = data::Sampling::Shuffle;
  bool drop_last = true;
};
DataParallelKeys read_data_parallel_keys(Config& c) {
  DataParallelKeys k;
  k.dp = dist::read_data_parallel_settings(c);
  k.sampling = c.get_choice("data.sampling", "shuffle", {"shuffle", "bootstrap"}) == "bootstrap"
                   ? data::Sampling::Bootstrap
                   : data::Sampling::Shuffle;
  k.drop_last = c.get_bool("data.drop_last", true);
  return k;
}

// The reducer attached to the step: each backward's weight is set after forward (the reducer's own
// gradient-ready hooks fill and launch the buckets during backward); the window is finalised before
// clipping and the optimiser.
class ReducerHook : public StepHook {
 public:
  // optimizer: the run's optimiser, whose AdamW denominators a onebit hook coding in the update space
  // takes before its compressed steps (dist.onebit_space = "update").
  ReducerHook(dist::Reducer& reducer, optim::Optimizer& optimizer) : reducer_(reducer), optimizer_(optimizer) {}
  void set_weight(double weight) { weight_ = weight; }
  void after_forward(int64_t step, const Value& loss) override {
    give_denominators_if_due(step);
    reducer_.set_window_context({step});
    reducer_.prepare_backward(weight_);
  }
  void before_optimizer(int64_t step) override {
    if (reducer_.window_complete()) reducer_.finalize();
  }
  void after_step(int64_t step, const StepStats& stats) override { reducer_.after_optimizer_step(); }

 private:
  void give_denominators_if_due(int64_t step) {
    auto* onebit = dynamic_cast<dist::OneBitHook*>(&reducer_.hook());
    if (!onebit || !onebit->denominators_due(step)) return;
    auto* adamw = dynamic_cast<optim::AdamW*>(&optimizer_);
    RATION_ASSERT(adamw != nullptr, "dist.onebit_space = \"update\" without an AdamW optimiser");
    onebit->set_denominators(reducer_.bucket_layout_of(adamw->denominators(), 1.f));
  }
  dist::Reducer& reducer_;
  optim::Optimizer& optimizer_;
  double weight_ = 1;
};

// One run of `ration train`: built from the options, then steps, evaluations, checkpoints, report.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& options)
      : options_(options), setup_(build_setup(load_config(options.config_path, options.overrides))),
        model_(*setup_.model), params_(model_.named_parameters()), run_(read_run_settings(setup_.config)),
        keys_(read_data_parallel_keys(setup_.config)), runtime_(read_memory_settings(setup_.config)),
        world_(checked_world()), loader_(setup_.train_set, shard_options()),
        progress_(options.json || world_.rank() != 0, run_.log_every) {
    Config& c = setup_.config;
    if (world_.size() > 1) liveness_ = std::make_unique<dist::Liveness>(world_);
    optimizer_ = build_optimizer(run_, params_);
    freeze_second_moment_for_onebit();
    per_epoch_ = (loader_.batches_per_epoch() + keys_.dp.reducer.sync_every - 1) / keys_.dp.reducer.sync_every;
    RATION_CHECK(per_epoch_ > 0, c.origin(), ": train.batch_size ", setup_.batch_size,
                 " is larger than the training set (", setup_.train_set->size(), " items)");
    const int64_t epochs = options.epochs.value_or(run_.epochs);
    total_steps_ = options.steps ? *options.steps : (run_.steps > 0 ? run_.steps : epochs * per_epoch_);
    schedule_ = std::make_unique<optim::WarmupCosine>(run_.lr, run_.schedule == "constant" ? run_.lr : run_.min_lr,
                                                      std::min(run_.warmup_steps, total_steps_), total_steps_);
    fingerprint_ = c.fingerprint(kWeightNeutralKeys) + "-" + std::to_string(total_steps_);
    if (run_.tbptt > 0) {  // each step: one sequence batch, run chunk by chunk (streaming/tbptt.h)
      seq::check_tbptt(model_, run_.tbptt, c.origin());
      RATION_CHECK(!runtime_.settings().budget.budget_bytes, c.origin(), ": train.tbptt and a memory budget do ",
                   "not combine yet (the plan is made for the full-sequence step); remove one of them");
      tbptt_ = std::make_unique<seq::ChunkedLoss>(model_, run_.tbptt);
    }
  }

  // run() with the data-parallel failure rules: a failed collective names the lost rank (every survivor
  // watches the heartbeats for the same window); any other error is left as this rank's note.
  nlohmann::json run_as_rank() {
    try {
      dist::check_same_config(world_, setup_.config.effective(), setup_.config.origin());
      nlohmann::json report = run();
      world_.barrier();  // leave together: rank 0 serves the store the others still use
      return report;
    } catch (const dist::CollectiveError& e) {
      const auto window = std::chrono::milliseconds(std::min<int64_t>(3000, keys_.dp.timeout_s * 1000 / 3));
      const std::string diagnosis = liveness_ ? liveness_->diagnose(window, std::chrono::seconds(keys_.dp.timeout_s))
                                              : std::string("one process");
      throw Error(detail::str("rank ", world_.rank(), " of ", world_.size(), ": ", diagnosis,
                              "; stopping (resume from the last checkpoint with --resume, with any number of "
                              "ranks). The failed collective: ", e.what()));
    } catch (const std::exception& e) {
      if (liveness_) liveness_->leaving(e.what());
      throw;
    }
  }

 private:
  nlohmann::json run() {
    resume();
    // Only rank 0 writes checkpoints, so only rank 0 locks and checks the directory.
    if (world_.rank() == 0) prepare_checkpoint_dir();
    // SIGINT/SIGTERM from here on: the current step finishes, then a checkpoint and the report.
    const InterruptScope interrupt;
    // Data parallel: every rank starts from rank 0's parameters (fresh or resumed).
    dist::broadcast_from_rank0(world_, params_, model_.named_buffers());
    model_.train();
    memory::reset_peak();
    first_step_ = step_;
    plan_memory();
    attach_reducer();
    if (options_.observer) options_.observer->before_steps(runtime_, first_step_, total_steps_);
    if (options_.profile_ops > 0) {
      op_profile_ = std::make_unique<OpProfile>(1, options_.profile_ops);
      runtime_.add_hook(op_profile_.get());
    }
    for (; step_ < total_steps_; ++step_) {
      step_begin_ = step_;
      train_one_step();
      after_step_duties();
      if ((stop_signal_ = reducer_ ? agreed_stop_ : InterruptScope::requested()) != 0) {
        ++step_;  // this step is done
        break;
      }
    }
    if (ps_) ps_->finish(*optimizer_);  // rank 0: every worker done; the model holds the final global one
    if (reducer_) reducer_->average_parameters_now();  // dist.aggregate = "parameters": one final model
    progress_.finish();
    // A stopped run skips the final evaluation (the user is waiting) and saves where it stopped.
    if (stop_signal_ != 0) {
      progress_.note(std::string("stopped by ") + InterruptScope::name(stop_signal_) + " after step " +
                     std::to_string(step_));
    } else if (evals_.empty() || evals_.back()["step"].get<int64_t>() != total_steps_) {
      evaluate_now(total_steps_);
    }
    std::string final_ckpt, checkpoint_error;
    try {
      final_ckpt = save(step_);
    } catch (const Error& e) {
      checkpoint_error = e.message();  // reported after the report is written
    }
    if (!final_ckpt.empty()) progress_.note("checkpoint " + final_ckpt);
    nlohmann::json report = build_report(final_ckpt);
    if (op_profile_) {
      report["op_profile"] = op_profile_->to_json();
      std::fprintf(options_.json ? stderr : stdout, "%s", op_profile_->table().c_str());
    }
    if (!checkpoint_error.empty()) report["checkpoint_error"] = checkpoint_error;
    if (options_.observer) options_.observer->after_run(runtime_, report);
    write_report(report, checkpoint_error);
    RATION_CHECK(checkpoint_error.empty(), "the final checkpoint was not saved: ", checkpoint_error,
                 options_.report_path.empty() ? "" : "; the report was written to " + options_.report_path);
    return report;
  }

  // The world (from the environment unless the options give one), after the config is fully read.
  dist::World checked_world() {
    setup_.config.check_all_used();
    return options_.world.defined() ? options_.world : dist::join_world(keys_.dp);
  }
  // This rank's shard of every global batch.
  data::LoaderOptions shard_options() const {
    data::LoaderOptions o{setup_.batch_size, /*shuffle=*/true, setup_.seed, keys_.drop_last};
    o.sampling = keys_.sampling;
    o.shard_rank = world_.rank();
    o.shard_count = world_.size();
    o.prefetch = true;  // the next batch is prepared on a thread while the step runs (data/dataset.h)
    return o;
  }
  bool synchronizes() const { return world_.size() > 1 || keys_.dp.reducer.sync_every > 1; }
  // onebit with dist.onebit_second_moment = "freeze": AdamW's second moment stays as it was after the last
  // fp32 warm-up step; both it and dist.onebit_space = "update" use AdamW's second moment
  // (docs/DISTRIBUTED.md, "1-bit compression").
  void freeze_second_moment_for_onebit() {
    if (keys_.dp.compress != "onebit") return;
    const bool freeze = keys_.dp.onebit.second_moment == dist::SecondMoment::Freeze;
    if (!freeze && keys_.dp.onebit.space == dist::CodeSpace::Gradient) return;
    auto* adamw = dynamic_cast<optim::AdamW*>(optimizer_.get());
    RATION_CHECK(adamw != nullptr, setup_.config.origin(),
                 ": dist.onebit_second_moment = \"freeze\" and dist.onebit_space = \"update\" use AdamW's second "
                 "moment; they need optim.name = \"adamw\" (SGD keeps none), got \"", run_.optimizer, "\"");
    if (freeze) adamw->freeze_second_moment(keys_.dp.onebit.warmup_steps);
  }

  // Gradient synchronisation (data parallel) and local accumulation (dist.sync_every): built after the
  // profiling step, whose backward must not reach the reducer.
  void attach_reducer() {
    if (!synchronizes()) return;
    reducer_ = std::make_unique<dist::Reducer>(
        world_, params_, dist::make_comm_hook(keys_.dp.compress, keys_.dp.onebit, setup_.config.origin()),
        keys_.dp.reducer);
    reducer_hook_ = std::make_unique<ReducerHook>(*reducer_, *optimizer_);
    attach_partial_aggregation();
    const std::string note = dist::restore_hook_state(world_, reducer_->hook(), resumed_hook_state_);
    if (!note.empty()) progress_.note(note);
    resumed_hook_state_.clear();
    runtime_.add_hook(reducer_hook_.get());
  }
  // dist.backup_workers / dist.sync = "async" (train/ps_exchange.h): every rank opens the parameter
  // server's channel; rank 0 builds the global model's copy and serves it.
  void attach_partial_aggregation() {
    const int n = world_.size();
    RATION_CHECK(keys_.dp.debug_delay_ms == 0 || keys_.dp.debug_delay_rank < n, setup_.config.origin(),
                 ": dist.debug_delay_rank must name a rank in [0, ", n, ") or be -1, got ", keys_.dp.debug_delay_rank);
    if (keys_.dp.ps.mode == dist::PsAggregation::Synchronous || n <= 1) return;
    RATION_CHECK(keys_.dp.ps.mode != dist::PsAggregation::BackupWorkers || keys_.dp.ps.backup_workers < n,
                 setup_.config.origin(), ": dist.backup_workers must be in [1, ", n - 1, "] with ", n,
                 " ranks (each round aggregates the first N - k pushes), got ", keys_.dp.ps.backup_workers);
    ps_ = std::make_unique<PsExchange>(world_, keys_.dp.ps, params_, run_, *optimizer_, *schedule_, step_);
  }
  bool loose() const { return ps_ != nullptr; }  // partial or asynchronous aggregation: no per-step collective
  bool is_lm() const { return setup_.data_kind == "text"; }
  bool is_ctr() const { return setup_.data_kind == "synthetic_ctr" || setup_.data_kind == "movielens"; }

  void resume() {
    if (options_.resume.empty()) return;
    const Checkpoint ckpt = load_checkpoint(options_.resume);
    RATION_CHECK(ckpt.step < total_steps_, "checkpoint ", ckpt.path, " is at step ", ckpt.step, " but this run has ",
                 total_steps_, " steps in all, so there is nothing to train; hint: pass --steps greater than ",
                 ckpt.step, " (the total, not the number of further steps)");
    restore_weights(ckpt, params_, model_.named_buffers());
    if (ckpt.metadata.ints.count("external_state_step"))  // parameter-server shards of the same step
      model_.restore_external_state(std::filesystem::path(ckpt.path).parent_path().string(),
                                    ckpt.metadata.ints.at("external_state_step"));
    optimizer_->import_state(dist::without_hook_state(ckpt.optimizer));
    resumed_hook_state_ = ckpt.optimizer;
    loader_.set_position({ckpt.metadata.ints.at("epoch"), ckpt.metadata.ints.at("loader_index")});
    step_ = ckpt.step;
    progress_.note("resumed from " + ckpt.path + " at step " + std::to_string(step_));
    const auto planned = ckpt.metadata.ints.find("total_steps");
    if (planned != ckpt.metadata.ints.end() && planned->second != total_steps_) {
      notes_.push_back("the saved run was planned for " + std::to_string(planned->second) + " steps, this one for " +
                       std::to_string(total_steps_) + ": the learning-rate schedule changes from step " +
                       std::to_string(step_) + " on (warm-up " +
                       std::to_string(std::min(run_.warmup_steps, total_steps_)) +
                       " steps, decay to optim.min_lr at step " + std::to_string(total_steps_) + ")");
      progress_.note("note: " + notes_.back().get<std::string>());
    }
  }

  // The checkpoint directory is locked, and checked writable and free of another run's later steps,
  // before the first step (not after the last).
  void prepare_checkpoint_dir() {
    if (run_.checkpoint_dir.empty()) return;
    checkpoint_lock_.emplace(run_.checkpoint_dir);
    check_run_may_write(run_.checkpoint_dir, step_, fingerprint_);
  }

  // With a budget: profile one step on the first batch (no update) and plan; the plan runs from the
  // first step on.
  void plan_memory() {
    const BudgetSettings& budget = runtime_.settings().budget;
    if (!budget.budget_bytes) return;
    const data::LoaderPosition here = loader_.position();
    const data::Batch first = loader_.next();
    loader_.set_position(here);
    // Data parallel: the gradient buckets, (onebit with error feedback) the residuals and (onebit in the
    // update space) the frozen denominators, one float each per parameter element, are fixed memory the
    // plan must leave room for.
    int64_t dist_bytes = 0;
    if (synchronizes()) {
      const bool residual = keys_.dp.compress == "onebit" && keys_.dp.onebit.feedback == dist::ErrorFeedback::On;
      const bool denominator = keys_.dp.compress == "onebit" && keys_.dp.onebit.space == dist::CodeSpace::Update;
      dist_bytes = (1 + (residual ? 1 : 0) + (denominator ? 1 : 0)) * 4 * model_.num_parameters();
    }
    const memory::Plan* plan = runtime_.prepare(
        model_, first, setup_.seed,
        unseen_optimizer_bytes(run_.optimizer, run_.momentum, run_.amsgrad, model_) + dist_bytes);
    corrector_.emplace(runtime_, *budget.budget_bytes);
    progress_.note(plan->to_table());
  }

  void train_one_step() {
    const double lr = schedule_->apply(*optimizer_, step_);
    const StepStats st = reducer_ ? synchronized_step() : local_step();
    if (corrector_) {
      const std::string note = corrector_->after_step(step_, st.peak_bytes);
      if (!note.empty()) progress_.note(note);
    }
    RATION_CHECK(std::isfinite(st.loss), "loss became ", st.loss, " at step ", step_,
                 "; lower optim.lr or set optim.clip_grad_norm");
    record_.add(st, step_items_, runtime_.mode() == MemoryMode::Plan);
    show_progress(st, lr);
  }

  StepOptions step_options(uint64_t micro) const {
    StepOptions o;
    o.step = step_;
    // Dropout masks are a function of (seed, step[, rank, micro-batch]), so a resumed run draws exactly
    // what it would have.
    o.seed = setup_.seed * kSeedSpread + static_cast<uint64_t>(step_) +
             static_cast<uint64_t>(world_.rank()) * 0x632BE59BD9B4E019ULL + micro * 0xD6E8FEB86659FD93ULL;
    o.optimizer = optimizer_.get();
    o.clip_grad_norm = run_.clip_grad_norm;
    o.pieces = tbptt_.get();
    return o;
  }

  StepStats local_step() {
    data::Batch batch = next_batch();  // workspace: batches are device memory, the dataset is not
    step_items_ = batch.items;
    // A model that prefetches (ctr: the next batch's parameter-server rows) gets the next batch now, to
    // fetch for while this step runs.
    if (model_.prefetches() && step_ + 1 < total_steps_) {
      lookahead_from_ = loader_.position();
      lookahead_ = loader_.next();
      model_.prefetch(*lookahead_);
    }
    return runtime_.measure_step(model_, batch, step_options(0));
  }

  data::Batch next_batch() {
    if (!lookahead_) return loader_.next();
    data::Batch b = std::move(*lookahead_);
    lookahead_.reset();
    return b;
  }

  // Where the data stands for a checkpoint: a batch taken early is not trained yet.
  data::LoaderPosition trained_position() const { return lookahead_ ? lookahead_from_ : loader_.position(); }

  // sync_every micro-batches of this rank's shard; each backward weighted by its share of the step's
  // samples over every rank (known before the first from the shard arithmetic); the last one's backward
  // launches the buckets and the runtime's before_optimizer hook waits for them.
  StepStats synchronized_step() {
    const auto t0 = Clock::now();
    // Test aid (dist.debug_delay_ms): this rank computes slowly, so its gradient comes late.
    if (keys_.dp.debug_delay_ms > 0 && world_.rank() == keys_.dp.debug_delay_rank)
      std::this_thread::sleep_for(std::chrono::milliseconds(keys_.dp.debug_delay_ms));
    const auto micro_batches = static_cast<size_t>(keys_.dp.reducer.sync_every);
    std::vector<std::vector<int64_t>> micro(micro_batches);
    int64_t step_samples = 0;
    for (auto& m : micro) {
      m = loader_.next_indices();
      step_samples += loader_.last_global_items();
    }
    StepStats st;
    double ms = 0, loss_sum = 0;
    int64_t samples = 0, items = 0;
    for (size_t k = 0; k < micro.size(); ++k) {
      const double weight = static_cast<double>(micro[k].size()) / static_cast<double>(step_samples);
      StepOptions o = step_options(k);
      const bool last = k + 1 == micro.size();
      if (!last || loose()) o.optimizer = nullptr;  // accumulate (or the server steps): the reducer holds them
      if (micro[k].empty()) {  // a short last batch left this rank nothing: it contributes zeros
        reducer_->prepare_backward(0);
        if (last && !loose()) finish_without_batch();
        continue;
      }
      const data::Batch batch = setup_.train_set->get(micro[k]);  // workspace: device memory
      reducer_hook_->set_weight(weight);
      st = runtime_.measure_step(model_, batch, o);
      ms += st.ms;
      loss_sum += st.loss * static_cast<double>(micro[k].size());
      samples += static_cast<int64_t>(micro[k].size());
      items += batch.items;
    }
    if (loose()) return exchange_with_server(st, t0, loss_sum, samples, items, step_samples);
    // The step's loss: the mean over every rank's samples. The same message carries each rank's stop
    // request (SIGINT / SIGTERM seen so far), so every rank stops after the same step.
    const int signal = InterruptScope::requested();
    const std::vector<double> sums = dist::all_reduce_doubles(
        world_, {loss_sum, static_cast<double>(samples), static_cast<double>(items), signal == SIGINT ? 1.0 : 0.0,
                 signal != 0 && signal != SIGINT ? 1.0 : 0.0});
    agreed_stop_ = sums[3] > 0 ? SIGINT : sums[4] > 0 ? SIGTERM : 0;
    st.loss = sums[0] / std::max(sums[1], 1.0);
    st.ms = ms;
    step_items_ = static_cast<int64_t>(sums[2]);
    return st;
  }

  // Partial / asynchronous aggregation: push this rank's weighted gradient, take the global parameters
  // back. No collective: the step's loss is the mean over the pushes the server's last update aggregated,
  // and a stop request travels in the push (every rank stops at its next reply). With backup workers a
  // late rank adopts the server's version as its step and skips the data of the steps it missed.
  StepStats exchange_with_server(StepStats st, Clock::time_point t0, double loss_sum, int64_t samples, int64_t items,
                                 int64_t step_samples) {
    reducer_->finalize();
    const double share = static_cast<double>(samples) / static_cast<double>(std::max<int64_t>(step_samples, 1));
    const dist::Reply reply = ps_->exchange(step_, share, loss_sum, static_cast<double>(samples),
                                            InterruptScope::requested());
    agreed_stop_ = reply.stop_signal;
    if (keys_.dp.ps.mode == dist::PsAggregation::BackupWorkers && reply.version > step_ + 1) {
      for (int64_t skipped = step_ + 1; skipped < reply.version; ++skipped)
        for (int64_t k = 0; k < keys_.dp.reducer.sync_every; ++k) (void)loader_.next_indices();
      step_ = reply.version - 1;  // the loop's ++step_ makes it the server's version
    }
    st.loss = reply.loss;
    st.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    step_items_ = items;  // this rank's (there is no per-step sum over ranks)
    return st;
  }

  // The synchronising micro-batch of a rank without data: join the reduction, then the same update.
  void finish_without_batch() {
    reducer_->finalize();
    if (run_.clip_grad_norm > 0) optim::clip_grad_norm(params_, run_.clip_grad_norm);
    optimizer_->step();
    optimizer_->zero_grad();
    reducer_->after_optimizer_step();
  }

  void show_progress(const StepStats& st, double lr) {
    const double eta = static_cast<double>(total_steps_ - step_ - 1) *
                       (record_.seconds / static_cast<double>(step_ - first_step_ + 1));
    const std::string gnorm =
        run_.clip_grad_norm > 0 ? std::string(" | gnorm ") + std::to_string(st.grad_norm).substr(0, 6) : "";
    char line[320];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | loss %.4f | %.0f %s | mem %s (step peak %s) | lr %.2e%s | eta %s",
                  static_cast<long long>(step_ + 1), static_cast<long long>(total_steps_), st.loss,
                  record_.items_per_second(), is_lm() ? "tok/s" : is_ctr() ? "samples/s" : "img/s",
                  memory::format_bytes(memory::device_current_bytes(st.memory)).c_str(),
                  memory::format_bytes(st.peak_bytes).c_str(), lr, gnorm.c_str(), format_duration(eta).c_str());
    progress_.update(step_ + 1, line, step_ + 1 == total_steps_);
  }

  // Evaluation (train.eval_every, or each epoch's end for classifiers) and periodic checkpoints.
  void after_step_duties() {
    // A multiple of `every` reached since the iteration began (a late backup worker may skip steps).
    const int64_t done = step_ + 1, before = step_begin_;
    auto crossed = [&](int64_t every) { return every > 0 && done / every > before / every; };
    const bool epoch_end = !is_lm() && crossed(per_epoch_);
    if (crossed(run_.eval_every) || (run_.eval_every == 0 && epoch_end)) evaluate_now(done);
    if (crossed(run_.checkpoint_every) && done < total_steps_) {
      const std::string path = save(done);
      if (!path.empty()) progress_.note("checkpoint " + path);
    }
  }

  void evaluate_now(int64_t at_step) {
    const auto t0 = Clock::now();
    // Partial / asynchronous aggregation: rank 0 evaluates the whole set alone (no rank waits for another).
    if (loose() && world_.rank() != 0) return;
    // Buffers (batch-norm running statistics) are each rank's own: evaluate rank 0's everywhere.
    if (!loose()) dist::broadcast_from_rank0(world_, {}, model_.named_buffers());
    const EvalResult r = evaluate(model_, setup_.eval_set, setup_.batch_size, run_.eval_batches,
                                  loose() ? dist::World::init_single() : world_);
    nlohmann::json e = {{"step", at_step}, {"loss", r.loss}, {"items", r.count}, {"seconds", seconds_since(t0)}};
    char line[256];
    if (is_lm()) {
      e["bits_per_byte"] = r.loss / std::log(2.0);
      e["unigram_entropy_bits"] = setup_.unigram_entropy_nats / std::log(2.0);
      std::snprintf(line, sizeof line, "eval @%lld: loss %.4f nats/byte = %.3f bits/byte (unigram entropy %.3f bits)",
                    static_cast<long long>(at_step), r.loss, r.loss / std::log(2.0),
                    setup_.unigram_entropy_nats / std::log(2.0));
    } else if (r.auc) {
      e["auc"] = *r.auc;
      e["logloss"] = r.loss;
      if (setup_.planted_auc) e["planted_auc"] = *setup_.planted_auc;
      std::snprintf(line, sizeof line, "eval @%lld: auc %.4f, logloss %.4f (%lld samples)%s",
                    static_cast<long long>(at_step), *r.auc, r.loss, static_cast<long long>(r.count),
                    setup_.planted_auc
                        ? (" | planted model auc " + std::to_string(*setup_.planted_auc).substr(0, 6)).c_str()
                        : "");
    } else {
      e["accuracy"] = r.accuracy;
      std::snprintf(line, sizeof line, "eval @%lld: loss %.4f, accuracy %.2f%% (%lld images)",
                    static_cast<long long>(at_step), r.loss, 100 * r.accuracy, static_cast<long long>(r.count));
    }
    progress_.note(line);
    evals_.push_back(e);
  }

  std::string save(int64_t at_step) {
    // Every rank's error-feedback residuals travel to rank 0 (a collective: every rank calls save).
    const NamedTensors residuals =
        reducer_ && !loose() ? dist::gather_hook_state(world_, reducer_->hook()) : NamedTensors{};
    if (run_.checkpoint_dir.empty() || world_.rank() != 0) return std::string();
    Metadata meta;
    meta.ints["epoch"] = trained_position().epoch;
    meta.ints["loader_index"] = trained_position().index;
    meta.ints["seed"] = static_cast<int64_t>(setup_.seed);
    meta.ints["total_steps"] = total_steps_;
    meta.ints["world_size"] = world_.size();
    meta.ints["global_batch"] = setup_.batch_size * world_.size();
    model_.save_external_state(run_.checkpoint_dir, at_step);  // parameter-server snapshot of these weights
    meta.ints["external_state_step"] = at_step;
    NamedTensors weights, state;
    if (loose()) {
      ps_->snapshot(weights, state);  // the server's global model and optimiser, not rank 0's working copy
    } else {
      for (auto& [n, p] : params_) weights.emplace_back(n, p.tensor());
      state = optimizer_->export_state();
    }
    for (auto& [n, b] : model_.named_buffers()) weights.emplace_back(n, b);
    state.insert(state.end(), residuals.begin(), residuals.end());
    return save_checkpoint(run_.checkpoint_dir, at_step, weights, state, meta,
                           static_cast<int>(run_.keep_checkpoints), fingerprint_);
  }

  nlohmann::json memory_report() {
    const memory::Stats peak_stats = memory::stats();
    const int64_t worst = record_.worst_peak();
    nlohmann::json mem = memory_json(peak_stats);
    mem["peak_bytes"] = worst;  // max over steps of each step's measured device peak (dataset excluded)
    mem["dataset_host_bytes"] = peak_stats.current[static_cast<int>(memory::Category::Data)];
    if (const at::Device device = model_.parameter_options().device(); device.is_cuda()) {
      // Each step's peak came from the CUDA caching allocator; the categories and allocations stay the
      // counting allocator's view of host memory.
      mem["measured_by"] = "CUDA caching allocator (peak_bytes); counting ATen CPU allocator (host breakdown)";
      mem["device"] = device.str();
    }
    if (const memory::Plan* plan = runtime_.current_plan()) {
      mem["budget_bytes"] = plan->budget_bytes;
      mem["predicted_peak_bytes"] = plan->prediction.peak_bytes;
      mem["activation_capacity_bytes"] = plan->capacity_bytes;
      mem["fixed_bytes"] = plan->fixed_bytes;
      mem["within_budget"] = worst <= plan->budget_bytes;
      mem["replans"] = corrector_ ? corrector_->replans() : 0;
      mem["prediction_error"] =
          static_cast<double>(plan->prediction.peak_bytes - worst) / static_cast<double>(std::max<int64_t>(worst, 1));
      if (worst > plan->budget_bytes)
        progress_.note("warning: measured peak " + memory::format_bytes(worst) + " exceeded the budget " +
                       memory::format_bytes(plan->budget_bytes));
    }
    return mem;
  }

  nlohmann::json time_report() const {
    // The first step allocates optimiser state and warms caches: leave it out of the median when possible.
    const std::vector<double>& ms = record_.step_ms;
    const std::vector<double> steady(ms.begin() + (ms.size() > 1 ? 1 : 0), ms.end());
    nlohmann::json t = {{"step_ms_median", median(steady)},
                        {"train_seconds", record_.seconds},
                        {"wall_seconds", seconds_since(t_start_)},
                        {"items_per_second", record_.items_per_second()}};
    if (runtime_.current_plan()) {
      double total = 0;
      for (double r : record_.recompute_ms) total += r;
      t["recompute_ms"] = median(record_.recompute_ms);
      t["recompute_ms_total"] = total;
    }
    return t;
  }

  nlohmann::json offload_report() {
    const memory::OffloadOptions& o = runtime_.settings().offload.options;
    auto limit = [](int64_t t) { return t == memory::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(t); };
    return {{"mode", runtime_.current_plan() ? "plan" : "thresholds"},
            {"tier", runtime_.engine()->tier().name()},
            {"t1", o.t1},
            {"t2", limit(o.t2)},
            {"t3", limit(o.t3)},
            {"min_bytes", o.min_bytes},
            {"prefetch", o.prefetch},
            {"steps", total_steps_ - first_step_},
            {"totals", offload_stats_json(runtime_.engine()->stats())}};
  }

  nlohmann::json build_report(const std::string& final_ckpt) {
    const memory::Plan* plan = runtime_.current_plan();
    nlohmann::json report = {
        {"config", options_.config_path},
        {"model", model_.family()},
        {"parameters", model_.num_parameters()},
        {"steps", total_steps_},
        {"first_step", first_step_},
        {"last_step", step_},
        {"interrupted", stop_signal_ != 0},
        {"notes", notes_},
        {"loss", record_.losses},
        {"eval", evals_},
        {"memory", memory_report()},
        {"time", time_report()},
        {"checkpoint", final_ckpt},
        {"plan", plan ? memory::to_json(*plan) : nlohmann::json(nullptr)},
        {"effective_config", setup_.config.effective()},
    };
    if (runtime_.engine()) report["offload"] = offload_report();
    if (auto metrics = model_.report_metrics(); !metrics.empty()) {
      nlohmann::json ps = nlohmann::json::object();
      for (const auto& [k, v] : metrics) ps[k] = v;
      report["ps"] = ps;
    }
    if (stop_signal_ != 0) {
      report["interrupted_by"] = InterruptScope::name(stop_signal_);
      report["exit_status"] = InterruptScope::exit_status(stop_signal_);
    }
    report["dist"] = dist_report();
    if (reducer_) report["memory"]["dist_bucket_bytes"] = reducer_->bucket_bytes();
    return report;
  }

  nlohmann::json dist_report() const {
    nlohmann::json d = {{"world_size", world_.size()}, {"rank", world_.rank()}};
    if (!reducer_) return d;
    const dist::ReducerStats& st = reducer_->stats();
    const double syncs = static_cast<double>(std::max<int64_t>(st.synchronizations, 1));
    nlohmann::json buckets = nlohmann::json::array();
    for (const auto& b : reducer_->buckets()) buckets.push_back(b.numel * 4);
    d.update({{"backend", dist::to_string(world_.backend())},
              {"topology", dist::to_string(keys_.dp.reducer.topology)},
              {"compress", reducer_->hook().name()},
              {"error_feedback", keys_.dp.onebit.feedback == dist::ErrorFeedback::On},
              {"sync_every", keys_.dp.reducer.sync_every},
              {"sampling", keys_.sampling == data::Sampling::Bootstrap ? "bootstrap" : "shuffle"},
              {"bucket_bytes", buckets},
              {"synchronizations", st.synchronizations},
              {"bytes_sent_per_step", static_cast<double>(st.traffic.payload_bytes) / syncs},
              {"wire_bytes_per_step", static_cast<double>(st.traffic.wire_bytes) / syncs},
              {"comm_ms", st.comm_ms / syncs},
              {"exposed_comm_ms", st.exposed_ms / syncs},
              {"parameter_exchange_ms", st.exchange_ms / syncs},
              {"overlap", st.overlap()},
              {"error_feedback_bytes", reducer_->hook_state_bytes()}});
    // onebit: the smallest lambda_j of the last step's code per bucket; the error bound is
    // sqrt(1 - lambda^2) ||v|| (docs/DISTRIBUTED.md).
    // Bytes per compressed step apart from the fp32 warm-up (dist.compress_warmup), whose steps the
    // whole-run average bytes_sent_per_step includes.
    if (const auto* onebit = dynamic_cast<const dist::OneBitHook*>(&reducer_->hook())) {
      d["onebit_lambda"] = onebit->last_lambda();
      const dist::OneBitHook::Counts& c = onebit->counts();
      d["onebit"] = {{"warmup_steps", c.warmup_windows},
                     {"compressed_steps", c.compressed_windows},
                     {"bytes_sent_per_compressed_step",
                      c.compressed_windows ? static_cast<double>(c.compressed.payload_bytes) / c.compressed_windows : 0.0},
                     {"second_moment", keys_.dp.onebit.second_moment == dist::SecondMoment::Freeze ? "freeze" : "track"},
                     {"space", keys_.dp.onebit.space == dist::CodeSpace::Update ? "update" : "gradient"},
                     {"residual_bytes", onebit->residual_bytes()},
                     {"denominator_bytes", onebit->state_bytes() - onebit->residual_bytes()}};
    }
    if (keys_.dp.reducer.aggregate == dist::Aggregate::Parameters)
      d.update({{"aggregate", "parameters"}, {"average_every", keys_.dp.reducer.average_every}, {"averages", st.averages}});
    if (ps_) d.update(ps_->report());
    return d;
  }

  // `checkpoint_error`: the final save's failure, named too if the report cannot be written either.
  void write_report(const nlohmann::json& report, const std::string& checkpoint_error) {
    if (options_.report_path.empty() || world_.rank() != 0) return;
    const std::filesystem::path p(options_.report_path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    const std::string tmp = options_.report_path + ".tmp";
    bool written = false;
    {
      std::ofstream out(tmp);
      out << report.dump(2) << "\n";
      out.flush();
      written = out.good();
    }
    if (!written) std::filesystem::remove(tmp);
    RATION_CHECK(written, "cannot write report '", options_.report_path, "'; hint: is its directory writable, the disk ",
                 "full?", checkpoint_error.empty() ? "" : " (the final checkpoint failed too: " + checkpoint_error + ")");
    std::filesystem::rename(tmp, options_.report_path);
    progress_.note("report " + options_.report_path);
  }

  const Clock::time_point t_start_ = Clock::now();
  const TrainOptions& options_;
  Setup setup_;
  models::Model& model_;
  optim::NamedParams params_;
  RunSettings run_;
  DataParallelKeys keys_;
  StepRuntime runtime_;
  std::unique_ptr<seq::ChunkedLoss> tbptt_;  // train.tbptt: the steps' chunks
  dist::World world_;
  data::Loader loader_;
  std::optional<data::Batch> lookahead_;  // the next step's batch, taken early for Model::prefetch
  data::LoaderPosition lookahead_from_;   // the loader's position before it
  Progress progress_;
  std::unique_ptr<dist::Liveness> liveness_;
  std::unique_ptr<dist::Reducer> reducer_;
  std::unique_ptr<ReducerHook> reducer_hook_;
  std::unique_ptr<OpProfile> op_profile_;  // --profile-ops
  int agreed_stop_ = 0;  // data parallel: the stop signal every rank agreed on after the last step (0: go on)
  NamedTensors resumed_hook_state_;  // the resumed checkpoint's entries, until the reducer takes its own
  int64_t step_items_ = 0;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::WarmupCosine> schedule_;
  std::optional<BudgetCorrector> corrector_;
  std::unique_ptr<PsExchange> ps_;  // dist.backup_workers / dist.sync = "async" (after optimizer_, schedule_)
  int64_t step_begin_ = 0;          // step_ when the current iteration began
  int64_t per_epoch_ = 0, total_steps_ = 0, step_ = 0, first_step_ = 0;
  std::string fingerprint_;                            // this run's identity in its checkpoints
  std::optional<CheckpointDirLock> checkpoint_lock_;  // held from before the first step to the end
  int stop_signal_ = 0;                               // SIGINT/SIGTERM that stopped the run, or 0
  nlohmann::json notes_ = nlohmann::json::array();   // things the user should know, also in the report
  StepRecord record_;
  nlohmann::json evals_ = nlohmann::json::array();
};

}  // namespace

nlohmann::json run_training(const TrainOptions& options) { return TrainingRun(options).run_as_rank(); }

}  // namespace ration::train
