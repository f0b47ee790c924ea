#include "ration/runtime/step_runtime.h"
#include "ration/base/timing.h"

#include <time.h>

#include <algorithm>
#include <chrono>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/core/trace.h"
#include "ration/runtime/budget_policy.h"
#include "ration/optim/clip.h"

namespace ration::train {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::pair<std::string, at::Tensor>> copy_gradients(models::Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : model.named_parameters())
    out.emplace_back(name, p.grad().defined() ? p.grad().clone() : at::zeros_like(p.tensor()));
  return out;
}

}  // namespace

const char* to_string(MemoryMode mode) {
  switch (mode) {
    case MemoryMode::Keep: return "keep";
    case MemoryMode::Thresholds: return "thresholds";
    case MemoryMode::Plan: return "plan";
  }
  return "?";
}

// ---- the driver: the one MemoryPolicy a step installs --------------------------------------------------

class StepRuntime::Driver final : public MemoryPolicy {
 public:
  explicit Driver(StepRuntime& runtime) : rt_(runtime) {}

  void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) override {
    const int64_t ordinal = rt_.order_.assign(node);
    memory::OffloadEngine* engine = rt_.driven_engine_;
    if (engine) engine->begin_forward_node(node, ordinal);
    rt_.active_->after_forward_node(node, inputs, outputs);
    if (engine) engine->end_forward_node(ordinal);
  }
  void before_backward_node(Node& node) override {
    memory::StepPolicy* policy = rt_.active_;
    policy->before_backward_node(node);
    if (memory::OffloadEngine* engine = rt_.driven_engine_)
      engine->before_backward_node(rt_.order_.of(node), [policy](int64_t bytes) { return policy->may_prefetch(bytes); });
  }
  void after_backward_node(Node& node) override { rt_.active_->after_backward_node(node); }
  at::Tensor fetch(SavedValue& value) override {
    RATION_CHECK(rt_.driven_engine_ != nullptr, "saved value ", value.label(),
                 " is offloaded but this step's memory runtime has no offload engine");
    return rt_.driven_engine_->fetch(value);
  }
  void on_recompute(Node&, double ms) override {
    rt_.recompute_ms_ += ms;
    ++rt_.recomputed_nodes_;
  }
  bool store_rebuilt(Node& producer) override { return rt_.active_->store_rebuilt(producer); }

 private:
  StepRuntime& rt_;
};

// Gradient-ready hooks are attached to a model's parameters once; they call the runtime's hooks only
// while one of its steps runs backward, and do nothing once the runtime is gone.
struct StepRuntime::HookState {
  std::vector<StepHook*> hooks;   // registered with add_hook
  std::vector<StepHook*> active;  // this step's: the registered ones, then the model's own (step_hooks)
  bool in_backward = false;
  std::unordered_map<const ValueImpl*, std::weak_ptr<ValueImpl>> attached;
};

// ---- building ------------------------------------------------------------------------------------------

StepRuntime::StepRuntime(MemorySettings settings)
    : settings_(std::move(settings)), driver_(std::make_unique<Driver>(*this)), hooks_(std::make_shared<HookState>()) {
  if (!settings_.offload.enabled) return;
  engine_ = std::make_unique<memory::OffloadEngine>(settings_.offload.options);
  if (!settings_.budget.has_budget()) {
    policy_ = std::make_unique<memory::ThresholdPolicy>(*engine_);
    use_policy(policy_.get(), MemoryMode::Thresholds);
  }
}

StepRuntime::~StepRuntime() = default;

void StepRuntime::use_policy(memory::StepPolicy* policy, MemoryMode mode) {
  active_ = policy;
  mode_ = mode;
  driven_engine_ = mode == MemoryMode::Keep ? nullptr : engine_.get();
}

const memory::OffloadCosts& StepRuntime::offload_costs(int64_t probe_bytes) {
  RATION_CHECK(engine_ != nullptr, "offload costs need an offload tier (offload.enabled)");
  if (!offload_costs_) offload_costs_ = memory::measure_offload_costs(engine_->tier(), engine_->options(), probe_bytes);
  return *offload_costs_;
}

// ---- profile and plan ----------------------------------------------------------------------------------

const memory::StepProfile& StepRuntime::profile(models::Model& model, const data::Batch& batch, uint64_t seed) {
  return profile_run(model, seed, [&] {
    Value loss = model.loss(batch);
    loss.backward();
  });
}

