#include "ration/train/gradcheck.h"

#include <algorithm>

#include "ration/core/node.h"

namespace ration {

train::StepStats engine_step(train::StepRuntime& runtime, models::Model& model, const data::Batch& batch,
                             uint64_t seed) {
  model.zero_grad();
  train::StepOptions o;
  o.seed = seed;
  o.gradients = train::GradientsAfter::Collected;
  o.buffers = train::BuffersAfter::Restored;
  return runtime.measure_step(model, batch, o);
}

GradcheckResult gradcheck(train::StepRuntime& runtime, models::Model& model, const data::Batch& batch, uint64_t seed,
                          double tolerance) {
  GradcheckResult result;
  const train::StepStats ours = engine_step(runtime, model, batch, seed);
  result.loss_ours = ours.loss;

  const auto buffers = model.snapshot_buffers();
  model.zero_grad();
  {
    OracleScope scope(model.parameters());
    manual_seed(seed);
    Value l = model.loss(batch);
    result.loss_torch = l.item();
    l.backward();
  }
  model.restore_buffers(buffers);
  std::vector<at::Tensor> theirs;
  for (auto& [name, p] : model.named_parameters())
    theirs.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p.tensor()));
  model.zero_grad();

  for (size_t i = 0; i < ours.gradients.size(); ++i) {
    ParamGradError e;
    e.name = ours.gradients[i].first;
    const at::Tensor a = ours.gradients[i].second.to(at::kDouble);
    const at::Tensor b = theirs[i].to(at::kDouble);
    e.shape = a.sizes().vec();
    e.max_abs_error = (a - b).abs().max().item<double>();
    e.max_rel_error = e.max_abs_error / std::max(b.abs().max().item<double>(), 1e-12);
    e.bitwise_equal = at::equal(ours.gradients[i].second, theirs[i]);
    result.worst_rel_error = std::max(result.worst_rel_error, e.max_rel_error);
    result.params.push_back(std::move(e));
  }
  result.passed = result.worst_rel_error <= tolerance;
  return result;
}

}  // namespace ration
