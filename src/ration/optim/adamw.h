// adamw.h — Adam with decoupled weight decay (Loshchilov & Hutter), exactly torch.optim.AdamW's
// single-tensor update (PyTorch 1.13), per parameter p with gradient g and its own step count t:
//   p = p * (1 - lr * weight_decay)
//   t = t + 1
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   v_max = max(v_max, v)                                           (amsgrad only; then v_max replaces v below)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p = p - lr / (1 - beta1^t) * m / denom
// Frozen second moment (freeze_second_moment(K), used by data-parallel 1-bit compression, see
// docs/METHODS.md, "Distributed training"): from a parameter's step K+1 on, v (and v_max) are no longer
// updated and the bias correction keeps its step-K value, so denom stays the one of step K; m and the
// parameter update as above. K = 0 (the default) never freezes.
// State slots: "step" (int64 scalar; per parameter, as in PyTorch, so a parameter skipped for lack of a
// gradient keeps its own bias correction), "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad only).
#pragma once
#include "ration/optim/optimizer.h"

namespace ration::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(NamedParams params, AdamWOptions options);
  const char* name() const override { return "AdamW"; }
  // exp_avg and exp_avg_sq (and max_exp_avg_sq with amsgrad) per parameter, and its int64 step.
  int64_t state_bytes() const override {
    return (options_.amsgrad ? 3 : 2) * parameter_bytes() + static_cast<int64_t>(params().size()) * 8;
  }
  // From each parameter's step `after_step` + 1 on, keep its second moment (and denom) as they were after
  // step `after_step` (0: track it every step, the default). Deterministic from the step count, so a
  // resumed run needs no extra state.
  void freeze_second_moment(int64_t after_step);
  // Per parameter that has state: the denominator its next update divides by, sqrt(v) /
  // sqrt(1 - beta2^t) + eps with t its step (its freeze step when frozen), as (param shape) float32.
  NamedTensors denominators();

 protected:
  void update(size_t index, at::Tensor& param, const at::Tensor& grad) override;
  std::vector<std::string> slot_names() const override {
    return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }
  bool slot_is_scalar(const std::string& slot) const override { return slot == "step"; }

 private:
  AdamWOptions options_;
  int64_t freeze_after_ = 0;
};

}  // namespace ration::optim
