// Optimisers, gradient clipping and the learning-rate schedule, checked against libtorch's own
// torch::optim::SGD / torch::optim::AdamW and torch::nn::utils::clip_grad_norm_ on identical
// parameters and gradients.
#include <gtest/gtest.h>

#include "test_util.h"
#include <torch/types.h>  // clip_grad.h is not self-contained
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>

#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/optim/adamw.h"
#include "ration/optim/clip.h"
#include "ration/optim/schedule.h"
#include "ration/optim/sgd.h"

namespace ration::optim {
namespace {
using ration::testing::expect_error_containing;

const std::vector<std::pair<std::string, std::vector<int64_t>>> kShapes = {
    {"fc.weight", {3, 4}}, {"fc.bias", {4}}, {"blocks.0.conv.weight", {2, 2, 3}}};

// Twin parameter sets with equal values: ration Values and torch leaves.
struct Twins {
  NamedParams ours;
  std::vector<at::Tensor> theirs;
};

Twins make_twins(at::ScalarType dtype, uint64_t seed = 7) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Twins t;
  for (const auto& [name, shape] : kShapes) {
    at::Tensor init = at::randn(shape, gen, at::TensorOptions().dtype(dtype));
    t.ours.emplace_back(name, parameter(init.clone(), name));
    t.theirs.push_back(init.clone().set_requires_grad(true));
  }
  return t;
}

// The gradient of parameter i at step s (undefined for parameter 2 at step 1: both must skip it).
at::Tensor grad_for(size_t i, int s, at::IntArrayRef shape, at::ScalarType dtype) {
  if (i == 2 && s == 1) return at::Tensor();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 10 * s + i);
  return at::randn(shape, gen, at::TensorOptions().dtype(dtype));
}

void set_grads(Twins& t, int s) {
  for (size_t i = 0; i < t.theirs.size(); ++i) {
    const at::Tensor g = grad_for(i, s, t.theirs[i].sizes(), t.theirs[i].scalar_type());
    t.ours[i].second.grad() = g.defined() ? g.clone() : at::Tensor();
    t.theirs[i].mutable_grad() = g.defined() ? g.clone() : at::Tensor();
  }
}

void expect_params_match(const Twins& t, at::ScalarType dtype, const std::string& what) {
  for (size_t i = 0; i < t.theirs.size(); ++i) {
    const at::Tensor& ours = t.ours[i].second.tensor();
    const at::Tensor theirs = t.theirs[i].detach();
    if (dtype == at::kDouble) {
      EXPECT_TRUE(at::equal(ours, theirs)) << what << ": " << t.ours[i].first << " max diff "
                                           << (ours - theirs).abs().max().item<double>();
    } else {
      EXPECT_TRUE(at::allclose(ours, theirs, /*rtol=*/0, /*atol=*/1e-6))
          << what << ": " << t.ours[i].first << " max diff " << (ours - theirs).abs().max().item<double>();
    }
  }
}

// Five steps of both optimisers on the same gradients.
void run_against_torch(Optimizer& ours, torch::optim::Optimizer& theirs, Twins& t, at::ScalarType dtype,
                       const std::string& what) {
  std::vector<void*> storages;
  for (const auto& [name, v] : t.ours) storages.push_back(v.tensor().data_ptr());
  for (int s = 0; s < 5; ++s) {
    set_grads(t, s);
    ours.step();
    theirs.step();
    ours.zero_grad();
    for (auto& p : t.theirs) p.mutable_grad() = at::Tensor();
    expect_params_match(t, dtype, what + " step " + std::to_string(s));
  }
  EXPECT_EQ(ours.step_count(), 5);
  for (size_t i = 0; i < t.ours.size(); ++i) {
    EXPECT_EQ(t.ours[i].second.tensor().data_ptr(), storages[i]) << "update must be in place";
    EXPECT_FALSE(t.ours[i].second.grad().defined()) << "zero_grad sets gradients to none";
  }
  // The parameters moved: the comparison is not vacuous.
  const Twins fresh = make_twins(dtype);
  EXPECT_FALSE(at::allclose(t.ours[0].second.tensor(), fresh.ours[0].second.tensor()));
}


