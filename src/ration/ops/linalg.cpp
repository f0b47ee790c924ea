// linalg.cpp — matmul, bmm, linear.
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"
#include "ration/base/check.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

Value matmul(const Value& a, const Value& b) {
  RATION_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul needs operands with at least 2 dims; got ", a.sizes(),
               " and ", b.sizes(), " (reshape vectors to (1, N) / (N, 1))");
  return single(apply_op(
      spec("matmul", {0, 1}), {a, b},
      [](const Tensors& in, ForwardCtx&) { return Tensors{at::matmul(in[0], in[1])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        if (ctx.needs_input_grad(0))
          d[0] = unbroadcast(at::matmul(g[0], ctx.input(1).transpose(-1, -2)), input_sizes(ctx, 0));
        if (ctx.needs_input_grad(1))
          d[1] = unbroadcast(at::matmul(ctx.input(0).transpose(-1, -2), g[0]), input_sizes(ctx, 1));
        return d;
      }));
}

Value bmm(const Value& a, const Value& b) {
  RATION_CHECK(a.dim() == 3 && b.dim() == 3, "bmm needs (B, N, K) and (B, K, M); got ", a.sizes(), " and ",
               b.sizes());
  return single(apply_op(
      spec("bmm", {0, 1}), {a, b}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::bmm(in[0], in[1])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        if (ctx.needs_input_grad(0)) d[0] = at::bmm(g[0], ctx.input(1).transpose(1, 2));
        if (ctx.needs_input_grad(1)) d[1] = at::bmm(ctx.input(0).transpose(1, 2), g[0]);
        return d;
      }));
}

Value linear(const Value& x, const Value& w, const Value& b) {
  RATION_CHECK(w.dim() == 2 && x.size(-1) == w.size(1), "linear: input (..., ", w.size(1), ") expected for weight ",
               w.sizes(), "; got input ", x.sizes());
  return single(apply_op(
      spec("linear", {0, 1}), {x, w, b},
      [](const Tensors& in, ForwardCtx&) { return Tensors{at::linear(in[0], in[1], in[2])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(3);
        const at::Tensor g2 = g[0].reshape({-1, g[0].size(-1)});  // (N, out)
        if (ctx.needs_input_grad(0)) d[0] = at::matmul(g[0], ctx.input(1));
        if (ctx.needs_input_grad(1)) {
          const at::Tensor x = ctx.input(0);
          d[1] = at::mm(g2.t(), x.reshape({-1, x.size(-1)}));
        }
        if (ctx.needs_input_grad(2)) d[2] = g2.sum(0);
        return d;
      }));
}

}  // namespace ration::ops