const memory::StepProfile& StepRuntime::profile_run(models::Model& model, uint64_t seed, const std::function<void()>& run) {
  const std::vector<at::Tensor> buffers = model.snapshot_buffers();
  model.zero_grad();
  memory::StepPolicy* const previous = active_;
  const MemoryMode previous_mode = mode_;
  {
    memory::ProfilePolicy profiler(order_);  // measures from here: construct right before the step
    active_ = &profiler;
    driven_engine_ = nullptr;  // the profile keeps everything: nothing is offloaded
    try {
      Scope step(*this);
      manual_seed(seed);
      memory::CategoryGuard workspace(memory::Category::Workspace);
      run();
      after_backward_bytes_ = memory::device_current_bytes(memory::stats());  // the gradients live: the update's base
      profile_ = profiler.finish();
    } catch (...) {
      use_policy(previous, previous_mode);
      throw;
    }
  }
  use_policy(previous, previous_mode);
  model.discard_step();
  model.zero_grad();
  model.restore_buffers(buffers);
  return *profile_;
}

void StepRuntime::set_profile(memory::StepProfile profile) { profile_ = std::move(profile); }

const memory::StepProfile& StepRuntime::step_profile() const {
  RATION_CHECK(profile_.has_value(), "no step profiled yet: call StepRuntime::profile first");
  return *profile_;
}

const memory::Plan& StepRuntime::plan(memory::PlanOptions options) {
  if (engine_ && !options.offload) options.offload = offload_costs();
  memory::Plan made = memory::make_plan(step_profile(), options);
  add_optimizer_step(made, options.extra_fixed_bytes);
  plan_options_ = options;
  use_plan(std::move(made));
  planned_here_ = true;
  return *plan_;
}

// The optimiser step comes after backward: every gradient live, no saved value left (offload's copy-in
// pool too, until the step ends), plus the update's workspace. It is part of the step's peak and of its
// minimum; a budget below it fails here, before training, naming it.
void StepRuntime::add_optimizer_step(memory::Plan& plan, int64_t extra_fixed_bytes) const {
  if (update_bytes_ <= 0) return;
  const int64_t peak = after_backward_bytes_ + extra_fixed_bytes + update_bytes_ +
                       plan.prediction.copy_in_pool_bytes;
  RATION_CHECK(peak <= plan.budget_bytes, "memory budget ", memory::format_bytes(plan.budget_bytes),
               " is below the optimiser step's ", memory::format_bytes(peak), " (after backward ",
               memory::format_bytes(after_backward_bytes_ + extra_fixed_bytes),
               ": parameters, every gradient and the optimiser state; the update's own workspace ",
               memory::format_bytes(update_bytes_), "); the feasible minimum is at least ",
               memory::format_bytes(std::max(peak, plan.minimum_peak_bytes)),
               "; hint: raise --memory-budget, or use an optimiser with less state (sgd)");
  plan.minimum_peak_bytes = plan.minimum_peak_bytes > 0 ? std::max(plan.minimum_peak_bytes, peak) : 0;
  plan.unconstrained_peak_bytes = std::max(plan.unconstrained_peak_bytes, peak);
  if (peak > plan.prediction.peak_bytes) {
    plan.prediction.peak_bytes = peak;
    plan.prediction.peak_at = "optimizer update";
  }
}

const memory::Plan& StepRuntime::use_plan(memory::Plan plan) {
  const memory::StepProfile& profiled = step_profile();
  plan_ = std::move(plan);
  planned_here_ = false;
  copy_replans_ = 0;
  auto budget = std::make_unique<memory::BudgetPolicy>(*plan_, profiled, order_, engine_.get());
  budget_policy_ = budget.get();
  policy_ = std::move(budget);
  use_policy(policy_.get(), MemoryMode::Plan);
  return *plan_;
}

const memory::Plan& StepRuntime::replan(int64_t budget_bytes) {
  RATION_CHECK(plan_.has_value(), "replan before a first plan");
  memory::PlanOptions options = plan_options_;
  options.budget_bytes = budget_bytes;
  // The floor does not depend on the budget: the re-plan only shows that the new budget is not below it,
  // without the floor's whole descents (docs/METHODS.md, "Planning time"), and keeps the figure the
  // previous plan reported.
  const int64_t minimum = plan_->minimum_peak_bytes;
  options.report_minimum = false;
  plan(options);
  plan_->minimum_peak_bytes = minimum;
  return *plan_;
}

const memory::Plan* StepRuntime::prepare(models::Model& model, const data::Batch& batch, uint64_t seed,
                                         optim::Optimizer* optimizer, int64_t extra_fixed_bytes) {
  if (!settings_.budget.has_budget()) return nullptr;
  if (engine_) offload_costs();  // measured before profiling, while nothing of the step is live
  profile(model, batch, seed);
  return prepare_profiled(optimizer, extra_fixed_bytes + model.prefetch_bytes(batch) + model.batch_variation_bytes(batch));
}

