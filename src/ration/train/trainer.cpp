#include "ration/train/trainer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ration/core/check.h"
#include "ration/core/node.h"
#include "ration/data/ctr_data.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/data/fashion_mnist.h"
#include "ration/data/text.h"
#include "ration/memory/allocator.h"
#include "ration/optim/adamw.h"
#include "ration/optim/clip.h"
#include "ration/optim/schedule.h"
#include "ration/optim/sgd.h"
#include "ration/memory/budget_policy.h"
#include "ration/train/budget.h"
#include "ration/train/checkpoint.h"
#include "ration/train/progress.h"

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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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

EvalResult evaluate(models::Model& model, const std::shared_ptr<data::Dataset>& set, int64_t batch_size,
                    int64_t max_batches) {
  data::Loader loader(set, {batch_size, /*shuffle=*/false, 0, /*drop_last=*/false});
  models::EvalStats total;
  const bool was_training = model.is_training();
  model.eval();
  int64_t batches = 0;
  {
    NoGradGuard no_grad;
    while (loader.has_next_in_epoch() && (max_batches <= 0 || batches < max_batches)) {
      data::Batch b = loader.next();
      const auto s = model.evaluate(b);
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.count += s.count;
      total.scores.insert(total.scores.end(), s.scores.begin(), s.scores.end());
      total.labels.insert(total.labels.end(), s.labels.begin(), s.labels.end());
      ++batches;
    }
  }
  model.train(was_training);
  EvalResult r;
  r.count = total.count;
  if (total.count > 0) {
    r.loss = total.loss_sum / static_cast<double>(total.count);
    r.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.count);
  }
  if (!total.scores.empty()) r.auc = data::roc_auc(total.scores, total.labels);
  return r;
}

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

}  // namespace

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
  at::set_num_threads(static_cast<int>(threads));
  at::manual_seed(s.seed);
  manual_seed(s.seed);

  s.data_kind = cfg.get_choice("data.kind", "fashion_mnist", {"fashion_mnist", "text", "synthetic_ctr", "movielens"});
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
  }
  const std::string device = cfg.get_choice("train.device", "cpu", {"cpu", "cuda"});
  {
    memory::CategoryGuard param_memory(memory::Category::Parameters);
    s.model = models::build_model(cfg);
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

nlohmann::json run_training(const TrainOptions& options) {
  const auto t_start = Clock::now();
  Config cfg = load_config(options.config_path, options.overrides);
  Setup setup = build_setup(std::move(cfg));
  Config& c = setup.config;
  models::Model& model = *setup.model;

  auto params = model.named_parameters();
  const RunSettings run = read_run_settings(c);
  const BudgetSettings budget = read_budget_settings(c);
  const OffloadSettings offload = read_offload_settings(c);
  c.check_all_used();
  auto optimizer = build_optimizer(run, params);
  const double clip = run.clip_grad_norm;
  const int64_t epochs = options.epochs.value_or(run.epochs);
  const int64_t eval_every = run.eval_every;
  const std::string& ckpt_dir = run.checkpoint_dir;

  data::Loader loader(setup.train_set, {setup.batch_size, /*shuffle=*/true, setup.seed, /*drop_last=*/true});
  const int64_t per_epoch = loader.batches_per_epoch();
  RATION_CHECK(per_epoch > 0, c.origin(), ": train.batch_size ", setup.batch_size, " is larger than the training set (",
               setup.train_set->size(), " items)");
  const int64_t total_steps = options.steps ? *options.steps : (run.steps > 0 ? run.steps : epochs * per_epoch);
  const optim::WarmupCosine schedule(run.lr, run.schedule == "constant" ? run.lr : run.min_lr,
                                     std::min(run.warmup_steps, total_steps),
                                     total_steps);

  Progress progress(options.json, run.log_every);
  int64_t step = 0;
  if (!options.resume.empty()) {
    const Checkpoint ckpt = load_checkpoint(options.resume);
    restore_weights(ckpt, params, model.named_buffers());
    if (ckpt.metadata.ints.count("external_state_step"))
      model.restore_external_state(std::filesystem::path(ckpt.path).parent_path().string(),
                                   ckpt.metadata.ints.at("external_state_step"));
    optimizer->import_state(ckpt.optimizer);
    loader.set_position({ckpt.metadata.ints.at("epoch"), ckpt.metadata.ints.at("loader_index")});
    step = ckpt.step;
    progress.note("resumed from " + ckpt.path + " at step " + std::to_string(step));
  }

  auto save = [&](int64_t at_step) {
    if (ckpt_dir.empty()) return std::string();
    Metadata meta;
    meta.ints["epoch"] = loader.position().epoch;
    meta.ints["loader_index"] = loader.position().index;
    meta.ints["seed"] = static_cast<int64_t>(setup.seed);
    model.save_external_state(ckpt_dir, at_step);  // parameter-server snapshot consistent with these weights
    meta.ints["external_state_step"] = at_step;
    NamedTensors weights;
    for (auto& [n, p] : params) weights.emplace_back(n, p.tensor());
    for (auto& [n, b] : model.named_buffers()) weights.emplace_back(n, b);
    return save_checkpoint(ckpt_dir, at_step, weights, optimizer->export_state(), meta,
                           static_cast<int>(run.keep_checkpoints));
  };

  const bool is_lm = setup.data_kind == "text";
  const bool is_ctr = setup.data_kind == "synthetic_ctr" || setup.data_kind == "movielens";
  const char* unit = is_lm ? "tok/s" : is_ctr ? "samples/s" : "img/s";
  nlohmann::json losses = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();
  std::vector<double> step_ms;
  std::vector<int64_t> step_peaks;
  int64_t items_done = 0;
  double train_seconds = 0;
  model.train();
  memory::reset_peak();
  const int64_t first_step = step;

  // Memory budget: profile one step (no update), plan keep/recompute, execute the plan every step.
  std::optional<memory::Plan> plan;
  std::unique_ptr<memory::BudgetPolicy> policy;
  memory::StepProfile profile;
  memory::PlanOptions plan_options = budget.plan;
  int64_t replans = 0;
  // Offload (seed M2): without a budget the threshold loop; with one, a third choice for the planner.
  std::unique_ptr<memory::OffloadEngine> offload_engine;
  std::unique_ptr<memory::OffloadPolicy> offload_policy;
  if (offload.enabled) {
    offload_engine = std::make_unique<memory::OffloadEngine>(offload.options);
    if (budget.budget_bytes) {
      plan_options.offload = memory::measure_offload_costs(offload_engine->tier(), offload.options);
    } else {
      offload_policy = std::make_unique<memory::OffloadPolicy>(*offload_engine);
    }
  }
  auto make_policy = [&] {
    plan = memory::make_plan(profile, plan_options);
    policy = std::make_unique<memory::BudgetPolicy>(*plan, profile, offload_engine.get());
  };
  if (budget.budget_bytes) {
    const data::LoaderPosition here = loader.position();
    const data::Batch first = loader.next();
    loader.set_position(here);
    profile = profile_step(model, first, setup.seed);
    plan_options.extra_fixed_bytes = unseen_optimizer_bytes(run.optimizer, run.momentum, run.amsgrad, model);
    make_policy();
    progress.note(plan->to_table());
  }
  std::vector<double> recompute_ms;

  auto do_eval = [&](int64_t at_step) {
    const auto t0 = Clock::now();
    const EvalResult r = evaluate(model, setup.eval_set, setup.batch_size, run.eval_batches);
    nlohmann::json e = {{"step", at_step}, {"loss", r.loss}, {"items", r.count}, {"seconds", seconds_since(t0)}};
    char line[256];
    if (is_lm) {
      e["bits_per_byte"] = r.loss / std::log(2.0);
      e["unigram_entropy_bits"] = setup.unigram_entropy_nats / std::log(2.0);
      std::snprintf(line, sizeof line, "eval @%lld: loss %.4f nats/byte = %.3f bits/byte (unigram entropy %.3f bits)",
                    static_cast<long long>(at_step), r.loss, r.loss / std::log(2.0),
                    setup.unigram_entropy_nats / std::log(2.0));
    } else if (r.auc) {
      e["auc"] = *r.auc;
      e["logloss"] = r.loss;
      if (setup.planted_auc) e["planted_auc"] = *setup.planted_auc;
      std::snprintf(line, sizeof line, "eval @%lld: auc %.4f, logloss %.4f (%lld samples)%s",
                    static_cast<long long>(at_step), *r.auc, r.loss, static_cast<long long>(r.count),
                    setup.planted_auc ? (" | planted model auc " + std::to_string(*setup.planted_auc).substr(0, 6)).c_str() : "");
    } else {
      e["accuracy"] = r.accuracy;
      std::snprintf(line, sizeof line, "eval @%lld: loss %.4f, accuracy %.2f%% (%lld images)",
                    static_cast<long long>(at_step), r.loss, 100 * r.accuracy, static_cast<long long>(r.count));
    }
    progress.note(line);
    evals.push_back(e);
  };

  for (; step < total_steps; ++step) {
    const double lr = schedule.apply(*optimizer, step);
    data::Batch batch = loader.next();  // workspace: batches are device memory, the dataset is not
    // Dropout masks are a function of (seed, step), so a resumed run draws exactly what it would have.
    manual_seed(setup.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step));
    const auto t0 = Clock::now();
    memory::reset_peak();
    double loss_value = 0;
    {
      memory::CategoryGuard workspace(memory::Category::Workspace);
      PolicyScope scope(policy ? static_cast<MemoryPolicy*>(policy.get()) : offload_policy.get());
      if (policy) policy->begin_step();
      Value loss = model.loss(batch);
      loss_value = loss.item();
      loss.backward();
      if (policy) recompute_ms.push_back(policy->recompute_ms());
    }
    double gnorm = 0;
    if (clip > 0) gnorm = optim::clip_grad_norm(params, clip);
    optimizer->step();
    optimizer->zero_grad();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const memory::Stats ms_now = memory::stats();
    step_peaks.push_back(memory::device_peak_bytes(ms_now));
    // Plan, measure, correct: if a step overshot the budget (the simulator under-counted something),
    // plan again for a budget lowered by the overshoot, while that stays feasible.
    if (plan && step_peaks.back() > plan->budget_bytes && replans < 3) {
      const int64_t over = step_peaks.back() - plan->budget_bytes;
      const int64_t target = plan_options.budget_bytes - over - (over / 4);
      if (target >= plan->minimum_peak_bytes) {
        plan_options.budget_bytes = target;
        make_policy();
        plan->budget_bytes = budget.plan.budget_bytes;  // report against the user's budget
        ++replans;
        progress.note("step " + std::to_string(step + 1) + " measured " + memory::format_bytes(step_peaks.back()) +
                      " over the budget: re-planned for " + memory::format_bytes(target));
      }
    }
    RATION_CHECK(std::isfinite(loss_value), "loss became ", loss_value, " at step ", step,
                 "; lower optim.lr or set optim.clip_grad_norm");
    step_ms.push_back(ms);
    train_seconds += ms / 1000.0;
    items_done += batch.items;
    losses.push_back(loss_value);

    const double rate = static_cast<double>(items_done) / std::max(train_seconds, 1e-9);
    const double eta = (total_steps - step - 1) * (train_seconds / static_cast<double>(step - first_step + 1));
    char line[320];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | loss %.4f | %.0f %s | mem %s (step peak %s) | lr %.2e%s | eta %s",
                  static_cast<long long>(step + 1), static_cast<long long>(total_steps), loss_value, rate, unit,
                  memory::format_bytes(memory::device_current_bytes(ms_now)).c_str(),
                  memory::format_bytes(memory::device_peak_bytes(ms_now)).c_str(),
                  lr, clip > 0 ? (std::string(" | gnorm ") + std::to_string(gnorm).substr(0, 6)).c_str() : "",
                  format_duration(eta).c_str());
    progress.update(step + 1, line, step + 1 == total_steps);

    const bool epoch_end = !is_lm && (step + 1) % per_epoch == 0;
    if ((eval_every > 0 && (step + 1) % eval_every == 0) || (eval_every == 0 && epoch_end)) do_eval(step + 1);
    if (run.checkpoint_every > 0 && (step + 1) % run.checkpoint_every == 0 && step + 1 < total_steps) {
      const std::string path = save(step + 1);
      if (!path.empty()) progress.note("checkpoint " + path);
    }
  }
  progress.finish();
  if (evals.empty() || evals.back()["step"].get<int64_t>() != total_steps) do_eval(total_steps);
  std::string final_ckpt = save(total_steps);
  if (!final_ckpt.empty()) progress.note("checkpoint " + final_ckpt);

  memory::Stats peak_stats = memory::stats();
  int64_t worst = 0;
  for (auto p : step_peaks) worst = std::max(worst, p);
  nlohmann::json mem = memory_json(peak_stats);
  mem["peak_bytes"] = worst;  // max over steps of each step's measured device peak (dataset excluded)
  mem["dataset_host_bytes"] = peak_stats.current[static_cast<int>(memory::Category::Data)];
  nlohmann::json time_extra = nlohmann::json::object();
  if (plan) {
    mem["budget_bytes"] = plan->budget_bytes;
    mem["predicted_peak_bytes"] = plan->prediction.peak_bytes;
    mem["activation_capacity_bytes"] = plan->capacity_bytes;
    mem["fixed_bytes"] = plan->fixed_bytes;
    mem["within_budget"] = worst <= plan->budget_bytes;
    mem["replans"] = replans;
    mem["prediction_error"] = static_cast<double>(plan->prediction.peak_bytes - worst) / static_cast<double>(std::max<int64_t>(worst, 1));
    double total = 0;
    for (double r : recompute_ms) total += r;
    time_extra["recompute_ms"] = median(recompute_ms);
    time_extra["recompute_ms_total"] = total;
    if (worst > plan->budget_bytes)
      progress.note("warning: measured peak " + memory::format_bytes(worst) + " exceeded the budget " +
                    memory::format_bytes(plan->budget_bytes));
  }
  // The first step allocates optimiser state and warms caches: leave it out of the median when possible.
  const std::vector<double> steady(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
  nlohmann::json report = {
      {"config", options.config_path},
      {"model", model.family()},
      {"parameters", model.num_parameters()},
      {"steps", total_steps},
      {"first_step", first_step},
      {"loss", losses},
      {"eval", evals},
      {"memory", mem},
      {"time",
       {{"step_ms_median", median(steady)},
        {"train_seconds", train_seconds},
        {"wall_seconds", seconds_since(t_start)},
        {"items_per_second", static_cast<double>(items_done) / std::max(train_seconds, 1e-9)}}},
      {"checkpoint", final_ckpt},
      {"plan", plan ? plan->to_json() : nlohmann::json(nullptr)},
      {"effective_config", setup.config.effective()},
  };
  for (auto& [k, v] : time_extra.items()) report["time"][k] = v;
  if (auto metrics = model.report_metrics(); !metrics.empty()) {
    nlohmann::json ps = nlohmann::json::object();
    for (const auto& [k, v] : metrics) ps[k] = v;
    report["ps"] = ps;
  }
  if (offload_engine) {
    const memory::OffloadOptions& o = offload.options;
    auto limit = [](int64_t t) { return t == memory::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(t); };
    report["offload"] = {{"mode", plan ? "plan" : "thresholds"},
                         {"tier", offload_engine->tier().name()},
                         {"t1", o.t1},
                         {"t2", limit(o.t2)},
                         {"t3", limit(o.t3)},
                         {"min_bytes", o.min_bytes},
                         {"prefetch", o.prefetch},
                         {"steps", total_steps - first_step},
                         {"totals", offload_engine->stats().to_json()}};
  }
  if (!options.report_path.empty()) {
    const std::filesystem::path p(options.report_path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    const std::string tmp = options.report_path + ".tmp";
    {
      std::ofstream out(tmp);
      RATION_CHECK(out.good(), "cannot write report '", options.report_path, "'");
      out << report.dump(2) << "\n";
    }
    std::filesystem::rename(tmp, options.report_path);
    progress.note("report " + options.report_path);
  }
  return report;
}

}  // namespace ration::train
