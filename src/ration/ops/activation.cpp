// activation.cpp — relu, gelu, tanh, sigmoid, softmax, log_softmax.
// Save the minimum: relu/tanh/sigmoid/softmax/log_softmax keep their output (their ATen backward
// kernels are written in terms of it), gelu keeps its input (gelu_backward needs x).
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

Value relu(const Value& x) {
  return single(apply_op(
      spec("relu", {}, {0}), {x}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::relu(in[0])}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{at::threshold_backward(g[0], ctx.output(0), 0)}; }));
}

Value gelu(const Value& x, const std::string& approximate) {
  RATION_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\"; got \"",
               approximate, "\"");
  return single(apply_op(
      spec("gelu", {0}), {x},
      [approximate](const Tensors& in, ForwardCtx&) { return Tensors{at::gelu(in[0], approximate)}; },
      [approximate](BackwardCtx& ctx, const Tensors& g) {
        return Tensors{at::gelu_backward(g[0], ctx.input(0), approximate)};
      }));
}

Value tanh(const Value& x) {
  return single(apply_op(
      spec("tanh", {}, {0}), {x}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::tanh(in[0])}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{at::tanh_backward(g[0], ctx.output(0))}; }));
}

Value sigmoid(const Value& x) {
  return single(apply_op(
      spec("sigmoid", {}, {0}), {x}, [](const Tensors& in, ForwardCtx&) { return Tensors{at::sigmoid(in[0])}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{at::sigmoid_backward(g[0], ctx.output(0))}; }));
}

Value softmax(const Value& x, int64_t dim) {
  RATION_CHECK(dim >= -x.dim() && dim < std::max<int64_t>(x.dim(), 1), "softmax: dim ", dim,
               " out of range for shape ", x.sizes());
  return single(apply_op(
      spec("softmax", {}, {0}), {x},
      [dim](const Tensors& in, ForwardCtx&) { return Tensors{at::softmax(in[0], dim)}; },
      [dim](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor y = ctx.output(0);
        return Tensors{at::_softmax_backward_data(g[0], y, dim, y.scalar_type())};
      }));
}

Value log_softmax(const Value& x, int64_t dim) {
  RATION_CHECK(dim >= -x.dim() && dim < std::max<int64_t>(x.dim(), 1), "log_softmax: dim ", dim,
               " out of range for shape ", x.sizes());
  return single(apply_op(
      spec("log_softmax", {}, {0}), {x},
      [dim](const Tensors& in, ForwardCtx&) { return Tensors{at::log_softmax(in[0], dim)}; },
      [dim](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor y = ctx.output(0);
        return Tensors{at::_log_softmax_backward_data(g[0], y, dim, y.scalar_type())};
      }));
}

}  // namespace ration::ops
