// test_es.cpp — evolution strategies (train/es_step.h) in one process: the antithetic estimate of a
// quadratic loss is unbiased for its gradient (the quadratic terms cancel in each pair), so with many pairs
// it points along the engine's own gradient; the shared noise is a function of (seed, step, pair) only;
// parameters come back bitwise after the perturbations; and the step sends 4 bytes per member.
#include <gtest/gtest.h>

#include "ration/nn/layers.h"
#include "ration/ops/ops.h"
#include "ration/train/es_step.h"

namespace ration::train {
namespace {

// y = W x + b, loss = mean((y - t)^2): a quadratic in the parameters.
class Quadratic : public models::Model {
 public:
  Quadratic() { fc = register_module("fc", std::make_shared<nn::Linear>(4, 3)); }
  Value loss(const data::Batch& batch) override {
    const Value d = ops::sub(fc->forward(batch.input), batch.target);
    return ops::mean(ops::mul(d, d));
  }
  models::EvalStats evaluate(const data::Batch& batch) override { return {}; }
  std::string family() const override { return "quadratic"; }
  std::shared_ptr<nn::Linear> fc;
};

data::Batch batch_of() {
  at::manual_seed(5);
  data::Batch b;
  b.input = Value(at::randn({16, 4}));
  b.target = Value(at::randn({16, 3}));
  b.items = 16;
  return b;
}

TEST(EvolutionStrategies, AntitheticEstimateFollowsTheGradient) {
  at::manual_seed(1);
  Quadratic model;
  const data::Batch batch = batch_of();
  model.loss(batch).backward();
  std::vector<at::Tensor> exact;
  for (auto& [name, p] : model.named_parameters()) {
    exact.push_back(p.grad().clone().reshape({-1}));
    p.impl()->grad = at::Tensor();
  }
  const at::Tensor g = at::cat(exact);
  std::vector<at::Tensor> before;
  for (auto& [name, p] : model.named_parameters()) before.push_back(p.tensor().clone());
  EsStep es(dist::World::init_single(), model.named_parameters(), {4000, 1e-3}, 7);
  (void)es.estimate(model, &batch, 3);
  std::vector<at::Tensor> est;
  size_t k = 0;
  for (auto& [name, p] : model.named_parameters()) {
    est.push_back(p.grad().reshape({-1}));
    EXPECT_TRUE(at::equal(p.tensor(), before[k++])) << name << ": the perturbations are undone exactly";
  }
  const at::Tensor e = at::cat(est);
  const double cosine = (e * g).sum().item<double>() / (e.norm().item<double>() * g.norm().item<double>());
  EXPECT_GT(cosine, 0.97) << "2000 pairs on 15 parameters";
  EXPECT_NEAR(e.norm().item<double>() / g.norm().item<double>(), 1.0, 0.15);
  EXPECT_EQ(es.bytes_per_step(), 4 * 4000);
}

TEST(EvolutionStrategies, NoiseIsAFunctionOfSeedStepAndPair) {
  Quadratic model;
  EsStep a(dist::World::init_single(), model.named_parameters(), {8, 0.1}, 7);
  EsStep b(dist::World::init_single(), model.named_parameters(), {8, 0.1}, 7);
  EsStep c(dist::World::init_single(), model.named_parameters(), {8, 0.1}, 8);
  EXPECT_TRUE(at::equal(a.noise(4, 2)[0], b.noise(4, 2)[0]));
  EXPECT_FALSE(at::equal(a.noise(4, 2)[0], a.noise(5, 2)[0]));
  EXPECT_FALSE(at::equal(a.noise(4, 2)[0], a.noise(4, 3)[0]));
  EXPECT_FALSE(at::equal(a.noise(4, 2)[0], c.noise(4, 2)[0]));
}

}  // namespace
}  // namespace ration::train
