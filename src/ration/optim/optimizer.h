// optimizer.h — the base of every optimiser: named parameters, step/zero_grad, learning rate, and the
// per-parameter state as named tensors (for checkpoints).
// Owns: the step loop (skip parameters without a gradient, update in place under no-grad), lazy state
//       creation (counted as memory::Category::Optimizer), state export/import with validation.
// Does not own: the update rule (sgd.h, adamw.h), the learning-rate schedule (schedule.h), or how the
//       state reaches disk (train/checkpoint.h).
//
// State naming (export_state / import_state):
//   "optim.step"                  int64 scalar: completed step() calls
//   "optim.lr"                    float64 scalar: the current learning rate
//   "optim.<param>.<slot>"        the slot of one parameter, e.g. "optim.fc1.weight.exp_avg"
// Slots are created the first time a parameter is updated, so a parameter that never had a gradient has
// none. Slot tensors have the parameter's shape unless the optimiser says otherwise (AdamW's "step").
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ration/core/value.h"

namespace ration::optim {

using NamedParams = std::vector<std::pair<std::string, Value>>;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Optimizer {
 public:
  Optimizer(NamedParams params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter whose grad() is defined, in place, under no-grad (ration's and torch's).
  void step();
  // Gradients to undefined (set_to_none, the cheapest: the next backward allocates them afresh) or to zero.
  void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const { return step_count_; }
  const NamedParams& params() const { return params_; }
  virtual const char* name() const = 0;
  // Bytes of state the optimiser holds once every parameter has been updated (all its slots), and the part
  // of that not allocated yet (less the optimiser memory live now): what a plan made before the first
  // step must leave room for.
  virtual int64_t state_bytes() const = 0;
  int64_t unseen_state_bytes() const;
  // Measured: the workspace bytes one update of the largest parameter allocates beyond the parameter, its
  // gradient and its state (AdamW's and SGD's temporaries). Updates run one parameter at a time, so this is
  // what step() adds to the memory live after backward (a plan must leave room for it). Runs two updates
  // (the first may create the state) on copies; the parameters and the state are left as they were.
  int64_t update_workspace_bytes();

  // Flat, named view of the state (no copies) (see the header comment for names). Tensors are the live
  // state; clone them if the optimiser keeps stepping while you hold them.
  NamedTensors export_state() const;
  // Replace the whole state. Throws ration::Error naming the entry on an unknown parameter or slot, a
  // shape mismatch, or a missing "optim.step". Tensors are copied (to the parameter's dtype/device).
  void import_state(const NamedTensors& state);

 protected:
  // Update parameter `index` in place from `grad` (same shape). Called under no-grad and with
  // memory::Category::Workspace active; create state with slot().
  virtual void update(size_t index, at::Tensor& param, const at::Tensor& grad) = 0;
  // Slots this optimiser may hold for a parameter (checked on import).
  virtual std::vector<std::string> slot_names() const = 0;
  // Shape a slot's tensor must have: the parameter's, unless overridden (e.g. scalar step counters).
  virtual bool slot_is_scalar(const std::string& slot) const { return false; }

  // The state tensor `slot` of parameter `index`; `created` says whether it existed before this call.
  // New slots are zeros_like(param) (or a zero int64 scalar for scalar slots), allocated as Optimizer memory.
  at::Tensor& slot(size_t index, const std::string& slot, bool* created = nullptr);
  bool has_slot(size_t index, const std::string& slot) const;
  // The bytes of the parameters' own tensors (each slot the size of its parameter).
  int64_t parameter_bytes() const;

 private:
  NamedParams params_;
  double lr_;
  int64_t step_count_ = 0;
  std::vector<std::map<std::string, at::Tensor>> state_;  // per parameter: slot -> tensor
};

}  // namespace ration::optim