const memory::Plan* StepRuntime::prepare_profiled(optim::Optimizer* optimizer, int64_t extra_fixed_bytes) {
  if (!settings_.budget.has_budget()) return nullptr;
  memory::PlanOptions options = settings_.budget.plan;
  options.extra_fixed_bytes = extra_fixed_bytes + (optimizer ? optimizer->unseen_state_bytes() : 0);
  update_bytes_ = optimizer ? optimizer->update_workspace_bytes() : 0;
  return &plan(options);
}

// Planned copy-outs that missed their deadline (the engine's deadline_waits) got less bandwidth than the
// plan was priced with: the machine's load, a forward faster than profiled, copies slower than measured.
// Forward waited for them, so the step stayed within the prediction, but slower. Plan the same budget
// again with the copy-out bandwidth lowered to what this step's copies got, and by at least a quarter:
// the schedule then gives copies deadlines they meet, or recomputes where a later deadline does not fit.
// A few times at most (docs/METHODS.md, "Joint keep, recompute and offload planning").
void StepRuntime::adapt_to_late_copies(const memory::OffloadStats& before, const memory::OffloadStats& after,
                                       double step_ms) {
  constexpr int kMaxCopyReplans = 4;
  if (!planned_here_ || !plan_ || plan_->offloaded_groups == 0 || !plan_options_.offload) return;
  if (after.deadline_waits <= before.deadline_waits || copy_replans_ >= kMaxCopyReplans) return;
  memory::OffloadCosts costs = *plan_options_.offload;
  double rate = 0.75 * costs.write_bytes_per_ms;
  const double bytes = static_cast<double>(after.written_bytes - before.written_bytes);
  const double ms = after.write_ms - before.write_ms;
  if (bytes > 0 && ms > 0) rate = std::min(rate, bytes / ms);
  // The schedule runs on the profile's node times: a step faster than profiled gives copies less time.
  double profiled_ms = 0;
  for (const auto& n : step_profile().nodes) profiled_ms += n.forward_ms + n.backward_ms;
  if (profiled_ms > 0 && step_ms > 0 && step_ms < profiled_ms) rate *= step_ms / profiled_ms;
  costs.write_bytes_per_ms = std::max(rate, 1.0);
  memory::PlanOptions options = plan_options_;
  options.offload = costs;
  options.report_minimum = false;
  const int replans = copy_replans_ + 1;
  try {
    plan(options);
    copy_replans_ = replans;
  } catch (const Error&) {  // cannot happen for a budget planned before; keep the plan that runs
    copy_replans_ = kMaxCopyReplans;
  }
}

// The margin of a peak correction: a quarter of the overshoot on top of it, so that one correction usually
// suffices (the under-count grows with what the new plan drops, roughly in proportion).
constexpr int64_t kMarginFractionOfOvershoot = 4;

void StepRuntime::correct_for_peak(StepStats& st) {
  const int64_t budget = settings_.budget.budget_bytes();
  if (!plan_ || !settings_.budget.has_budget() || st.peak_bytes <= budget || peak_replans_ >= kMaxPeakReplans) return;
  const int64_t over = st.peak_bytes - budget;
  const int64_t planned = planned_budget_ > 0 ? planned_budget_ : budget;
  const int64_t target = planned - over - over / kMarginFractionOfOvershoot;
  if (target < plan_->minimum_peak_bytes) return;
  planned_budget_ = target;
  replan(target);
  plan_->budget_bytes = budget;  // reported against the user's budget
  ++peak_replans_;
  st.replan_note = "step " + std::to_string(st.step + 1) + " measured " + memory::format_bytes(st.peak_bytes) +
                   " over the budget: re-planned for " + memory::format_bytes(target);
}

// ---- steps ---------------------------------------------------------------------------------------------

void StepRuntime::begin_micro_batch(int64_t index) {
  RATION_CHECK(index >= 0, "micro-batch index must be >= 0; got ", index);
  if (micro_current_ >= 0) micro_orders_[static_cast<size_t>(micro_current_)] = order_;
  if (static_cast<int64_t>(micro_orders_.size()) <= index) micro_orders_.resize(static_cast<size_t>(index) + 1);
  order_.begin();
  micro_current_ = index;
  if (driven_engine_) driven_engine_->select_micro_batch(index);
}

