// adamw.cpp — the AdamW update (see adamw.h for the rule; the op sequence mirrors torch.optim.AdamW's
// single-tensor path so results agree bit for bit).
#include "ration/optim/adamw.h"

#include <cmath>

#include "ration/base/check.h"

namespace ration::optim {

AdamW::AdamW(NamedParams params, AdamWOptions options) : Optimizer(std::move(params), options.lr), options_(options) {
  RATION_CHECK(options.beta1 >= 0 && options.beta1 < 1, "AdamW beta1 must be in [0, 1), got ", options.beta1);
  RATION_CHECK(options.beta2 >= 0 && options.beta2 < 1, "AdamW beta2 must be in [0, 1), got ", options.beta2);
  RATION_CHECK(options.eps >= 0, "AdamW eps must be >= 0, got ", options.eps);
  RATION_CHECK(options.weight_decay >= 0, "AdamW weight_decay must be >= 0, got ", options.weight_decay);
}

void AdamW::freeze_second_moment(int64_t after_step) {
  RATION_CHECK(after_step >= 0, "AdamW second moment freeze step must be >= 0, got ", after_step);
  freeze_after_ = after_step;
}

NamedTensors AdamW::denominators() {
  NamedTensors out;
  for (size_t i = 0; i < params().size(); ++i) {
    if (!has_slot(i, "exp_avg_sq")) continue;
    const auto step = static_cast<double>(slot(i, "step").item<int64_t>());
    const bool frozen = freeze_after_ > 0 && step >= static_cast<double>(freeze_after_);
    const double t = frozen ? static_cast<double>(freeze_after_) : step;
    const at::Tensor& second_moment = options_.amsgrad ? slot(i, "max_exp_avg_sq") : slot(i, "exp_avg_sq");
    out.emplace_back(params()[i].first,
                     second_moment.sqrt().div_(std::sqrt(1 - std::pow(options_.beta2, t))).add_(options_.eps));
  }
  return out;
}

void AdamW::update(size_t index, at::Tensor& param, const at::Tensor& grad) {
  const double lr = this->lr();
  param.mul_(1 - lr * options_.weight_decay);

  at::Tensor& step_t = slot(index, "step");
  at::Tensor& exp_avg = slot(index, "exp_avg");        // (param shape)
  at::Tensor& exp_avg_sq = slot(index, "exp_avg_sq");  // (param shape)
  step_t.add_(1);
  const auto step = static_cast<double>(step_t.item<int64_t>());

  exp_avg.mul_(options_.beta1).add_(grad, 1 - options_.beta1);
  const bool frozen = freeze_after_ > 0 && step > static_cast<double>(freeze_after_);
  if (!frozen) exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);

  const double bias_correction1 = 1 - std::pow(options_.beta1, step);
  const double bias_correction2 = 1 - std::pow(options_.beta2, frozen ? static_cast<double>(freeze_after_) : step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  at::Tensor second_moment = exp_avg_sq;
  if (options_.amsgrad && !frozen) {
    at::Tensor& max_exp_avg_sq = slot(index, "max_exp_avg_sq");  // (param shape)
    at::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
    second_moment = max_exp_avg_sq;
  } else if (options_.amsgrad) {
    second_moment = slot(index, "max_exp_avg_sq");
  }
  at::Tensor denom = second_moment.sqrt().div_(bias_correction2_sqrt).add_(options_.eps);  // (param shape)
  param.addcdiv_(exp_avg, denom, -step_size);
}

}  // namespace ration::optim
