// sgd.cpp — the SGD update (see sgd.h for the rule; the op sequence mirrors torch.optim.SGD's).
#include "ration/optim/sgd.h"

#include "ration/base/check.h"

namespace ration::optim {

SGD::SGD(NamedParams params, SGDOptions options) : Optimizer(std::move(params), options.lr), options_(options) {
  RATION_CHECK(options.momentum >= 0, "SGD momentum must be >= 0, got ", options.momentum);
  RATION_CHECK(options.weight_decay >= 0, "SGD weight_decay must be >= 0, got ", options.weight_decay);
  RATION_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
               "Nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ", options.momentum,
               ", dampening ", options.dampening, ")");
}

void SGD::update(size_t index, at::Tensor& param, const at::Tensor& grad) {
  at::Tensor d_p = grad;
  if (options_.weight_decay != 0) d_p = d_p.add(param, options_.weight_decay);
  if (options_.momentum != 0) {
    bool created = false;
    at::Tensor& buf = slot(index, "momentum_buffer", &created);
    if (created) buf.copy_(d_p);  // torch: buf = clone(d_p)
    else buf.mul_(options_.momentum).add_(d_p, 1 - options_.dampening);
    d_p = options_.nesterov ? d_p.add(buf, options_.momentum) : buf;
  }
  param.add_(d_p, -lr());
}

}  // namespace ration::optim