TEST(Optim, SgdMatchesTorch) {
  struct Config {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  const std::vector<Config> configs = {
      {0.0, 0.0, 0.0, false}, {0.9, 0.0, 0.0, false}, {0.9, 0.2, 0.01, false}, {0.8, 0.0, 0.05, true}};
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    for (const auto& c : configs) {
      Twins t = make_twins(dtype);
      SGD ours(t.ours, {0.1, c.momentum, c.dampening, c.weight_decay, c.nesterov});
      torch::optim::SGD theirs(t.theirs, torch::optim::SGDOptions(0.1)
                                             .momentum(c.momentum)
                                             .dampening(c.dampening)
                                             .weight_decay(c.weight_decay)
                                             .nesterov(c.nesterov));
      run_against_torch(ours, theirs, t, dtype,
                        "SGD momentum " + std::to_string(c.momentum) + " nesterov " + std::to_string(c.nesterov));
    }
  }
}

TEST(Optim, AdamWMatchesTorch) {
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    for (bool amsgrad : {false, true}) {
      for (double wd : {0.0, 0.1}) {
        Twins t = make_twins(dtype);
        AdamWOptions o;
        o.lr = 0.05;
        o.beta1 = 0.8;
        o.beta2 = 0.95;
        o.eps = 1e-6;
        o.weight_decay = wd;
        o.amsgrad = amsgrad;
        AdamW ours(t.ours, o);
        torch::optim::AdamW theirs(t.theirs, torch::optim::AdamWOptions(o.lr)
                                                 .betas(std::make_tuple(o.beta1, o.beta2))
                                                 .eps(o.eps)
                                                 .weight_decay(wd)
                                                 .amsgrad(amsgrad));
        run_against_torch(ours, theirs, t, dtype,
                          "AdamW amsgrad " + std::to_string(amsgrad) + " wd " + std::to_string(wd));
      }
    }
  }
}

TEST(Optim, StateRoundTripContinuesIdentically) {
  Twins a = make_twins(at::kDouble);
  Twins b = make_twins(at::kDouble);
  AdamWOptions o;
  o.lr = 0.02;
  o.amsgrad = true;
  AdamW first(a.ours, o);
  for (int s = 0; s < 3; ++s) {
    set_grads(a, s);
    first.step();
    first.zero_grad();
  }
  first.set_lr(0.015);
  const NamedTensors state = first.export_state();
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  ASSERT_TRUE(by_name.count("optim.step"));
  EXPECT_EQ(by_name["optim.step"].item<int64_t>(), 3);
  EXPECT_DOUBLE_EQ(by_name["optim.lr"].item<double>(), 0.015);
  ASSERT_TRUE(by_name.count("optim.fc.weight.exp_avg"));
  ASSERT_TRUE(by_name.count("optim.blocks.0.conv.weight.max_exp_avg_sq"));
  EXPECT_EQ(by_name["optim.fc.weight.step"].item<int64_t>(), 3);
  EXPECT_EQ(by_name["optim.blocks.0.conv.weight.step"].item<int64_t>(), 2);  // skipped at step 1
  EXPECT_EQ(by_name["optim.fc.bias.exp_avg_sq"].sizes(), at::IntArrayRef({4}));

  // A second optimiser over parameters equal to the first's, given the exported state.
  for (size_t i = 0; i < a.ours.size(); ++i) b.ours[i].second.tensor().copy_(a.ours[i].second.tensor());
  AdamW second(b.ours, o);
  NamedTensors copied;
  for (const auto& [name, t] : state) copied.emplace_back(name, t.clone());
  second.import_state(copied);
  EXPECT_EQ(second.step_count(), 3);
  EXPECT_DOUBLE_EQ(second.lr(), 0.015);
  for (int s = 3; s < 5; ++s) {
    set_grads(a, s);
    set_grads(b, s);
    first.step();
    second.step();
  }
  for (size_t i = 0; i < a.ours.size(); ++i) {
    EXPECT_TRUE(at::equal(a.ours[i].second.tensor(), b.ours[i].second.tensor())) << a.ours[i].first;
  }
  const NamedTensors s1 = first.export_state();
  const NamedTensors s2 = second.export_state();
  ASSERT_EQ(s1.size(), s2.size());
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_EQ(s1[i].first, s2[i].first);
    EXPECT_TRUE(at::equal(s1[i].second, s2[i].second)) << s1[i].first;
  }
}

