// es_step.cpp — evolution strategies: shared noise, antithetic pairs, one all-reduce of losses (see es_step.h).
#include "ration/train/es_step.h"

#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ration/base/check.h"
#include "ration/core/value.h"

namespace ration::train {

EsStep::EsStep(dist::World world, optim::NamedParams params, EsSettings settings, uint64_t seed)
    : world_(std::move(world)), params_(std::move(params)), settings_(settings), seed_(seed) {}

std::vector<at::Tensor> EsStep::noise(int64_t step, int64_t pair) const {
  // One generator per (seed, step, pair): every rank draws the same eps_i without a message.
  at::Generator gen = at::detail::createCPUGenerator(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 1000003ull +
                                                     static_cast<uint64_t>(pair));
  std::vector<at::Tensor> eps;
  for (const auto& [name, p] : params_) eps.push_back(at::randn(p.tensor().sizes(), gen, at::kFloat));
  return eps;
}

void EsStep::add_noise(const std::vector<at::Tensor>& eps, double scale) {
  for (size_t k = 0; k < params_.size(); ++k) params_[k].second.impl()->tensor.add_(eps[k], scale);
}

double EsStep::estimate(models::Model& model, const data::Batch* batch, int64_t step) {
  at::NoGradGuard no_grad;
  NoGradGuard no_graph;
  const int64_t pairs = settings_.population / 2;
  const int n = world_.size(), rank = world_.rank();
  at::Tensor losses = at::zeros({2 * pairs}, at::kFloat);  // (+, -) per pair; this rank fills its pairs
  std::vector<at::Tensor> saved;
  for (const auto& [name, p] : params_) saved.push_back(p.tensor().clone());
  for (int64_t i = rank; batch != nullptr && i < pairs; i += n) {
    const std::vector<at::Tensor> eps = noise(step, i);
    add_noise(eps, settings_.sigma);
    losses[2 * i] = model.loss(*batch).tensor().item<float>();
    add_noise(eps, -2 * settings_.sigma);
    losses[2 * i + 1] = model.loss(*batch).tensor().item<float>();
    for (size_t k = 0; k < params_.size(); ++k) params_[k].second.impl()->tensor.copy_(saved[k]);  // exact
  }
  world_.all_reduce_sum(losses);  // the only message: 2 * pairs floats
  std::vector<at::Tensor> grad;
  for (const auto& [name, p] : params_) grad.push_back(at::zeros_like(p.tensor()));
  const auto* l = losses.data_ptr<float>();
  for (int64_t i = 0; i < pairs; ++i) {
    const double coefficient = (static_cast<double>(l[2 * i]) - l[2 * i + 1]) / (2 * settings_.sigma * pairs);
    const std::vector<at::Tensor> eps = noise(step, i);
    for (size_t k = 0; k < grad.size(); ++k) grad[k].add_(eps[k], coefficient);
  }
  for (size_t k = 0; k < params_.size(); ++k) params_[k].second.impl()->grad = grad[k];
  return losses.sum().item<double>() / static_cast<double>(2 * pairs);
}

}  // namespace ration::train
