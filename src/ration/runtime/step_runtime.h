// step_runtime.h — one owner for a training step and its memory runtime.
// Owns: StepRuntime — built in one call from the [memory]/[offload] settings, it holds the memory mode
//       (keep everything / threshold offload / execute a plan), the measured profile, the plan, the
//       active decision object (memory::StepPolicy), the OffloadEngine and its tier, and every node's
//       position in the step (memory::StepOrder, stamped once as the node is recorded); it marks step
//       begin and end, runs one step of a model (forward, backward, optionally the optimiser) and measures
//       it (StepStats), and calls the per-step hooks (StepHook) where data-parallel reducers, parameter
//       servers and tracing attach. Also OffloadScope, the RAII threshold offload for user code.
// Does not own: the training loop, evaluation, checkpoints and the report (trainer.cpp); the plan's
//       search (plan/planner.h); the per-value decisions (runtime/budget_policy.h, offload/engine.h
//       ThresholdPolicy); the copy mechanism (offload/engine.h OffloadEngine); update rules (optim/).
//
// How a step's events reach the memory runtime: StepRuntime installs one MemoryPolicy (its driver) on
// the thread for the step. After each node's forward the driver stamps the node's position, lets the
// engine note the node, asks the policy to decide for the node's saved values (keep, drop, offload),
// then lets the engine wait for copies due at that node. Before each backward node the policy sees the
// node, then the engine starts the copy-ins due (a prefetch only when the policy admits it). Backward
// reads dropped values through SavedValue, which re-runs producers (the driver counts the time), and
// offloaded ones through the driver's fetch (the engine).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ration/data/batch.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/plan/planner.h"
#include "ration/plan/profile.h"
#include "ration/core/step_order.h"
#include "ration/core/step_policy.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"
#include "ration/runtime/budget.h"
#include "ration/step/hooks.h"

namespace ration::memory {
class BudgetPolicy;
}

namespace ration::train {

// The offload engine's counters as JSON (the report's offload.totals; benchmarks).
nlohmann::json offload_stats_json(const memory::OffloadStats& stats);

// What the runtime does with saved values. Keep: nothing (everything stays resident). Thresholds:
// offload with T1/T2/T3 (offload enabled, no budget). Plan: execute a keep/recompute(/offload) plan
// (a budget; from the step after plan() or prepare()).
enum class MemoryMode { Keep, Thresholds, Plan };
const char* to_string(MemoryMode mode);

// Where the parameters' gradients are left after a step that runs no optimiser (with an optimiser they
// are zeroed by it). Kept: in the parameters (they accumulate over steps, e.g. for gradient
// accumulation). Collected: copied into StepStats::gradients, then cleared. Cleared: set to none.
enum class GradientsAfter { Kept, Collected, Cleared };
// Module buffers (batch-norm running statistics) after the step. Updated: as training does. Restored:
// as they were before it (profiling, gradient checks).
enum class BuffersAfter { Updated, Restored };

struct StepOptions {
  std::optional<int64_t> step;     // the step's number for hooks and stats (unset: one more than the last)
  std::optional<uint64_t> seed;    // manual_seed before forward (dropout masks); unset: the stream as is
  optim::Optimizer* optimizer = nullptr;  // set: clip, update and zero the gradients after backward
  double clip_grad_norm = 0;       // > 0: clip to this norm before the update (with an optimizer)
  GradientsAfter gradients = GradientsAfter::Kept;
  BuffersAfter buffers = BuffersAfter::Updated;
  // Set: the step runs in the pieces it defines (see PiecewiseLoss); unset: one piece, model.loss(batch).
  // Hooks see one step: after_forward and gradient_ready come with the last piece (when the gradients
  // of every piece have accumulated).
  PiecewiseLoss* pieces = nullptr;

  // A step to compare with another (tests, benchmarks): seeded, gradients collected and cleared.
  static StepOptions collecting(uint64_t seed) {
    StepOptions o;
    o.seed = seed;
    o.gradients = GradientsAfter::Collected;
    return o;
  }
};

class StepRuntime {
 public:
  // The one factory: the memory runtime `settings` ask for. Builds the offload engine and its tier when
  // offload is enabled; Thresholds mode without a budget. With a budget the runtime keeps everything
  // until prepare() (or plan()) made a plan.
  explicit StepRuntime(MemorySettings settings = {});
  ~StepRuntime();
  StepRuntime(const StepRuntime&) = delete;
  StepRuntime& operator=(const StepRuntime&) = delete;