void StepRuntime::resume_micro_batch(int64_t index) {
  RATION_CHECK(index >= 0 && index < static_cast<int64_t>(micro_orders_.size()), "micro-batch ", index,
               " resumed before it began");
  if (micro_current_ >= 0) micro_orders_[static_cast<size_t>(micro_current_)] = order_;
  order_ = micro_orders_[static_cast<size_t>(index)];
  micro_current_ = index;
  if (driven_engine_) driven_engine_->select_micro_batch(index);
  if (active_) active_->begin_backward();
}

void StepRuntime::begin_step() {
  micro_orders_.clear();
  micro_current_ = -1;
  order_.begin();
  recompute_ms_ = 0;
  recomputed_nodes_ = 0;
  if (active_) active_->begin_step();
  if (driven_engine_) driven_engine_->begin_step();
}

void StepRuntime::end_step() {
  if (active_) active_->end_step();
  if (driven_engine_) driven_engine_->end_step();
}

StepRuntime::Scope::Scope(StepRuntime& runtime) : runtime_(runtime) {
  runtime_.begin_step();
  // Keep mode installs nothing: a plain step runs exactly as without a runtime.
  if (runtime_.active_) installed_ = std::make_unique<PolicyScope>(runtime_.driver_.get());
}

StepRuntime::Scope::~Scope() {
  installed_.reset();
  runtime_.end_step();
}

void StepRuntime::add_hook(StepHook* hook) {
  RATION_CHECK(hook != nullptr, "StepRuntime::add_hook: null hook");
  hooks_->hooks.push_back(hook);
}

void StepRuntime::attach_gradient_hooks(models::Model& model) {
  for (auto& [name, p] : model.named_parameters()) {
    const ValueImpl* impl = p.impl().get();
    auto it = hooks_->attached.find(impl);
    if (it != hooks_->attached.end() && !it->second.expired()) continue;
    hooks_->attached[impl] = p.impl();
    p.on_grad_ready([state = std::weak_ptr<HookState>(hooks_), param = name](ValueImpl& leaf) {
      auto s = state.lock();
      if (!s || !s->in_backward) return;
      for (StepHook* h : s->active) h->gradient_ready(param, leaf);
    });
  }
}

double StepRuntime::run_step(models::Model& model, const data::Batch& batch, const StepOptions& options) {
  return measure_step(model, batch, options).loss;
}

StepStats StepRuntime::measure_step(models::Model& model, const data::Batch& input, const StepOptions& options) {
  StepStats st;
  st.step = options.step.value_or(next_step_);
  next_step_ = st.step + 1;
  hooks_->active = hooks_->hooks;
  for (StepHook* h : model.step_hooks()) hooks_->active.push_back(h);
  const std::vector<StepHook*> hooks = hooks_->active;
  if (!hooks.empty()) attach_gradient_hooks(model);
  data::Batch batch = input;  // hooks may change it (shares the tensors)
  for (StepHook* h : hooks) h->before_forward(st.step, batch);
  std::vector<at::Tensor> buffers;
  if (options.buffers == BuffersAfter::Restored) buffers = model.snapshot_buffers();

  const memory::OffloadStats offload_before = engine_ ? engine_->stats() : memory::OffloadStats{};
  const at::Device device = model.parameter_options().device();
  st.baseline_bytes = memory::device_current_bytes(device);
  memory::reset_peak();
  if (device.is_cuda()) memory::reset_device_peak(device);
  const auto t0 = Clock::now();
  const double c0 = cpu_ms_now();
  {
    memory::CategoryGuard workspace(memory::Category::Workspace);
    Scope step(*this);
    if (options.seed) manual_seed(*options.seed);
    const int64_t n_pieces = options.pieces ? options.pieces->begin(model, batch) : 1;
    RATION_CHECK(n_pieces >= 1, "a piecewise step needs at least one piece; got ", n_pieces);
    for (int64_t piece = 0; piece < n_pieces; ++piece) {
      Value loss = options.pieces ? options.pieces->piece_loss(piece) : model.loss(batch);
      st.loss += loss.item();
      const bool last = piece + 1 == n_pieces;
      if (last) {
        st.forward_end_bytes = memory::device_current_bytes(device);
        for (StepHook* h : hooks) h->after_forward(st.step, loss);
      }
      hooks_->in_backward = last;
      try {
        loss.backward();
      } catch (...) {
        hooks_->in_backward = false;
        throw;
      }
      hooks_->in_backward = false;
    }
    if (budget_policy_ && active_ == budget_policy_) {
      st.dropped_values = budget_policy_->dropped_values();
      st.offloaded_values = budget_policy_->offloaded_values();
    }
  }
  st.recompute_ms = recompute_ms_;
  st.recomputed_nodes = recomputed_nodes_;
  for (StepHook* h : hooks) h->after_backward(st.step);
  if (options.optimizer) {
    for (StepHook* h : hooks) h->before_optimizer(st.step);
    TraceRegion update("optimizer", "optimizer", [&] { return std::string(options.optimizer->name()) + " update"; });
    if (options.clip_grad_norm > 0) st.grad_norm = optim::clip_grad_norm(options.optimizer->params(), options.clip_grad_norm);
    options.optimizer->step();
    options.optimizer->zero_grad();
  }
  memory::synchronize(device);  // a GPU step ends when its kernels do
  st.ms = ms_since(t0);
  st.cpu_ms = cpu_ms_now() - c0;
  st.memory = memory::stats();
  st.peak_bytes = device.is_cuda() ? memory::device_stats(device).peak_bytes : memory::device_peak_bytes(st.memory);
  if (engine_) st.offload = engine_->stats();
  if (engine_ && mode_ == MemoryMode::Plan) adapt_to_late_copies(offload_before, st.offload, st.ms);
  if (correct_peaks_ && mode_ == MemoryMode::Plan) correct_for_peak(st);
  if (options.buffers == BuffersAfter::Restored) model.restore_buffers(buffers);
  if (!options.optimizer) {
    if (options.gradients == GradientsAfter::Collected) st.gradients = copy_gradients(model);
    if (options.gradients != GradientsAfter::Kept) model.zero_grad();
  }
  for (StepHook* h : hooks) h->after_step(st.step, st);
  return st;
}

