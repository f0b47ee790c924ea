// op_check.h — the per-op oracle harness used by tests/test_ops_*.cpp.
// For an op f(inputs) and a fixed random upstream gradient v, checks d<f, v>/d input:
//   1. against central finite differences in float64;
//   2. against libtorch's autograd differentiating the same forward (OracleScope);
//   3. with every saved value dropped after forward and recomputed in backward: bitwise equal to 1.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ration/core/node.h"
#include "ration/core/value.h"
#include "ration/core/saved_value.h"

namespace ration::testing {

using OpFn = std::function<Value(const Values&)>;

struct OpInput {
  at::Tensor tensor;
  bool requires_grad = true;
};

// Drops every saved value right after its node's forward: backward must recompute all of them.
class DropAllPolicy : public MemoryPolicy {
 public:
  void after_forward_node(Node& node, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&) override {
    for (auto& ref : node.saved) {
      if (!ref.value->pinned() && ref.value->state() == SavedState::Resident) ref.value->drop();
    }
  }
  void on_recompute(Node&, double) override { ++recomputes; }
  int recomputes = 0;
};

enum class Mode { Engine, Oracle, DropAll };

// Gradients of <f(inputs), upstream> for each input (undefined where !requires_grad). `seed` is set
// before the forward so RNG ops draw identically in every mode.
inline std::vector<at::Tensor> grads_of(const OpFn& f, const std::vector<OpInput>& inputs, const at::Tensor& upstream,
                                        Mode mode, uint64_t seed = 1234, int* recomputes = nullptr) {
  Values vals;
  std::vector<Value> trainable;
  for (const auto& in : inputs) {
    vals.emplace_back(in.tensor.clone(), in.requires_grad);
    if (in.requires_grad) trainable.push_back(vals.back());
  }
  manual_seed(seed);
  DropAllPolicy drop;
  std::vector<at::Tensor> out;
  if (mode == Mode::Oracle) {
    OracleScope scope(trainable);
    Value y = f(vals);
    y.backward(upstream);
  } else {
    PolicyScope scope(mode == Mode::DropAll ? &drop : nullptr);
    Value y = f(vals);
    y.backward(upstream);
  }
  if (recomputes) *recomputes = drop.recomputes;
  for (auto& v : vals) out.push_back(v.requires_grad() ? v.grad() : at::Tensor());
  return out;
}

inline double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

// Central differences of <f(x), upstream> for input `which`, in float64.
inline at::Tensor finite_difference(const OpFn& f, const std::vector<OpInput>& inputs, const at::Tensor& upstream,
                                    size_t which, double eps, uint64_t seed) {
  at::Tensor base = inputs[which].tensor.clone();
  at::Tensor grad = at::zeros_like(base);
  auto flat = base.view({-1});
  auto gflat = grad.view({-1});
  auto eval = [&](const at::Tensor& x) {
    NoGradGuard no_grad;
    Values vals;
    for (size_t i = 0; i < inputs.size(); ++i) vals.emplace_back(i == which ? x : inputs[i].tensor, false);
    manual_seed(seed);
    return (f(vals).tensor() * upstream).sum().item<double>();
  };
  for (int64_t k = 0; k < flat.numel(); ++k) {
    const double orig = flat[k].item<double>();
    flat[k] = orig + eps;
    const double up = eval(base);
    flat[k] = orig - eps;
    const double down = eval(base);
    flat[k] = orig;
    gflat[k] = (up - down) / (2 * eps);
  }
  return grad;
}

// The full check. Inputs should be float64 (integer index inputs: requires_grad=false).
inline void check_op(const std::string& name, const OpFn& f, const std::vector<OpInput>& inputs,
                     double fd_tol = 1e-6, double oracle_tol = 1e-10, uint64_t seed = 1234) {
  SCOPED_TRACE(name);
  at::Tensor y;
  {
    NoGradGuard no_grad;
    Values vals;
    for (const auto& in : inputs) vals.emplace_back(in.tensor, false);
    manual_seed(seed);
    y = f(vals).tensor();
  }
  at::Tensor upstream = at::randn(y.sizes(), at::TensorOptions().dtype(y.scalar_type()).device(y.device()));
  const auto engine = grads_of(f, inputs, upstream, Mode::Engine, seed);
  const auto oracle = grads_of(f, inputs, upstream, Mode::Oracle, seed);
  int recomputes = 0;
  const auto dropped = grads_of(f, inputs, upstream, Mode::DropAll, seed, &recomputes);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad) continue;
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(engine[i].defined()) << "no gradient reached input " << i;
    ASSERT_TRUE(oracle[i].defined()) << "oracle produced no gradient for input " << i;
    EXPECT_EQ(engine[i].sizes(), inputs[i].tensor.sizes());
    EXPECT_LE(max_rel_error(engine[i], oracle[i]), oracle_tol) << "engine vs libtorch autograd";
    EXPECT_TRUE(at::equal(engine[i], dropped[i])) << "recomputed backward differs from plain backward";
    if (inputs[i].tensor.scalar_type() == at::kDouble && fd_tol > 0) {
      const at::Tensor fd = finite_difference(f, inputs, upstream, i, 1e-6, seed);
      EXPECT_LE(max_rel_error(engine[i], fd), fd_tol) << "engine vs finite differences";
    }
  }
}

inline at::Tensor randd(std::vector<int64_t> shape) { return at::randn(shape, at::kDouble); }

}  // namespace ration::testing
