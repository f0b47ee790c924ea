// schedule.cpp — warm-up + cosine learning-rate schedule (see schedule.h for the formula).
#include "ration/optim/schedule.h"

#include <cmath>

#include "ration/base/check.h"
#include "ration/optim/optimizer.h"

namespace ration::optim {

WarmupCosine::WarmupCosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : max_lr_(max_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  RATION_CHECK(max_lr >= 0 && min_lr >= 0 && min_lr <= max_lr, "schedule needs 0 <= min_lr <= max_lr, got min_lr ",
               min_lr, ", max_lr ", max_lr);
  RATION_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, "schedule needs 0 <= warmup_steps <= total_steps, got ",
               "warmup_steps ", warmup_steps, ", total_steps ", total_steps);
}

double WarmupCosine::lr(int64_t step) const {
  RATION_CHECK(step >= 0, "learning-rate schedule asked for negative step ", step);
  if (step < warmup_steps_) return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  if (step >= total_steps_) return min_lr_;
  const double progress =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double WarmupCosine::apply(Optimizer& optimizer, int64_t step) const {
  const double value = lr(step);
  optimizer.set_lr(value);
  return value;
}

}  // namespace ration::optim
