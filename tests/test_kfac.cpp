// test_kfac.cpp — K-FAC (distributed/kfac.h) in one process against its definition computed with ATen and
// libtorch's autograd: a conv -> linear classifier; the factors A (from the inputs, a conv's im2col patches,
// a column of ones for the bias) and G (from the output gradients that libtorch's autograd retains, scaled
// to per-sample losses), their damped inverses, and the preconditioned gradients with KL clipping, all
// within 1e-5. The multi-rank equality (N ranks on shards == one process on the global batch) is in
// tests/distributed/ps_modes_worker.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "ration/distributed/kfac.h"
#include "ration/nn/layers.h"
#include "ration/nn/observe.h"
#include "ration/ops/ops.h"

namespace ration::dist {
namespace {

struct Net : nn::Module {
  Net() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(1, 2, 3, 1, 1));
    fc = register_module("fc", std::make_shared<nn::Linear>(2 * 5 * 5, 3));
  }
  Value loss(const at::Tensor& x, const at::Tensor& t) {
    const Value h = ops::flatten(ops::relu(conv->forward(Value(x))), 1, -1);
    return ops::cross_entropy(fc->forward(h), Value(t));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::Linear> fc;
};

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         std::max(b.to(at::kDouble).abs().max().item<double>(), 1e-30);
}

at::Tensor damped_inverse(const at::Tensor& m, double damping) {
  return at::inverse(m.to(at::kDouble) + std::sqrt(damping) * at::eye(m.size(0), at::kDouble));
}

TEST(Kfac, FactorsAndNaturalGradientMatchTheirDefinition) {
  at::manual_seed(3);
  Net net;
  const int64_t b = 4;
  const at::Tensor x = at::randn({b, 1, 5, 5}), t = at::tensor({0, 2, 1, 2}, at::kLong);
  const KfacOptions options{1, 0.01, 0.95, 1e-2};
  Kfac kfac(World::init_single(), net.named_parameters(), options);
  ASSERT_TRUE(kfac.collects(0));
  kfac.begin_statistics();
  {
    nn::LayerObserverScope scope(&kfac);
    net.loss(x, t).backward();
  }
  const at::Tensor dw1 = net.conv->weight.grad().clone(), db1 = net.conv->bias.grad().clone();
  const at::Tensor dw2 = net.fc->weight.grad().clone(), db2 = net.fc->bias.grad().clone();
  const double lr = 0.5;
  kfac.precondition(0, lr);

  // The reference: the same forward under libtorch's autograd, output gradients retained.
  const at::Tensor w1 = net.conv->weight.tensor().detach().clone().requires_grad_(true);
  const at::Tensor b1 = net.conv->bias.tensor().detach().clone().requires_grad_(true);
  const at::Tensor w2 = net.fc->weight.tensor().detach().clone().requires_grad_(true);
  const at::Tensor b2 = net.fc->bias.tensor().detach().clone().requires_grad_(true);
  at::Tensor y1 = at::conv2d(x, w1, b1, 1, 1);
  y1.retain_grad();
  const at::Tensor h = at::relu(y1).flatten(1);
  at::Tensor y2 = at::linear(h, w2, b2);
  y2.retain_grad();
  at::cross_entropy_loss(y2, t).backward();
  // Conv: patches (B T, 9) and a ones column; output gradients (B T, 2) times B T.
  const at::Tensor patches = at::im2col(x, {3, 3}, {1, 1}, {1, 1}, {1, 1}).transpose(1, 2).reshape({-1, 9});
  const at::Tensor a1 = at::cat({patches, at::ones({patches.size(0), 1})}, 1).to(at::kDouble);
  const at::Tensor g1 = y1.grad().permute({0, 2, 3, 1}).reshape({-1, 2}).to(at::kDouble) * (b * 25);
  const at::Tensor A1 = a1.t().mm(a1) / a1.size(0), G1 = g1.t().mm(g1) / g1.size(0);
  // Linear: inputs (B, 50) and a ones column; output gradients (B, 3) times B.
  const at::Tensor a2 = at::cat({h.detach(), at::ones({b, 1})}, 1).to(at::kDouble);
  const at::Tensor g2 = y2.grad().to(at::kDouble) * b;
  const at::Tensor A2 = a2.t().mm(a2) / b, G2 = g2.t().mm(g2) / b;

  const auto& f = kfac.factors();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_LE(rel(f.at("conv").a, A1), 1e-5);
  EXPECT_LE(rel(f.at("conv").g, G1), 1e-5);
  EXPECT_LE(rel(f.at("fc").a, A2), 1e-5);
  EXPECT_LE(rel(f.at("fc").g, G2), 1e-5);
  EXPECT_LE(rel(f.at("fc").a_inv, damped_inverse(A2, options.damping)), 1e-5);
  EXPECT_LE(rel(f.at("conv").g_inv, damped_inverse(G1, options.damping)), 1e-5);

  // Natural gradients, KL-clipped together.
  const at::Tensor grad1 = at::cat({dw1.reshape({2, 9}), db1.reshape({2, 1})}, 1).to(at::kDouble);
  const at::Tensor grad2 = at::cat({dw2, db2.reshape({3, 1})}, 1).to(at::kDouble);
  const at::Tensor n1 = damped_inverse(G1, options.damping).mm(grad1).mm(damped_inverse(A1, options.damping));
  const at::Tensor n2 = damped_inverse(G2, options.damping).mm(grad2).mm(damped_inverse(A2, options.damping));
  const double inner = (n1 * grad1).sum().item<double>() + (n2 * grad2).sum().item<double>();
  const double nu = std::min(1.0, std::sqrt(options.kl_clip / (lr * lr * inner)));
  EXPECT_NEAR(kfac.last_nu(), nu, 1e-5 * nu);
  EXPECT_LT(nu, 1.0) << "the test exercises the clipping";
  EXPECT_LE(rel(net.conv->weight.grad().reshape({2, 9}), n1.narrow(1, 0, 9) * nu), 1e-5);
  EXPECT_LE(rel(net.conv->bias.grad(), n1.narrow(1, 9, 1).reshape({2}) * nu), 1e-5);
  EXPECT_LE(rel(net.fc->weight.grad(), n2.narrow(1, 0, 50) * nu), 1e-5);
  EXPECT_LE(rel(net.fc->bias.grad(), n2.narrow(1, 50, 1).reshape({3}) * nu), 1e-5);
}

