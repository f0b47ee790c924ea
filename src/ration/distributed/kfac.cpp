// kfac.cpp — K-FAC statistics, factors, inverses over ranks, preconditioning (see kfac.h).
#include "ration/distributed/kfac.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "ration/base/check.h"
#include "ration/core/value.h"
#include "ration/nn/layers.h"

namespace ration::dist {
namespace {

// Rows of `x` (M, k) with a column of ones appended when `bias`.
at::Tensor with_ones(const at::Tensor& x, bool bias) {
  if (!bias) return x;
  return at::cat({x, at::ones({x.size(0), 1}, x.options())}, 1);
}

constexpr const char* kWeight = ".weight";

}  // namespace

Kfac::Kfac(World world, optim::NamedParams params, KfacOptions options)
    : world_(std::move(world)), options_(options) {
  RATION_CHECK(options_.update_every >= 1 && options_.damping > 0 && options_.stat_decay >= 0 &&
                   options_.stat_decay < 1 && options_.kl_clip >= 0,
               "K-FAC: optim.kfac_update_every must be >= 1, optim.kfac_damping > 0, optim.kfac_stat_decay in [0, 1) "
               "and optim.kfac_kl_clip >= 0");
  for (const auto& [name, p] : params) {
    const size_t n = name.size();
    if (n > 7 && name.compare(n - 7, 7, kWeight) == 0 && (p.dim() == 2 || p.dim() == 4))
      weights_.emplace(name.substr(0, n - 7), p);
    if (n > 5 && name.compare(n - 5, 5, ".bias") == 0) biases_.emplace(name.substr(0, n - 5), p);
  }
}

bool Kfac::collects(int64_t step) const { return updates_ == 0 || step % options_.update_every == 0; }

void Kfac::begin_statistics() {
  std::lock_guard<std::mutex> lock(mu_);
  sums_.clear();
}

void Kfac::linear_input(const std::string& layer, const at::Tensor& x) {
  if (!weights_.count(layer)) return;
  at::NoGradGuard no_grad;
  const at::Tensor a = with_ones(x.detach().reshape({-1, x.size(-1)}).to(at::kDouble), biases_.count(layer) > 0);
  std::lock_guard<std::mutex> lock(mu_);
  Sums& s = sums_[layer];
  const at::Tensor outer = a.t().mm(a);  // (in+1, in+1)
  s.a = s.a.defined() ? s.a.add_(outer) : outer;
  s.a_count += static_cast<double>(a.size(0));
}

void Kfac::conv_input(const std::string& layer, const nn::Conv2d& conv, const at::Tensor& x) {
  if (!weights_.count(layer)) return;
  at::NoGradGuard no_grad;
  const int64_t k = conv.kernel_size;
  // (B, C_in k k, T): one column per output position, in the order conv2d's weight is flattened.
  const at::Tensor patches = at::im2col(x.detach().to(at::kDouble), {k, k}, {1, 1}, {conv.padding, conv.padding},
                                        {conv.stride, conv.stride});
  const at::Tensor rows = patches.transpose(1, 2).reshape({-1, patches.size(1)});  // (B T, C_in k k)
  const at::Tensor a = with_ones(rows, biases_.count(layer) > 0);
  std::lock_guard<std::mutex> lock(mu_);
  Sums& s = sums_[layer];
  const at::Tensor outer = a.t().mm(a);
  s.a = s.a.defined() ? s.a.add_(outer) : outer;
  s.a_count += static_cast<double>(a.size(0));
  s.conv = true;
}

void Kfac::output_grad(const std::string& layer, const at::Tensor& g) {
  if (!weights_.count(layer)) return;
  at::NoGradGuard no_grad;
  bool conv = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conv = sums_[layer].conv;
  }
  // A conv's (B, C_out, H', W') -> (B T, C_out), a linear's (..., out) -> (M, out); either way times its
  // rows: the per-row loss's gradient (for a conv B T, kfac-pytorch's scaling).
  const at::Tensor d = g.detach().to(at::kDouble);
  const at::Tensor rows = conv ? d.permute({0, 2, 3, 1}).reshape({-1, g.size(1)}) : d.reshape({-1, g.size(-1)});
  const at::Tensor hat = rows * static_cast<double>(rows.size(0));
  const at::Tensor outer = hat.t().mm(hat);  // (out, out)
  std::lock_guard<std::mutex> lock(mu_);
  Sums& s = sums_[layer];
  s.g = s.g.defined() ? s.g.add_(outer) : outer;
  s.g_count += static_cast<double>(rows.size(0));
}

