// Engine behaviour: accumulation, release after use, second-backward error, in-place detection,
// gradient-ready hooks, no_grad, recompute chains.
#include <gtest/gtest.h>

#include "op_check.h"
#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::testing {
namespace {

TEST(Engine, AccumulatesAcrossBackwardCalls) {
  Value w = parameter(at::ones({3}, at::kDouble), "w");
  for (int i = 0; i < 2; ++i) {
    Value y = ops::sum(ops::mul(w, w));
    y.backward();
  }
  EXPECT_TRUE(at::allclose(w.grad(), at::full({3}, 4.0, at::kDouble)));
}

TEST(Engine, SecondBackwardThroughReleasedValuesIsAnError) {
  Value w = parameter(at::randn({3}, at::kDouble), "w");
  Value y = ops::sum(ops::relu(w));
  y.backward();
  EXPECT_THROW(y.backward(), Error);
}

TEST(Engine, RetainGraphAllowsSecondBackward) {
  Value w = parameter(at::randn({3}, at::kDouble), "w");
  Value y = ops::sum(ops::mul(w, w));
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  EXPECT_TRUE(at::allclose(w.grad(), 4 * w.tensor()));
}

TEST(Engine, InPlaceModificationOfSavedValueIsDetected) {
  Value x(at::randn({3}, at::kDouble), true);
  Value r = ops::relu(x);  // saves its output
  Value y = ops::sum(r);
  r.tensor().add_(1.0);
  EXPECT_THROW(y.backward(), Error);
}

TEST(Engine, NoGradRecordsNothing) {
  Value w = parameter(at::randn({3}), "w");
  NoGradGuard guard;
  Value y = ops::sum(ops::mul(w, w));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(Engine, GradReadyHookFiresOncePerBackwardWithFinalGradient) {
  Value w = parameter(at::ones({2}, at::kDouble), "w");
  int calls = 0;
  at::Tensor seen;
  w.on_grad_ready([&](ValueImpl& leaf) {
    ++calls;
    seen = leaf.grad.clone();
  });
  Value y = ops::sum(ops::add(ops::mul(w, w), w));  // w reached through three edges
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::allclose(seen, at::full({2}, 3.0, at::kDouble)));
}

TEST(Engine, ReleasesSavedValuesDuringBackward) {
  Value x(at::randn({64, 64}), true);
  Value h = ops::relu(ops::relu(x));
  auto handle = h.grad_fn()->saved.at(0).value;
  Value y = ops::sum(h);
  h = Value();
  EXPECT_EQ(handle->state(), SavedState::Resident);
  y.backward();
  EXPECT_EQ(handle->state(), SavedState::Released);
  EXPECT_FALSE(handle->data().defined());
}

TEST(Engine, RecomputeChainEqualsPlainBitwise) {
  const auto f = [](const Values& v) {
    Value h = v[0];
    for (int i = 0; i < 5; ++i) h = ops::relu(ops::linear(h, v[1], v[2]));
    return ops::mean(h);
  };
  std::vector<OpInput> in{{at::randn({8, 16})}, {at::randn({16, 16}) * 0.3}, {at::randn({16})}};
  at::Tensor up = at::ones({});
  auto plain = grads_of(f, in, up, Mode::Engine);
  int recomputes = 0;
  auto dropped = grads_of(f, in, up, Mode::DropAll, 1234, &recomputes);
  EXPECT_GT(recomputes, 0);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(at::equal(plain[i], dropped[i])) << i;
}

// Leaving an inner OracleScope restores the outer one: its mode, its parameter list (gradients still
// land in Value::grad) and torch tracking of a parameter both scopes name.
TEST(Engine, NestedOracleScopesRestoreTheOuterScope) {
  Value w = parameter(at::randn({3}, at::kDouble), "w");
  Value u = parameter(at::randn({3}, at::kDouble), "u");
  {
    OracleScope outer({w});
    {
      OracleScope inner({u, w});
      ops::sum(ops::mul(u, u)).backward();
      ASSERT_TRUE(u.grad().defined());
      EXPECT_TRUE(at::allclose(u.grad(), 2 * u.tensor()));
    }
    EXPECT_TRUE(oracle_mode());
    EXPECT_TRUE(w.tensor().requires_grad()) << "the inner scope untracked a parameter of the outer one";
    EXPECT_FALSE(u.tensor().requires_grad());
    ops::sum(ops::mul(w, w)).backward();
    ASSERT_TRUE(w.grad().defined()) << "the outer scope lost its parameter list";
    EXPECT_TRUE(at::allclose(w.grad(), 2 * w.tensor()));
  }
  EXPECT_FALSE(oracle_mode());
  EXPECT_FALSE(w.tensor().requires_grad());
}

}  // namespace
}  // namespace ration::testing
