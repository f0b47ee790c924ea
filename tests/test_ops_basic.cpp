// Per-op oracle checks: elementwise, linear algebra, reductions, losses, reshape.
#include "op_check.h"
#include "ration/ops/ops.h"

namespace ration::testing {
namespace {

TEST(OpsBasic, Elementwise) {
  check_op("add", [](const Values& v) { return ops::add(v[0], v[1]); }, {{randd({3, 4})}, {randd({4})}});
  check_op("sub", [](const Values& v) { return ops::sub(v[0], v[1]); }, {{randd({3, 1})}, {randd({3, 4})}});
  check_op("mul", [](const Values& v) { return ops::mul(v[0], v[1]); }, {{randd({2, 3})}, {randd({2, 3})}});
  check_op("div", [](const Values& v) { return ops::div(v[0], v[1]); },
           {{randd({2, 3})}, {randd({2, 3}).abs() + 0.5}});
  check_op("add_scalar", [](const Values& v) { return ops::add_scalar(v[0], 2.5); }, {{randd({5})}});
  check_op("mul_scalar", [](const Values& v) { return ops::mul_scalar(v[0], -1.5); }, {{randd({5})}});
  check_op("div_scalar", [](const Values& v) { return ops::div_scalar(v[0], 3.0); }, {{randd({5})}});
}

TEST(OpsBasic, LinearAlgebra) {
  check_op("matmul", [](const Values& v) { return ops::matmul(v[0], v[1]); }, {{randd({2, 3, 4})}, {randd({4, 5})}});
  check_op("bmm", [](const Values& v) { return ops::bmm(v[0], v[1]); }, {{randd({2, 3, 4})}, {randd({2, 4, 5})}});
  check_op("linear", [](const Values& v) { return ops::linear(v[0], v[1], v[2]); },
           {{randd({2, 3, 4})}, {randd({5, 4})}, {randd({5})}});
  check_op("linear_nobias", [](const Values& v) { return ops::linear(v[0], v[1], Value()); },
           {{randd({3, 4})}, {randd({5, 4})}});
}

TEST(OpsBasic, Reductions) {
  check_op("sum", [](const Values& v) { return ops::sum(v[0]); }, {{randd({3, 4})}});
  check_op("sum_dims", [](const Values& v) { return ops::sum(v[0], {0, 2}); }, {{randd({3, 4, 2})}});
  check_op("mean", [](const Values& v) { return ops::mean(v[0]); }, {{randd({3, 4})}});
  check_op("mean_keepdim", [](const Values& v) { return ops::mean(v[0], {-1}, true); }, {{randd({3, 4})}});
}

TEST(OpsBasic, Losses) {
  at::Tensor target = at::tensor({1, 0, 3, -100, 2}, at::kLong);
  check_op("cross_entropy", [](const Values& v) { return ops::cross_entropy(v[0], v[1], -100); },
           {{randd({5, 4})}, {target, false}});
  check_op("mse", [](const Values& v) { return ops::mse_loss(v[0], v[1]); }, {{randd({3, 4})}, {randd({3, 4})}});
  check_op("relu", [](const Values& v) { return ops::relu(v[0]); }, {{randd({4, 5})}});
}

TEST(OpsBasic, Shape) {
  check_op("reshape", [](const Values& v) { return ops::reshape(v[0], {4, 3}); }, {{randd({3, 4})}});
  check_op("view", [](const Values& v) { return ops::view(v[0], {2, 6}); }, {{randd({3, 4})}});
  check_op("flatten", [](const Values& v) { return ops::flatten(v[0], 1); }, {{randd({2, 3, 4})}});
}

}  // namespace
}  // namespace ration::testing
