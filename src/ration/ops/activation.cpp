// activation.cpp — relu, gelu, tanh, sigmoid, softmax, log_softmax.
// Save the minimum: relu/tanh/sigmoid/softmax keep their output, gelu its input.
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

}  // namespace ration::ops
