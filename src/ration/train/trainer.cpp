#include "ration/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ration/base/allocator.h"
#include "ration/base/blas.h"
#include "ration/base/openmp.h"
#include "ration/base/paths.h"
#include "ration/base/check.h"
#include "ration/base/timing.h"
#include "ration/core/node.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/distributed/data_parallel.h"
#include "ration/distributed/liveness.h"
#include "ration/optim/schedule.h"
#include "ration/plan/report.h"
#include "ration/runtime/step_runtime.h"
#include "ration/streaming/tbptt.h"
#include "ration/torchscript/op_report.h"
#include "ration/train/checkpoint.h"
#include "ration/train/checkpoint_shards.h"
#include "ration/train/data_parallel_step.h"
#include "ration/train/evaluation.h"
#include "ration/train/model_parallel_step.h"
#include "ration/train/op_profile.h"
#include "ration/train/progress.h"
#include "ration/train/signals.h"

namespace ration::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return ms_since(t0) / 1000.0; }

// Which BLAS kernels ran (base/blas.h): OpenBLAS's core and threads, who chose them.
nlohmann::json blas_report() {
  nlohmann::json b = {{"core", blas::core()}, {"threads", blas::threads()}, {"chosen_by", blas::chosen_by()}};
  if (const char* library = std::getenv("RATION_BLAS_SELECTED")) b["library_choice"] = library;
  return b;
}

// How ATen's OpenMP threads wait between parallel regions (base/openmp.h): the setting and who chose it.
nlohmann::json openmp_report() {
  return {{"spin", openmp::spin_setting()}, {"chosen_by", openmp::spin_chosen_by()}};
}

// Keys that do not change the weights a run computes: a run differing only in these is the same run
// (checkpoints it writes at a step hold the same weights). Budgets and offload are bitwise-neutral.
const std::vector<std::string> kWeightNeutralKeys = {
    "train.checkpoint_dir", "train.checkpoint_every", "train.keep_checkpoints", "train.log_every",
    "train.eval_every", "train.eval_batches", "train.steps", "train.epochs", "train.malloc_keep_freed", "memory.",
    "offload."};

}  // namespace

namespace {

// What the steps measured, summed up for the report.
struct StepRecord {
  nlohmann::json losses = nlohmann::json::array();
  std::vector<double> step_ms, recompute_ms;
  std::vector<double> loop_ms;  // each iteration of the loop: batch, step, progress, evaluation, checkpoint
  std::vector<int64_t> peaks, peaks_above;
  int64_t items = 0;
  double seconds = 0;

  void add(const StepStats& st, int64_t items_in_batch, bool planned) {
    step_ms.push_back(st.ms);
    peaks.push_back(st.peak_bytes);
    peaks_above.push_back(st.peak_above_baseline());
    if (planned) recompute_ms.push_back(st.recompute_ms);
    seconds += st.ms / 1000.0;
    items += items_in_batch;
    losses.push_back(st.loss);
  }
  double items_per_second() const { return static_cast<double>(items) / std::max(seconds, 1e-9); }
  int64_t worst_peak() const { return peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end()); }
  int64_t worst_peak_above() const {
    return peaks_above.empty() ? 0 : *std::max_element(peaks_above.begin(), peaks_above.end());
  }
};

// A step's dropout seed is train.seed * kSeedSpread + step: 2^64 divided by the golden ratio (odd), so
// runs with nearby train.seed values draw from far-apart seeds instead of sharing most of their steps'.
constexpr uint64_t kSeedSpread = 0x9E3779B97F4A7C15ULL;

