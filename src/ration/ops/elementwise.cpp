// elementwise.cpp — add, sub, mul, div (broadcasting) and their scalar forms.
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

Value add(const Value& a, const Value& b) {
  return single(apply_op(
      spec("add"), {a, b}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::add(in[0], in[1])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        if (ctx.needs_input_grad(0)) d[0] = unbroadcast(g[0], input_sizes(ctx, 0));
        if (ctx.needs_input_grad(1)) d[1] = unbroadcast(g[0], input_sizes(ctx, 1));
        return d;
      }));
}

Value sub(const Value& a, const Value& b) {
  return single(apply_op(
      spec("sub"), {a, b}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::sub(in[0], in[1])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        if (ctx.needs_input_grad(0)) d[0] = unbroadcast(g[0], input_sizes(ctx, 0));
        if (ctx.needs_input_grad(1)) d[1] = unbroadcast(-g[0], input_sizes(ctx, 1));
        return d;
      }));
}

Value mul(const Value& a, const Value& b) {
  return single(apply_op(
      spec("mul", {0, 1}), {a, b}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::mul(in[0], in[1])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        if (ctx.needs_input_grad(0)) d[0] = unbroadcast(g[0] * ctx.input(1), input_sizes(ctx, 0));
        if (ctx.needs_input_grad(1)) d[1] = unbroadcast(g[0] * ctx.input(0), input_sizes(ctx, 1));
        return d;
      }));
}

Value div(const Value& a, const Value& b) {
  return single(apply_op(
      spec("div", {0, 1}), {a, b}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::div(in[0], in[1])}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        at::Tensor b = ctx.input(1);
        if (ctx.needs_input_grad(0)) d[0] = unbroadcast(g[0] / b, input_sizes(ctx, 0));
        if (ctx.needs_input_grad(1)) d[1] = unbroadcast(-g[0] * ctx.input(0) / (b * b), input_sizes(ctx, 1));
        return d;
      }));
}

Value add_scalar(const Value& a, double s) {
  return single(apply_op(
      spec("add_scalar"), {a}, [s](const Tensors& in, ForwardCtx&) { return Tensors{at::add(in[0], s)}; },
      [](BackwardCtx&, const Tensors& g) { return Tensors{g[0]}; }));
}

Value mul_scalar(const Value& a, double s) {
  return single(apply_op(
      spec("mul_scalar"), {a}, [s](const Tensors& in, ForwardCtx&) { return Tensors{at::mul(in[0], s)}; },
      [s](BackwardCtx&, const Tensors& g) { return Tensors{g[0] * s}; }));
}

Value div_scalar(const Value& a, double s) {
  return single(apply_op(
      spec("div_scalar"), {a}, [s](const Tensors& in, ForwardCtx&) { return Tensors{at::div(in[0], s)}; },
      [s](BackwardCtx&, const Tensors& g) { return Tensors{at::div(g[0], s)}; }));
}

}  // namespace ration::ops