TEST(Optim, ImportStateRejectsMismatches) {
  Twins t = make_twins(at::kFloat);
  SGD sgd(t.ours, {0.1, 0.9});
  const at::Tensor step = at::scalar_tensor(1, at::kLong);
  expect_error_containing([&] { sgd.import_state({{"optim.step", step}, {"optim.nope.momentum_buffer", at::zeros({4})}}); },
                          "nope");
  expect_error_containing(
      [&] { sgd.import_state({{"optim.step", step}, {"optim.fc.bias.momentum_buffer", at::zeros({5})}}); }, "[5]");
  expect_error_containing([&] { sgd.import_state({{"optim.step", step}, {"optim.fc.bias.exp_avg", at::zeros({4})}}); },
                          "exp_avg");
  expect_error_containing([&] { sgd.import_state({{"optim.fc.bias.momentum_buffer", at::zeros({4})}}); }, "optim.step");
  expect_error_containing([] { SGD bad({}, {0.1, 0.0, 0.0, 0.0, /*nesterov=*/true}); }, "Nesterov");
}

TEST(Optim, StateIsCountedAsOptimizerMemory) {
  if (!memory::counting_allocator_installed()) GTEST_SKIP() << "counting allocator not installed";
  Twins t = make_twins(at::kFloat);
  AdamW adam(t.ours, {});
  const int64_t before = memory::stats().current[static_cast<int>(memory::Category::Optimizer)];
  set_grads(t, 0);
  adam.step();
  const int64_t after = memory::stats().current[static_cast<int>(memory::Category::Optimizer)];
  int64_t expected = 0;
  for (const auto& [name, v] : t.ours) expected += 2 * v.numel() * 4 + 8;  // exp_avg, exp_avg_sq, step
  EXPECT_EQ(after - before, expected);
}

TEST(Optim, ZeroGradKeepsTensorsWhenAsked) {
  Twins t = make_twins(at::kFloat);
  SGD sgd(t.ours, {0.1});
  set_grads(t, 0);
  sgd.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(t.ours[0].second.grad().defined());
  EXPECT_EQ(t.ours[0].second.grad().abs().sum().item<double>(), 0.0);
}

TEST(Optim, ClipGradNormMatchesTorch) {
  for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    for (double max_norm : {0.5, 100.0}) {
      Twins t = make_twins(at::kDouble);
      set_grads(t, 1);  // parameter 2 has no gradient
      const double ours = clip_grad_norm(t.ours, max_norm, norm_type);
      const double theirs = torch::nn::utils::clip_grad_norm_(t.theirs, max_norm, norm_type);
      EXPECT_DOUBLE_EQ(ours, theirs) << "norm " << norm_type;
      EXPECT_GT(ours, 0.5);
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_TRUE(at::allclose(t.ours[i].second.grad(), t.theirs[i].grad(), 0, 1e-15)) << t.ours[i].first;
      }
      EXPECT_FALSE(t.ours[2].second.grad().defined());
      if (max_norm < ours) {
        EXPECT_NEAR(grad_norm({t.ours[0].second, t.ours[1].second}, norm_type), max_norm, 1e-5);
      }
    }
  }
  Twins none = make_twins(at::kFloat);
  EXPECT_EQ(clip_grad_norm(none.ours, 1.0), 0.0);
  Twins bad = make_twins(at::kFloat);
  set_grads(bad, 0);
  bad.ours[0].second.grad()[0][0] = std::nan("");
  expect_error_containing([&] { clip_grad_norm(bad.ours, 1.0, 2.0, /*error_if_nonfinite=*/true); }, "nan");
}

TEST(Optim, WarmupCosineSchedule) {
  const WarmupCosine s(1.0, 0.1, 10, 110);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);    // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);    // warm-up ends at max_lr
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);   // decay starts at max_lr
  EXPECT_NEAR(s.lr(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_NEAR(s.lr(60), 0.55, 1e-15);  // half way: the mean of max and min
  EXPECT_NEAR(s.lr(109), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.99)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(10000), 0.1);
  for (int64_t step = 10; step < 110; ++step) EXPECT_LT(s.lr(step + 1), s.lr(step)) << step;

  const WarmupCosine no_warmup(2.0, 0.0, 0, 4);
  EXPECT_DOUBLE_EQ(no_warmup.lr(0), 2.0);
  EXPECT_NEAR(no_warmup.lr(2), 1.0, 1e-15);

  Twins t = make_twins(at::kFloat);
  SGD sgd(t.ours, {0.5});
  EXPECT_DOUBLE_EQ(s.apply(sgd, 4), 0.5);
  EXPECT_DOUBLE_EQ(sgd.lr(), 0.5);
  expect_error_containing([] { WarmupCosine(0.1, 1.0, 0, 10); }, "min_lr");
  expect_error_containing([] { WarmupCosine(1.0, 0.1, 20, 10); }, "warmup_steps");
}

}  // namespace
}  // namespace ration::optim