memory::StepProfile profile_step(models::Model& model, const data::Batch& batch, uint64_t seed) {
  StepRuntime runtime;
  return runtime.profile(model, batch, seed);
}

// ---- report fragments -----------------------------------------------------------------------------------

namespace {
nlohmann::json allocator_json(const memory::Stats& s) {
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

nlohmann::json StepRuntime::memory_report(int64_t measured_peak_bytes, const at::Device& device) const {
  const memory::Stats peak_stats = memory::stats();
  nlohmann::json mem = allocator_json(peak_stats);
  mem["peak_bytes"] = measured_peak_bytes;  // max over steps of each step's measured device peak (dataset excluded)
  mem["dataset_host_bytes"] = peak_stats.current[static_cast<int>(memory::Category::Data)];
  if (device.is_cuda()) {
    // Each step's peak came from the CUDA caching allocator; the categories and allocations stay the
    // counting allocator's view of host memory.
    mem["measured_by"] = "CUDA caching allocator (peak_bytes); counting ATen CPU allocator (host breakdown)";
    mem["device"] = device.str();
  }
  if (const memory::Plan* plan = current_plan()) {
    mem["budget_bytes"] = plan->budget_bytes;
    mem["predicted_peak_bytes"] = plan->prediction.peak_bytes;
    mem["activation_capacity_bytes"] = plan->capacity_bytes;
    mem["fixed_bytes"] = plan->fixed_bytes;
    mem["within_budget"] = measured_peak_bytes <= plan->budget_bytes;
    mem["replans"] = peak_replans_;
    mem["prediction_error"] = static_cast<double>(plan->prediction.peak_bytes - measured_peak_bytes) /
                              static_cast<double>(std::max<int64_t>(measured_peak_bytes, 1));
  }
  return mem;
}

nlohmann::json StepRuntime::offload_report(int64_t steps) const {
  RATION_CHECK(engine_ != nullptr, "offload_report without an offload engine");
  const memory::OffloadOptions& o = settings_.offload.options;
  auto limit = [](int64_t t) { return t == memory::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(t); };
  return {{"mode", current_plan() ? "plan" : "thresholds"},
          {"tier", engine_->tier().name()},
          {"t1", o.t1},
          {"t2", limit(o.t2)},
          {"t3", limit(o.t3)},
          {"min_bytes", o.min_bytes},
          {"prefetch", o.prefetch},
          {"steps", steps},
          {"totals", offload_stats_json(engine_->stats())}};
}

}  // namespace ration::train

namespace ration {

OffloadScope::OffloadScope(const memory::OffloadOptions& options) {
  train::MemorySettings settings;
  settings.offload.enabled = true;
  settings.offload.options = options;
  runtime_ = std::make_unique<train::StepRuntime>(std::move(settings));
  scope_ = std::make_unique<train::StepRuntime::Scope>(*runtime_);
}

OffloadScope::~OffloadScope() {
  scope_.reset();
  runtime_.reset();
}

}  // namespace ration
