// hooks.h — what a training step offers the code it runs: the interfaces models and other components
// implement to take part in a step, below the models that implement them and the runtime that calls them.
// Owns: StepStats (what a measured step returns), StepHook (per-step callbacks: parameter servers,
//       data-parallel reducers, tracing), PiecewiseLoss (a step run in pieces, e.g. truncated BPTT).
// Does not own: running a step (runtime/step_runtime.h); the models (models/).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "ration/base/allocator.h"
#include "ration/core/value.h"
#include "ration/data/batch.h"
#include "ration/offload/engine.h"

namespace ration::models {
class Model;
}

namespace ration::train {

// What a measured step returns.
struct StepStats {
  int64_t step = 0;
  double loss = 0;
  double ms = 0;                  // wall time: forward + backward (+ the optimiser when it ran)
  double cpu_ms = 0;              // process CPU time, same span (robust to a neighbour stealing CPU)
  double grad_norm = 0;           // before clipping, when StepOptions::clip_grad_norm > 0
  // Device memory (allocator.h: everything counted except the dataset held in host memory).
  int64_t baseline_bytes = 0;     // live when the step began
  int64_t forward_end_bytes = 0;  // live when forward returned
  int64_t peak_bytes = 0;         // measured peak during the step
  memory::Stats memory;           // the allocator after the step: per-category breakdown at the peak
  // The memory runtime's work this step.
  double recompute_ms = 0;        // re-running producers of dropped values in backward
  int64_t recomputed_nodes = 0;
  int64_t dropped_values = 0;     // saved values the plan dropped
  int64_t offloaded_values = 0;   // saved values the plan offloaded
  memory::OffloadStats offload;   // the offload engine's totals since the runtime was built
  // Set when the runtime re-planned after this step because it measured over the budget: a note for the user.
  std::string replan_note;
  // Parameters' gradients by name, with GradientsAfter::Collected.
  std::vector<std::pair<std::string, at::Tensor>> gradients;

  int64_t peak_above_baseline() const { return peak_bytes - baseline_bytes; }
};

// Per-step hooks, called in registration order. The caller owns the hook and keeps it alive while the
// runtime runs steps.
class StepHook {
 public:
  virtual ~StepHook() = default;
  virtual void before_forward(int64_t step, data::Batch& batch) {}
  // Forward returned the loss; backward has not started.
  virtual void after_forward(int64_t step, const Value& loss) {}
  // During backward, once per parameter when its gradient is complete.
  virtual void gradient_ready(const std::string& param_name, ValueImpl& param) {}
  virtual void after_backward(int64_t step) {}
  // Before clipping and the optimiser's update (only when the step runs an optimiser).
  virtual void before_optimizer(int64_t step) {}
  virtual void after_step(int64_t step, const StepStats& stats) {}
};

// A step whose forward and backward run in pieces (truncated backpropagation through time: one piece
// per chunk of the sequence, docs/METHODS.md, "Temporal-dependency buffers for sequence models"). Each
// piece's loss is backpropagated before the next piece's forward runs, so the graph never spans more than
// one piece; the gradients of all pieces accumulate and the step then updates once. The pieces' losses
// are weighted so that they sum to the step's loss.
class PiecewiseLoss {
 public:
  virtual ~PiecewiseLoss() = default;
  // Starts a step on `batch`; returns the number of pieces (>= 1).
  virtual int64_t begin(models::Model& model, const data::Batch& batch) = 0;
  // The loss of piece `piece` (0 .. begin()-1, called in order), as a graph value to backpropagate.
  virtual Value piece_loss(int64_t piece) = 0;
};

}  // namespace ration::train