// One all-reduce of every observed layer's sums and counts (sorted by layer: the same order everywhere),
// the step's means folded into the running factors, then the inverses, each on its owner rank.
bool Kfac::update_factors() {
  std::vector<std::string> layers;
  std::vector<at::Tensor> flat;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [layer, s] : sums_) {
      RATION_CHECK(s.a.defined() && s.g.defined(), "K-FAC: layer '", layer,
                   "' was seen in forward but got no output gradient (is it on the loss's path?)");
      layers.push_back(layer);
      flat.push_back(s.a.reshape({-1}));
      flat.push_back(s.g.reshape({-1}));
      flat.push_back(at::tensor({s.a_count, s.g_count}, at::kDouble));
    }
  }
  if (layers.empty()) return false;
  at::Tensor all = at::cat(flat);
  world_.all_reduce_sum(all);  // every rank's sums: the global batch's
  int64_t offset = 0;
  const bool first = updates_ == 0;
  for (size_t j = 0; j < layers.size(); ++j) {
    const Sums& s = sums_[layers[j]];
    const int64_t na = s.a.numel(), ng = s.g.numel();
    const at::Tensor a_sum = all.narrow(0, offset, na).view(s.a.sizes());
    const at::Tensor g_sum = all.narrow(0, offset + na, ng).view(s.g.sizes());
    const double a_count = all[offset + na + ng].item<double>(), g_count = all[offset + na + ng + 1].item<double>();
    offset += na + ng + 2;
    const at::Tensor a = (a_sum / a_count).to(at::kFloat), g = (g_sum / g_count).to(at::kFloat);
    Factors& f = factors_[layers[j]];
    if (first || !f.a.defined()) {
      f.a = a;
      f.g = g;
    } else {
      f.a.mul_(options_.stat_decay).add_(a, 1 - options_.stat_decay);
      f.g.mul_(options_.stat_decay).add_(g, 1 - options_.stat_decay);
    }
    // Layer j's inverses on rank j mod N, then every rank takes them from there.
    const int owner = static_cast<int>(j % static_cast<size_t>(world_.size()));
    if (world_.rank() == owner) {
      invert(layers[j], f);
    } else {
      f.a_inv = at::empty_like(f.a);
      f.g_inv = at::empty_like(f.g);
    }
    world_.broadcast(f.a_inv, owner);
    world_.broadcast(f.g_inv, owner);
  }
  return true;
}

void Kfac::invert(const std::string& layer, Factors& f) {
  const double d = std::sqrt(options_.damping);
  auto inverse = [&](const at::Tensor& m) {
    const at::Tensor damped = m.to(at::kDouble) + d * at::eye(m.size(0), at::kDouble);
    return at::cholesky_inverse(at::linalg_cholesky(damped)).to(at::kFloat).contiguous();
  };
  f.a_inv = inverse(f.a);
  f.g_inv = inverse(f.g);
}

void Kfac::precondition(int64_t step, double lr) {
  at::NoGradGuard no_grad;
  if (collects(step) && update_factors()) ++updates_;
  if (factors_.empty()) return;
  struct Natural {
    Value w, b;
    at::Tensor grad, natural;  // (out, in[+1])
  };
  std::vector<Natural> layers;
  double inner = 0;
  for (const auto& [layer, f] : factors_) {
    Natural n{weights_.at(layer), biases_.count(layer) ? biases_.at(layer) : Value(), {}, {}};
    if (!n.w.impl()->grad.defined()) continue;
    const at::Tensor dw = n.w.impl()->grad.reshape({n.w.size(0), -1});
    n.grad = n.b.defined() && n.b.impl()->grad.defined() ? at::cat({dw, n.b.impl()->grad.reshape({-1, 1})}, 1) : dw;
    RATION_CHECK(n.grad.size(1) == f.a_inv.size(0) && n.grad.size(0) == f.g_inv.size(0), "K-FAC: layer '", layer,
                 "' has a gradient of ", n.grad.sizes(), " but factors of ", f.g_inv.size(0), " x ", f.a_inv.size(0));
    n.natural = f.g_inv.mm(n.grad).mm(f.a_inv);
    inner += (n.natural * n.grad).sum().item<double>();
    layers.push_back(std::move(n));
  }
  last_nu_ = options_.kl_clip > 0 && inner > 0 ? std::min(1.0, std::sqrt(options_.kl_clip / (lr * lr * inner))) : 1.0;
  for (Natural& n : layers) {
    const int64_t in = n.w.impl()->grad.numel() / n.w.size(0);
    n.w.impl()->grad.copy_(n.natural.narrow(1, 0, in).mul(last_nu_).view(n.w.impl()->grad.sizes()));
    if (n.grad.size(1) > in) n.b.impl()->grad.copy_(n.natural.narrow(1, in, 1).mul(last_nu_).view(n.b.impl()->grad.sizes()));
  }
}

int64_t Kfac::state_bytes() const {
  int64_t total = 0;
  for (const auto& [layer, f] : factors_) total += 4 * 2 * (f.a.numel() + f.g.numel());
  return total;
}

}  // namespace ration::dist