// Without an installed observer nothing is recorded and no op is added; a step that does not collect
// reuses the last inverses; the running factors decay.
TEST(Kfac, StatisticsOnlyWhenCollectingAndRunningAverages) {
  at::manual_seed(4);
  Net net;
  const at::Tensor x = at::randn({3, 1, 5, 5}), t = at::tensor({0, 1, 2}, at::kLong);
  Kfac kfac(World::init_single(), net.named_parameters(), {2, 0.01, 0.5, 0});
  net.loss(x, t).backward();  // no observer installed: nothing seen
  kfac.precondition(0, 0.1);
  EXPECT_TRUE(kfac.factors().empty());
  for (auto& [n, p] : net.named_parameters()) p.impl()->grad = at::Tensor();
  auto collect = [&](int64_t step, const at::Tensor& input) {
    kfac.begin_statistics();
    nn::LayerObserverScope scope(&kfac);
    net.loss(input, t).backward();
  };
  collect(0, x);
  kfac.precondition(0, 0.1);
  const at::Tensor a0 = kfac.factors().at("fc").a.clone();
  EXPECT_FALSE(kfac.collects(1));
  EXPECT_TRUE(kfac.collects(2));
  const at::Tensor x2 = at::randn({3, 1, 5, 5});
  collect(2, x2);
  for (auto& [n, p] : net.named_parameters()) p.impl()->grad = at::zeros_like(p.tensor());
  kfac.precondition(2, 0.1);
  Kfac fresh(World::init_single(), net.named_parameters(), {1, 0.01, 0.5, 0});
  fresh.begin_statistics();
  {
    nn::LayerObserverScope scope(&fresh);
    net.loss(x2, t).backward();
  }
  fresh.precondition(0, 0.1);
  EXPECT_LE(rel(kfac.factors().at("fc").a, (a0 + fresh.factors().at("fc").a) / 2), 1e-6) << "decay 0.5";
  EXPECT_EQ(kfac.updates(), 2);
}

}  // namespace
}  // namespace ration::dist
