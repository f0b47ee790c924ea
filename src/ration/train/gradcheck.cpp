#include "ration/train/gradcheck.h"

#include <algorithm>

#include "ration/core/node.h"

namespace ration {
namespace {

std::vector<std::pair<std::string, at::Tensor>> collect_grads(models::Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : model.named_parameters()) {
    out.emplace_back(name, p.grad().defined() ? p.grad().clone() : at::zeros_like(p.tensor()));
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> engine_gradients(models::Model& model, const data::Batch& batch,
                                                                 uint64_t seed, double* loss) {
  const auto buffers = model.snapshot_buffers();
  model.zero_grad();
  manual_seed(seed);
  Value l = model.loss(batch);
  if (loss) *loss = l.item();
  l.backward();
  model.restore_buffers(buffers);
  auto grads = collect_grads(model);
  model.zero_grad();
  return grads;
}

GradcheckResult gradcheck(models::Model& model, const data::Batch& batch, uint64_t seed, double tolerance) {
  GradcheckResult result;
  const auto ours = engine_gradients(model, batch, seed, &result.loss_ours);

  const auto buffers = model.snapshot_buffers();
  model.zero_grad();
  std::vector<std::pair<std::string, at::Tensor>> theirs;
  {
    OracleScope scope(model.parameters());
    manual_seed(seed);
    Value l = model.loss(batch);
    result.loss_torch = l.item();
    l.backward();
  }
  model.restore_buffers(buffers);
  theirs = collect_grads(model);
  model.zero_grad();

  for (size_t i = 0; i < ours.size(); ++i) {
    ParamGradError e;
    e.name = ours[i].first;
    const at::Tensor a = ours[i].second.to(at::kDouble);
    const at::Tensor b = theirs[i].second.to(at::kDouble);
    e.shape = a.sizes().vec();
    e.max_abs_error = (a - b).abs().max().item<double>();
    e.max_rel_error = e.max_abs_error / std::max(b.abs().max().item<double>(), 1e-12);
    e.bitwise_equal = at::equal(ours[i].second, theirs[i].second);
    result.worst_rel_error = std::max(result.worst_rel_error, e.max_rel_error);
    result.params.push_back(std::move(e));
  }
  result.passed = result.worst_rel_error <= tolerance;
  return result;
}

}  // namespace ration
