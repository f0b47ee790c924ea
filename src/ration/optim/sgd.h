// sgd.h — stochastic gradient descent with momentum, dampening, Nesterov and (coupled) weight decay.
// Owns: the SGD update rule, exactly torch.optim.SGD's (PyTorch 1.13), per parameter p with gradient g:
//   g = g + weight_decay * p                                  (if weight_decay != 0)
//   buf = g (first step)  |  buf = momentum * buf + (1 - dampening) * g     (if momentum != 0)
//   g = g + momentum * buf (nesterov)  |  g = buf                           (if momentum != 0)
//   p = p - lr * g
// State slot: "momentum_buffer" (only when momentum != 0).
#pragma once
#include "ration/optim/optimizer.h"

namespace ration::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(NamedParams params, SGDOptions options);
  const char* name() const override { return "SGD"; }
  // A momentum buffer per parameter when momentum is on.
  int64_t state_bytes() const override { return options_.momentum != 0 ? parameter_bytes() : 0; }

 protected:
  void update(size_t index, at::Tensor& param, const at::Tensor& grad) override;
  std::vector<std::string> slot_names() const override { return {"momentum_buffer"}; }

 private:
  SGDOptions options_;
};

}  // namespace ration::optim
