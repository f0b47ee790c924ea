// schedule.h — the learning-rate schedule: linear warm-up, then cosine decay to a floor.
// Owns: lr(step) as a pure function of the step (so resuming at step s needs no schedule state):
//   step <  warmup_steps:           lr = max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total:   p = (step - warmup_steps) / (total_steps - warmup_steps)
//                                   lr = min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2
//   step >= total_steps:            lr = min_lr
// Steps count from 0 (the first optimiser step is step 0), so warm-up never hands out lr = 0, the last
// warm-up step reaches max_lr, and the first decay step is max_lr again. warmup_steps = 0 gives pure
// cosine decay; min_lr = max_lr gives a constant rate after warm-up.
#pragma once
#include <cstdint>

namespace ration::optim {

class Optimizer;

class WarmupCosine {
 public:
  WarmupCosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);
  double lr(int64_t step) const;
  // Sets the optimiser's learning rate for `step` and returns it.
  double apply(Optimizer& optimizer, int64_t step) const;


 private:
  double max_lr_;
  double min_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace ration::optim
