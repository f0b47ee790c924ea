// clip.cpp — gradient-norm clipping (see clip.h); the op sequence mirrors torch.nn.utils.clip_grad_norm_.
#include "ration/optim/clip.h"

#include <ATen/core/grad_mode.h>
#include <cmath>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::optim {
namespace {

// Gradients that exist.
std::vector<at::Tensor> defined_grads(const std::vector<Value>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

// Per-gradient norms (0-dim tensors; the max absolute entry for p = inf).
std::vector<at::Tensor> norms_of(const std::vector<at::Tensor>& grads, double norm_type) {
  RATION_CHECK(norm_type > 0, "gradient norm type must be > 0 (or inf), got ", norm_type);
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(std::isinf(norm_type) ? g.abs().max() : at::norm(g, norm_type));
  return norms;
}

// Scalar tensor: the norm of the per-gradient norms (or the max for p = inf).
at::Tensor total_of(const std::vector<at::Tensor>& norms, double norm_type) {
  if (norms.size() == 1) return norms[0];
  return std::isinf(norm_type) ? at::stack(norms).max() : at::norm(at::stack(norms), norm_type);
}

}  // namespace

double clip_grad_norm(const std::vector<Value>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip_by_norms(params, max_norm, gradient_norms(params, norm_type), norm_type, error_if_nonfinite);
}

std::vector<at::Tensor> gradient_norms(const std::vector<Value>& params, double norm_type) {
  at::NoGradGuard no_grad;
  memory::CategoryGuard workspace(memory::Category::Workspace);
  return norms_of(defined_grads(params), norm_type);
}

double clip_by_norms(const std::vector<Value>& params, double max_norm, const std::vector<at::Tensor>& all_norms,
                     double norm_type, bool error_if_nonfinite) {
  at::NoGradGuard no_grad;
  memory::CategoryGuard workspace(memory::Category::Workspace);
  if (all_norms.empty()) return 0.0;
  const at::Tensor total = total_of(all_norms, norm_type);
  const double total_value = total.item<double>();
  RATION_CHECK(!error_if_nonfinite || std::isfinite(total_value), "the total gradient norm (order ", norm_type,
               ") is ", total_value, ", so it cannot be clipped; hint: look for a NaN/inf loss, or pass "
               "error_if_nonfinite = false to scale anyway");
  const at::Tensor clip_coef = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (const auto& g : defined_grads(params)) g.mul_(clip_coef);  // shares storage with the parameter's grad
  return total_value;
}

double clip_grad_norm(const NamedParams& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  std::vector<Value> values;
  values.reserve(params.size());
  for (const auto& [name, v] : params) values.push_back(v);
  return clip_grad_norm(values, max_norm, norm_type, error_if_nonfinite);
}

double grad_norm(const std::vector<Value>& params, double norm_type) {
  at::NoGradGuard no_grad;
  memory::CategoryGuard workspace(memory::Category::Workspace);
  const std::vector<at::Tensor> grads = defined_grads(params);
  if (grads.empty()) return 0.0;
  return total_of(norms_of(grads, norm_type), norm_type).item<double>();
}

}  // namespace ration::optim