  MemoryMode mode() const { return mode_; }
  const MemorySettings& settings() const { return settings_; }

  // ---- the plan
  // With a budget in the settings: profile one step of `model` on `batch` and plan for the settings'
  // [memory] options. Memory the profile cannot see is fixed memory of the plan: `optimizer`'s state to
  // come, what `model` holds for a prefetched batch (Model::prefetch_bytes) and for a batch whose
  // data-dependent sizes exceed the profiled one's (Model::batch_variation_bytes), and `extra_fixed_bytes` (e.g.
  // a data-parallel aggregator's). The optimiser step after backward (the step's memory then, measured in
  // the profile, plus the update's workspace, Optimizer::update_workspace_bytes) must fit the budget too,
  // or planning fails naming it. Returns the plan, or null without a budget (nothing to do).
  const memory::Plan* prepare(models::Model& model, const data::Batch& batch, uint64_t seed,
                              optim::Optimizer* optimizer = nullptr, int64_t extra_fixed_bytes = 0);
  // The second half of prepare(), for a step profiled otherwise (profile_run): with a budget, plan the
  // profiled step leaving room for `optimizer`'s state to come and its update, and `extra_fixed_bytes`.
  // Returns null without a budget.
  const memory::Plan* prepare_profiled(optim::Optimizer* optimizer, int64_t extra_fixed_bytes);
  // One measured forward+backward of `model` on `batch` under seed `seed`, keeping everything; no
  // update: gradients and buffers are restored afterwards. The runtime keeps the profile.
  const memory::StepProfile& profile(models::Model& model, const data::Batch& batch, uint64_t seed);
  // A step that is not Model::loss and backward (a pipeline stage's micro-batch: forward from a received
  // activation, backward from a received gradient), profiled as profile() profiles one: `run` performs
  // forward and backward; `model`'s gradients and buffers are restored afterwards.
  const memory::StepProfile& profile_run(models::Model& model, uint64_t seed, const std::function<void()>& run);
  void set_profile(memory::StepProfile profile);  // plan from a profile measured elsewhere
  const memory::StepProfile& step_profile() const;
  // Plan the profiled step (when the runtime offloads and `options.offload` is unset, with the tier's
  // measured costs) and execute the plan from the next step on.
  const memory::Plan& plan(memory::PlanOptions options);
  // Execute `plan` (made from this runtime's profile) from the next step on.
  const memory::Plan& use_plan(memory::Plan plan);
  // Plan again for another budget, the other options unchanged (see trainer.cpp: plan, measure, correct);
  // the feasible minimum is carried over from the previous plan instead of computed again.
  const memory::Plan& replan(int64_t budget_bytes);
  const memory::Plan* current_plan() const { return plan_ ? &*plan_ : nullptr; }
  // ---- re-plans while training: one controller for the two reasons a running plan is made again.
  // A step measured over the budget (the simulator under-counted, e.g. a workspace the profile did not
  // see) re-plans for a budget lowered by the overshoot plus a margin, while that stays feasible, at most
  // kMaxPeakReplans times (a plan still over is reported as over rather than chased further); the plan
  // still reports the user's budget. Planned copy-outs that missed their deadline re-plan the same budget
  // with the copy bandwidth the step got (see adapt_to_late_copies). The first runs once a training run
  // asks for it (correct_measured_peaks); the second always runs with a joint plan.
  static constexpr int kMaxPeakReplans = 3;
  void correct_measured_peaks() { correct_peaks_ = true; }
  // Re-plans made for measured peaks over the budget.
  int peak_replans() const { return peak_replans_; }
  // Re-plans made because planned copy-outs missed their deadline, since the last plan asked for from
  // outside.
  int copy_replans() const { return copy_replans_; }
  memory::Plan* current_plan() { return plan_ ? &*plan_ : nullptr; }
  // The offload tier's measured costs (measured on first use with `probe_bytes` buffers, then kept).
  const memory::OffloadCosts& offload_costs(int64_t probe_bytes = 16 << 20);
  memory::OffloadEngine* engine() { return engine_.get(); }
  const memory::OffloadEngine* engine() const { return engine_.get(); }

  // ---- its fragments of a training report
  // "memory": the allocator's figures (categories at the peak, their own peaks), `measured_peak_bytes` (the
  // worst step peak the caller measured) and, with a plan, the budget, prediction, fixed occupancy, peak
  // re-plans and whether the measured peak stayed within the budget.
  nlohmann::json memory_report(int64_t measured_peak_bytes, const at::Device& device) const;
  // "offload" (with an offload engine): the mode, tier, thresholds and the engine's totals over `steps`.
  nlohmann::json offload_report(int64_t steps) const;