// One run of `ration train`: built from the options, then steps, evaluations, checkpoints, report.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& options)
      : options_(options), setup_(build_setup(load_config(options.config_path, options.overrides))),
        model_(*setup_.model), params_(model_.named_parameters()), run_(read_run_settings(setup_.config)),
        keys_(read_data_parallel_keys(setup_.config)), parallel_(dist::read_parallel_settings(setup_.config)),
        runtime_(read_memory_settings(setup_.config)), roles_(job_roles()), world_(roles_.workers),
        loader_(setup_.train_set, shard_options()), progress_(options.json || roles_.everyone.rank() != 0, run_.log_every) {
    Config& c = setup_.config;
    if (roles_.everyone.size() > 1) liveness_ = std::make_unique<dist::Liveness>(roles_.everyone);
    RATION_CHECK(!keys_.members || setup_.task.kind == Task::Kind::Classification, c.origin(),
                 ": dist.aggregate = \"ensemble\" combines the members' class predictions; it needs a classification "
                 "model (mlp, cnn), got model.type = \"", model_.family(), "\"");
    const std::string refusal =
        world_.size() > 1 && !parallel_.feature_split ? model_.data_parallel_refusal() : std::string();
    RATION_CHECK(refusal.empty(), c.origin(), ": ", world_.size(), " ranks: ", refusal);
    resume_path_ = options.resume;
    if (parallel_.model_parallel()) split_model();
    optimizer_ = build_optimizer(run_, params_);
    dist::JobRoles sync_roles = roles_;
    if (mp_) {  // the model-parallel step exchanges the replicas' gradients itself
      sync_roles.workers = dist::World::init_single();
      sync_roles.workers_count = 1;
    }
    sync_ = std::make_unique<DataParallelStep>(sync_roles, keys_, params_, *optimizer_, run_, setup_.seed, c.origin());
    per_epoch_ = (loader_.batches_per_epoch() + keys_.dp.reducer.sync_every - 1) / keys_.dp.reducer.sync_every;
    RATION_CHECK(per_epoch_ > 0, c.origin(), ": train.batch_size ", setup_.batch_size,
                 " is larger than the training set (", setup_.train_set->size(), " items)");
    const int64_t epochs = options.epochs.value_or(run_.epochs);
    total_steps_ = options.steps ? *options.steps : (run_.steps > 0 ? run_.steps : epochs * per_epoch_);
    schedule_ = std::make_unique<optim::WarmupCosine>(run_.lr, run_.schedule == "constant" ? run_.lr : run_.min_lr,
                                                      std::min(run_.warmup_steps, total_steps_), total_steps_);
    fingerprint_ = c.fingerprint(kWeightNeutralKeys) + "-" + std::to_string(total_steps_);
    RATION_CHECK(run_.optimizer != "es" || (!runtime_.settings().budget.has_budget() && run_.tbptt == 0 &&
                                             setup_.task.kind != Task::Kind::ClickThrough),
                 c.origin(), ": optim.name = \"es\" trains on forward passes only: a memory budget (nothing to plan "
                 "without backward), train.tbptt and the ctr model (its rows are pushed after backward) do not "
                 "combine with it");
    if (run_.tbptt > 0) {  // each step: one sequence batch, run chunk by chunk (streaming/tbptt.h)
      seq::check_tbptt(model_, run_.tbptt, c.origin());
      RATION_CHECK(!runtime_.settings().budget.has_budget(), c.origin(), ": train.tbptt and a memory budget do ",
                   "not combine yet (the plan is made for the full-sequence step); remove one of them");
      tbptt_ = std::make_unique<seq::ChunkedLoss>(model_, run_.tbptt);
    }
  }

  // run() with the data-parallel failure rules: a failed collective names the lost rank (every survivor
  // watches the heartbeats for the same window); any other error is left as this rank's note.
  nlohmann::json run_as_rank() {
    try {
      dist::check_same_config(roles_.everyone, setup_.config.effective(), setup_.config.origin());
      nlohmann::json report = run();
      roles_.everyone.barrier();  // leave together: rank 0 serves the store the others still use
      return report;
    } catch (const dist::CollectiveError& e) {
      const auto window = std::chrono::milliseconds(std::min<int64_t>(3000, keys_.dp.timeout_s * 1000 / 3));
      const std::string diagnosis = liveness_ ? liveness_->diagnose(window, std::chrono::seconds(keys_.dp.timeout_s))
                                              : std::string("one process");
      const int workers = roles_.workers_count, size = roles_.everyone.size();
      const std::string servers = keys_.dp.servers == 0 ? std::string() : detail::str(" (ranks ", workers, "-", size - 1,
                                                                                 " are the parameter servers)");
      throw Error(detail::str("rank ", roles_.everyone.rank(), " of ", size, ": ", diagnosis, servers,
                              mp_ ? "; stopping (resume from the last checkpoint with --resume and the same "
                                    "[parallel] layout). The failed collective: "
                                  : "; stopping (resume from the last checkpoint with --resume, with any number of "
                                    "ranks). The failed collective: ",
                              e.what()));
    } catch (const std::exception& e) {
      if (liveness_) liveness_->leaving(e.what());
      throw;
    }
  }

 private:
  nlohmann::json run() {
    resume();
    // A rank with other steps or another resumed step would call a different number of collectives.
    dist::check_same_numbers(roles_.everyone, {{"total number of steps (--steps, --epochs, train.steps, train.epochs)", total_steps_},
                                      {"first step (--resume)", step_}},
                             setup_.config.origin());
    // Only rank 0 writes checkpoints, so only rank 0 locks and checks the directory; with a split model
    // each shard's writer (replica 0) its shard's folder.
    if (mp_ ? world_.rank() == 0 : roles_.everyone.rank() == 0) prepare_checkpoint_dir();
    if (roles_.everyone.rank() == 0) check_report_path();
    if (!blas::core().empty())
      progress_.note(detail::str("BLAS: OpenBLAS '", blas::core(), "' kernels, ", blas::threads(), " threads (chosen by ",
                                 blas::chosen_by(), ")"));
    if (!openmp::spin_setting().empty())
      progress_.note(detail::str("OpenMP: spin-wait ", openmp::spin_setting(), " (chosen by ", openmp::spin_chosen_by(), ")"));
    // SIGINT/SIGTERM from here on: the current step finishes, then a checkpoint and the report.
    const InterruptScope interrupt;
    // Data parallel: every rank starts from rank 0's parameters (fresh or resumed).
    dist::broadcast_from_rank0(mp_ ? world_ : roles_.everyone, params_, model_.named_buffers());
    if (roles_.server >= 0) return sync_->serve(*schedule_, step_, resumed_hook_state_);  // a dedicated server
    model_.train();
    memory::reset_peak();
    first_step_ = step_;
    plan_memory();
    // After the profiling step, whose backward must not reach the reducer.
    const std::string note = sync_->attach(runtime_, *schedule_, step_, resumed_hook_state_);
    if (!note.empty()) progress_.note(note);
    resumed_hook_state_.clear();
    if (options_.observer) options_.observer->before_steps(runtime_, first_step_, total_steps_);
    if (options_.profile_ops > 0) {
      op_profile_ = std::make_unique<OpProfile>(1, options_.profile_ops);
      runtime_.add_hook(op_profile_.get());
    }
    try {
      for (; step_ < total_steps_; ++step_) {
        const auto iteration_start = Clock::now();
        step_begin_ = step_;
        train_one_step();
        after_step_duties();
        record_.loop_ms.push_back(ms_since(iteration_start));
        if ((stop_signal_ = mp_ ? agreed_stop() : sync_->active() ? sync_->agreed_stop() : InterruptScope::requested()) != 0) {
          ++step_;  // this step is done
          break;
        }
      }
    } catch (const std::exception& e) {
      write_failure_report(e.what());  // e.g. a periodic checkpoint on a full disk: what was trained is not lost
      throw;
    }
    sync_->finish();  // the server's final model, or one averaged model
    if (mp_) mp_->gather_memory(record_.worst_peak(), runtime_.current_plan());
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

  // The job's processes by role: data-parallel workers (and dedicated servers), or with [parallel] model
  // parallelism the layout's process groups, built once (the workers' group is the data-parallel one).
  dist::JobRoles job_roles() {
    const dist::World w = checked_world();
    const std::string& origin = setup_.config.origin();
    if (!parallel_.model_parallel()) return dist::split_roles(w, keys_.dp.servers, origin);
    check_model_parallel_keys();
    groups_ = dist::build_groups(w, dist::make_layout(parallel_, w.size(), w.rank(), origin));
    dist::JobRoles roles;
    roles.everyone = w;
    roles.workers = groups_.data;
    roles.workers_count = groups_.layout.data;
    return roles;
  }

  // What model parallelism does not combine with, named before any process starts training.
  void check_model_parallel_keys() const {
    const std::string& origin = setup_.config.origin();
    const dist::DataParallelSettings& dp = keys_.dp;
    RATION_CHECK(dp.servers == 0 && dp.topology == dist::Topology::AllReduce && dp.compress == "none" &&
                     dp.aggregate == dist::Aggregate::Gradients && dp.reducer.sync_every == 1 && !keys_.members,
                 origin, ": [parallel] model parallelism averages the replicas' gradients with one all-reduce; it does ",
                 "not combine with dist.servers, dist.topology other than \"allreduce\", dist.compress, ",
                 "dist.aggregate or dist.sync_every > 1 (use parallel.micro_batches for micro-batches)");
    RATION_CHECK(run_.optimizer == "adamw" || run_.optimizer == "sgd", origin, ": [parallel] model parallelism ",
                 "trains with optim.name = \"adamw\" or \"sgd\"; got \"", run_.optimizer, "\"");
    RATION_CHECK(run_.tbptt == 0, origin, ": [parallel] model parallelism and train.tbptt do not combine");
    RATION_CHECK(parallel_.pipeline == 1 || setup_.batch_size % parallel_.micro_batches == 0, origin,
                 ": train.batch_size = ", setup_.batch_size, " does not split into parallel.micro_batches = ",
                 parallel_.micro_batches, " equal micro-batches; hint: make the batch a multiple of it");
  }

  // Split the model as [parallel] says (its shards, its stage), from the first batch; from here on
  // params_ are the parameters this process holds.
  void split_model() {
    const data::LoaderPosition here = loader_.position();
    const data::Batch first = loader_.next();
    loader_.set_position(here);
    // Every parameter's split dimension, read before the split releases other stages' weights.
    ShardManifest manifest{model_.family(), static_cast<int>(parallel_.tensor), static_cast<int>(parallel_.pipeline), {}, {}, {}, {}};
    for (auto& [name, p] : model_.named_parameters())
      if (const int64_t dim = model_.tensor_split_dim(name); dim >= 0) {
        manifest.split_dims[name] = dim;
        if (const int64_t parts = model_.tensor_split_parts(name); parts > 1) manifest.split_parts[name] = parts;
      }
    const bool sharded = manifest.tensor > 1 || manifest.pipeline > 1;
    std::vector<int64_t> saved_split;
    if (sharded && !resume_path_.empty()) {
      const ShardManifest saved = read_shard_manifest(resume_path_);
      RATION_CHECK(saved.tensor == manifest.tensor && saved.pipeline == manifest.pipeline && saved.model == manifest.model,
                   "--resume ", resume_path_, ": saved by a ", saved.model, " run with parallel.tensor = ", saved.tensor,
                   " and parallel.pipeline = ", saved.pipeline, "; this run is ", manifest.model, " with ",
                   manifest.tensor, " and ", manifest.pipeline, " (resume with the same layout, or merge the shards ",
                   "with `ration checkpoint merge` and start from the merged weights)");
      saved_split = saved.first_unit;
      resume_path_ = (std::filesystem::path(resume_path_) /
                      shard_dir_name(groups_.layout.stage, groups_.layout.tensor_rank)).string();
    }
    mp_ = std::make_unique<ModelParallelStep>(parallel_, groups_, model_, first, setup_.seed, setup_.config.origin(),
                                              saved_split);
    params_ = mp_->parameters();
    if (roles_.everyone.rank() == 0)
      for (const std::string& line : groups_.layout.describe_all()) progress_.note("layout " + line);
    // Each shard's checkpoints in a folder of their own (written by replica 0), with a manifest for the merge.
    if (!sharded) return;  // every replica holds the whole model
    if (run_.checkpoint_dir.empty()) return;
    manifest.tied = mp_->tied();
    manifest.first_unit = mp_->split().first_unit;
    if (roles_.everyone.rank() == 0) write_shard_manifest(run_.checkpoint_dir, manifest);
    run_.checkpoint_dir = (std::filesystem::path(run_.checkpoint_dir) /
                           shard_dir_name(groups_.layout.stage, groups_.layout.tensor_rank)).string();
  }

  // Every rank stops after the same step (a signal reached some of them): one all-reduce per step.
  int agreed_stop() const {
    const int mine = InterruptScope::requested();
    const double any = dist::all_reduce_doubles(roles_.everyone, {static_cast<double>(mine)})[0];
    return mine != 0 ? mine : (any > 0 ? 15 : 0);
  }

  // The world (from the environment unless the options give one), after the config is fully read.
  dist::World checked_world() {
    setup_.config.check_all_used();
    return options_.world.defined() ? options_.world : dist::join_world(keys_.dp);
  }
  // This rank's shard of every global batch; or, for a member of an ensemble, its own bootstrap sample
  // of the whole set (its own seed).
  data::LoaderOptions shard_options() const {
    data::LoaderOptions o{setup_.batch_size, /*shuffle=*/true, setup_.seed, keys_.drop_last};
    o.sampling = keys_.sampling;
    o.shard_rank = world_.rank();
    o.shard_count = roles_.workers_count;  // a dedicated server's loader counts as a worker's (its steps)
    if (keys_.members) {
      o.seed = setup_.seed + kSeedSpread * static_cast<uint64_t>(world_.rank() + 1);
      o.shard_rank = 0;
      o.shard_count = 1;
    }
    // No prefetch thread (data/dataset.h): every dataset here makes a batch from memory in well under a
    // millisecond, so a thread started per batch had nothing to hide and competed with the step for the
    // cores (mlp's step 2.51 against 2.88 ms, medians on a shared 2-vCPU machine; BENCHMARKS.md, "What the
    // training loop adds").
    o.prefetch = false;
    return o;
  }

  void resume() {
    if (resume_path_.empty()) return;
    const Checkpoint ckpt = load_checkpoint(resume_path_);
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
    check_path_length(run_.checkpoint_dir, setup_.config.origin() + ": train.checkpoint_dir");
    checkpoint_lock_.emplace(run_.checkpoint_dir);
    check_run_may_write(run_.checkpoint_dir, step_, fingerprint_);
  }

  // With a budget: profile one step on the first batch (no update) and plan; the plan runs from the
  // first step on.
  void plan_memory() {
    if (!runtime_.settings().budget.has_budget()) return;
    const data::LoaderPosition here = loader_.position();
    const data::Batch first = loader_.next();
    loader_.set_position(here);
    // Data parallel: what the aggregation holds (buckets, residuals, denominators) is fixed memory too.
    const int64_t dist_bytes = sync_->fixed_bytes(model_.num_parameters());
    const memory::Plan* plan = mp_ ? mp_->prepare(runtime_, first, optimizer_.get(), setup_.seed)
                                   : runtime_.prepare(model_, first, setup_.seed, optimizer_.get(), dist_bytes);
    runtime_.correct_measured_peaks();
    progress_.note(plan->to_table());
  }

  void train_one_step() {
    const double lr = schedule_->apply(*optimizer_, step_);
    const StepStats st =
        mp_ ? model_parallel_step()
        : sync_->active() ? sync_->step(runtime_, model_, loader_, *setup_.train_set, step_,
                                      [this](uint64_t micro) { return step_options(micro); }, step_items_)
                        : local_step();
    if (!st.replan_note.empty()) progress_.note(st.replan_note);
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

  StepStats model_parallel_step() {
    const data::Batch batch = next_batch();
    step_items_ = batch.items * world_.size();  // every replica's
    return mp_->step(runtime_, batch, step_options(0));
  }

  data::Batch next_batch() {
    if (!lookahead_) return loader_.next();
    data::Batch b = std::move(*lookahead_);
    lookahead_.reset();
    return b;
  }

  // Where the data stands for a checkpoint: a batch taken early is not trained yet.
  data::LoaderPosition trained_position() const { return lookahead_ ? lookahead_from_ : loader_.position(); }

  void show_progress(const StepStats& st, double lr) {
    const double eta = static_cast<double>(total_steps_ - step_ - 1) *
                       (record_.seconds / static_cast<double>(step_ - first_step_ + 1));
    const std::string gnorm =
        run_.clip_grad_norm > 0 ? std::string(" | gnorm ") + std::to_string(st.grad_norm).substr(0, 6) : "";
    // A split model: its layout (tensor x pipeline x data), this line being rank 0's (stage 0, shard 0).
    const std::string layout = mp_ ? detail::str(" | T", groups_.layout.tensor, "xP", groups_.layout.pipeline, "xD",
                                                 groups_.layout.data)
                                   : std::string();
    char line[352];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | loss %.4f | %.0f %s | mem %s (step peak %s) | lr %.2e%s%s | eta %s",
                  static_cast<long long>(step_ + 1), static_cast<long long>(total_steps_), st.loss,
                  record_.items_per_second(), setup_.task.throughput_unit,
                  memory::format_bytes(memory::device_current_bytes(st.memory)).c_str(),
                  memory::format_bytes(st.peak_bytes).c_str(), lr, gnorm.c_str(), layout.c_str(),
                  format_duration(eta).c_str());
    progress_.update(step_ + 1, line, step_ + 1 == total_steps_);
  }

  // Evaluation (train.eval_every, or each epoch's end for classifiers) and periodic checkpoints.
  void after_step_duties() {
    // A multiple of `every` reached since the iteration began (a late backup worker may skip steps).
    const int64_t done = step_ + 1, before = step_begin_;
    auto crossed = [&](int64_t every) { return every > 0 && done / every > before / every; };
    const bool epoch_end = setup_.task.evaluates_each_epoch && crossed(per_epoch_);
    if (crossed(run_.eval_every) || (run_.eval_every == 0 && epoch_end)) evaluate_now(done);
    if (crossed(run_.checkpoint_every) && done < total_steps_) {
      const std::string path = save(done);
      if (!path.empty()) progress_.note("checkpoint " + path);
    }
  }

  void evaluate_now(int64_t at_step) {
    const auto t0 = Clock::now();
    // Partial / asynchronous aggregation: rank 0 evaluates the whole set alone (no rank waits for another).
    if (sync_->central() && world_.rank() != 0) return;
    // Buffers (batch-norm running statistics) are each rank's own: evaluate rank 0's everywhere (an
    // ensemble's members keep their own).
    if (!sync_->central() && !keys_.members) dist::broadcast_from_rank0(world_, {}, model_.named_buffers());
    const EvalResult r =
        keys_.members ? evaluate_members(model_, setup_.eval_set, setup_.batch_size, run_.eval_batches, world_)
                      : evaluate(mp_ ? mp_->eval_model() : model_, setup_.eval_set, setup_.batch_size, run_.eval_batches,
                                 sync_->central() ? dist::World::init_single() : world_);
    nlohmann::json e = {{"step", at_step}, {"loss", r.loss}, {"items", r.count}, {"seconds", seconds_since(t0)}};
    if (r.vote_accuracy) {
      double mean = 0;
      for (double a : r.member_accuracy) mean += a / static_cast<double>(r.member_accuracy.size());
      e["ensemble"] = {{"member_accuracy", r.member_accuracy}, {"mean_member_accuracy", mean},
                       {"soft_vote_accuracy", r.accuracy}, {"vote_accuracy", *r.vote_accuracy}};
      progress_.note(detail::str("ensemble @", at_step, ": ", r.member_accuracy.size(), " members, mean member accuracy ",
                                 100 * mean, "%, ensemble ", 100 * r.accuracy, "% (mean probability), ",
                                 100 * *r.vote_accuracy, "% (majority vote)"));
    }
    char line[256];
    if (setup_.task.kind == Task::Kind::LanguageModel) {
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
    // Every rank's error-feedback residuals travel to rank 0 (a collective: every rank calls save); with a
    // parameter server its global model and optimiser are what is saved, not rank 0's working copy.
    NamedTensors weights, state, residuals;
    const bool from_server = sync_->checkpoint(weights, state, residuals);
    // A feature split's tables are each rank's own (parallel.features = "table"): every rank snapshots its.
    if (parallel_.feature_split && !run_.checkpoint_dir.empty() && world_.rank() != 0)
      model_.save_external_state(run_.checkpoint_dir, at_step);
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
    if (!from_server) {
      for (auto& [n, p] : params_) weights.emplace_back(n, p.tensor());
      state = optimizer_->export_state();
    }
    for (auto& [n, b] : model_.named_buffers()) weights.emplace_back(n, b);
    state.insert(state.end(), residuals.begin(), residuals.end());
    return save_checkpoint(run_.checkpoint_dir, at_step, weights, state, meta,
                           static_cast<int>(run_.keep_checkpoints), fingerprint_);
  }

  nlohmann::json memory_report() {
    nlohmann::json mem = runtime_.memory_report(record_.worst_peak(), model_.parameter_options().device());
    mem["step_peak_above_baseline_bytes"] = record_.worst_peak_above();  // above each step's pre-step bytes
    if (mem.contains("within_budget") && !mem["within_budget"].get<bool>())
      progress_.note("error: measured peak " + memory::format_bytes(record_.worst_peak()) + " exceeded the budget " +
                     memory::format_bytes(mem["budget_bytes"].get<int64_t>()) +
                     ": the plan did not hold (exit 1; the report and checkpoints are written)");
    return mem;
  }

  nlohmann::json time_report() const {
    // The first step allocates optimiser state and warms caches: leave it out of the median when possible.
    const std::vector<double>& ms = record_.step_ms;
    const std::vector<double> steady(ms.begin() + (ms.size() > 1 ? 1 : 0), ms.end());
    const std::vector<double>& loop = record_.loop_ms;
    const std::vector<double> steady_loop(loop.begin() + (loop.size() > 1 ? 1 : 0), loop.end());
    nlohmann::json t = {{"step_ms_median", median(steady)},
                        {"loop_ms_median", median(steady_loop)},  // the step plus what the loop adds around it
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
    if (runtime_.engine()) report["offload"] = runtime_.offload_report(total_steps_ - first_step_);
    // An imported TorchScript module: its ops by route (native / generic), with their share of the profiled
    // step's node time when a plan profiled one (docs/TORCHSCRIPT.md).
    if (plan != nullptr && model_.family() == "torchscript")
      report["imported_ops"] = torchscript::op_share_json(torchscript::op_shares(runtime_.step_profile()));
    if (auto metrics = model_.report_metrics(); !metrics.empty()) {
      nlohmann::json ps = nlohmann::json::object();
      for (const auto& [k, v] : metrics) ps[k] = v;
      report["ps"] = ps;
    }
    if (stop_signal_ != 0) {
      report["interrupted_by"] = InterruptScope::name(stop_signal_);
      report["exit_status"] = InterruptScope::exit_status(stop_signal_);
    }
    report["dist"] = sync_->report();
    if (mp_) {
      report["parallel"] = mp_->report();
      report["dist"]["rank"] = roles_.everyone.rank();  // one JSON report per job (--json)
    }
    report["blas"] = blas_report();
    report["openmp"] = openmp_report();
    if (sync_->active()) report["memory"]["dist_bucket_bytes"] = sync_->bucket_bytes();
    return report;
  }

  // A run that fails after its first step still writes its report: what it trained and measured, and the
  // error ("error", "failed_in_step"). A failure while writing it leaves the original error to be reported.
  void write_failure_report(const std::string& why) {
    if (options_.report_path.empty() || roles_.everyone.rank() != 0) return;
    try {
      nlohmann::json report = build_report("");
      report["error"] = why;
      report["failed_in_step"] = step_ + 1;  // 1-based, as the progress line counts (its duties included)
      write_report(report, "");
    } catch (const std::exception&) {
    }
  }

  // --report is checked before the first step (its folder made, a file written there and removed), so a
  // path that cannot be written is named before training rather than after it.
  void check_report_path() {
    if (options_.report_path.empty()) return;
    check_path_length(options_.report_path, "--report");
    const std::filesystem::path p(options_.report_path);
    std::error_code ec;
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    RATION_CHECK(!std::filesystem::is_directory(p), "--report ", options_.report_path, ": is a directory; expected a file path");
    const std::string probe = options_.report_path + ".tmp";
    const bool writable = static_cast<bool>(std::ofstream(probe));
    std::filesystem::remove(probe, ec);
    RATION_CHECK(writable, "--report ", options_.report_path, ": cannot be written (is its folder writable, the ",
                 "path valid?); checked before training so that no run's result is lost");
  }

  // `checkpoint_error`: the final save's failure, named too if the report cannot be written either.
  void write_report(const nlohmann::json& report, const std::string& checkpoint_error) {
    if (options_.report_path.empty() || roles_.everyone.rank() != 0) return;
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
  dist::ParallelSettings parallel_;  // [parallel]
  StepRuntime runtime_;
  std::unique_ptr<seq::ChunkedLoss> tbptt_;  // train.tbptt: the steps' chunks
  dist::ParallelGroups groups_;  // [parallel] model parallelism: the layout's process groups (before roles_)
  dist::JobRoles roles_;  // the whole job, and this process's role in it (worker, or dedicated server)
  dist::World world_;     // the workers' process group
  data::Loader loader_;
  std::optional<data::Batch> lookahead_;  // the next step's batch, taken early for Model::prefetch
  data::LoaderPosition lookahead_from_;   // the loader's position before it
  Progress progress_;
  std::unique_ptr<dist::Liveness> liveness_;
  std::unique_ptr<OpProfile> op_profile_;  // --profile-ops
  NamedTensors resumed_hook_state_;  // the resumed checkpoint's entries, until the reducer takes its own
  int64_t step_items_ = 0;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::WarmupCosine> schedule_;
  std::unique_ptr<DataParallelStep> sync_;
  std::unique_ptr<ModelParallelStep> mp_;
  std::string resume_path_;  // --resume (a split model: this process's shard of it)  // [parallel] model parallelism: how the processes make a step  // how the ranks (or micro-batches) make a step together
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

int exit_status(const nlohmann::json& report) {
  if (report.contains("exit_status")) return report["exit_status"].get<int>();  // a signal stopped the run
  const nlohmann::json& mem = report.value("memory", nlohmann::json::object());
  return mem.is_object() && mem.contains("within_budget") && !mem["within_budget"].get<bool>() ? 1 : 0;
}

}  // namespace ration::train