  // ---- steps
  void add_hook(StepHook* hook);
  // One training step of `model` on `batch`: forward, backward and, with options.optimizer, the update.
  // Returns the loss.
  double run_step(models::Model& model, const data::Batch& batch, const StepOptions& options = {});
  // The same step, measured.
  StepStats measure_step(models::Model& model, const data::Batch& batch, const StepOptions& options = {});

  // Inside a Scope, micro-batches whose forward and backward interleave (a pipeline stage under 1F1B):
  // micro-batch `index` begins its forward, its nodes numbered from 0 as the profile of one micro-batch
  // numbers them, so one plan applies to every micro-batch; or begins its backward, its numbering back.
  void begin_micro_batch(int64_t index);
  void resume_micro_batch(int64_t index);

  // A step around code other than a Model (a custom forward and backward): the memory runtime is
  // active while the Scope lives. No hooks run.
  class Scope {
   public:
    explicit Scope(StepRuntime& runtime);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepRuntime& runtime_;
    std::unique_ptr<PolicyScope> installed_;
  };

 private:
  class Driver;
  struct HookState;
  void use_policy(memory::StepPolicy* policy, MemoryMode mode);
  void begin_step();
  void end_step();
  void attach_gradient_hooks(models::Model& model);
  void adapt_to_late_copies(const memory::OffloadStats& before, const memory::OffloadStats& after, double step_ms);
  void correct_for_peak(StepStats& stats);

  MemorySettings settings_;
  MemoryMode mode_ = MemoryMode::Keep;
  memory::StepOrder order_;
  std::vector<memory::StepOrder> micro_orders_;  // each micro-batch's numbering (begin_micro_batch)
  int64_t micro_current_ = -1;                   // the micro-batch numbered now, or -1
  std::unique_ptr<memory::OffloadEngine> engine_;
  std::optional<memory::OffloadCosts> offload_costs_;
  std::optional<memory::StepProfile> profile_;
  std::optional<memory::Plan> plan_;
  memory::PlanOptions plan_options_;
  // The optimiser step, after backward: live bytes measured there in the profile, and what prepare() was
  // told the update adds (its workspace); 0: not known (no optimiser in the step).
  int64_t after_backward_bytes_ = 0;
  int64_t update_bytes_ = 0;
  void add_optimizer_step(memory::Plan& plan, int64_t extra_fixed_bytes) const;
  bool planned_here_ = false;  // plan_ was made by plan() (plan_options_ can re-make it), not use_plan()
  int copy_replans_ = 0;
  bool correct_peaks_ = false;
  int peak_replans_ = 0;
  int64_t planned_budget_ = 0;  // the budget the running plan was made for after peak corrections (0: none)
  std::unique_ptr<memory::StepPolicy> policy_;  // the mode's decisions (Thresholds, Plan)
  memory::BudgetPolicy* budget_policy_ = nullptr;  // policy_ in Plan mode (its counts go into StepStats)
  memory::StepPolicy* active_ = nullptr;        // what the driver calls now (policy_, or a profiler)
  memory::OffloadEngine* driven_engine_ = nullptr;  // the engine the active policy offloads through
  std::unique_ptr<Driver> driver_;
  std::shared_ptr<HookState> hooks_;
  int64_t next_step_ = 0;
  double recompute_ms_ = 0;  // this step
  int64_t recomputed_nodes_ = 0;
};

// One-off profile of a model's step (a StepRuntime used once): what the planner plans from.
memory::StepProfile profile_step(models::Model& model, const data::Batch& batch, uint64_t seed);

}  // namespace ration::train

namespace ration {

// RAII threshold offload around user code: saved activations produced while the scope is alive are
// offloaded per `options` (T1/T2/T3); keep it alive until backward has finished. Model code does not
// change.   { ration::OffloadScope offload(opts); auto loss = model(x); loss.backward(); }
class OffloadScope {
 public:
  explicit OffloadScope(const memory::OffloadOptions& options = {});
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;
  memory::OffloadEngine& engine() { return *runtime_->engine(); }
  memory::OffloadStats stats() const { return runtime_->engine()->stats(); }

 private:
  std::unique_ptr<train::StepRuntime> runtime_;
  std::unique_ptr<train::StepRuntime::Scope> scope_;
};

}  // namespace ration
