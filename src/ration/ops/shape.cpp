// shape.cpp — reshape/view/flatten, transpose/permute, cat/split/slice. No saved tensors.
#include "ration/core/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

Value reshape(const Value& x, std::vector<int64_t> shape) {
  return single(apply_op(
      spec("reshape"), {x}, [shape](const Tensors& in, ForwardCtx&) { return Tensors{in[0].reshape(shape)}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{g[0].reshape(input_sizes(ctx, 0))}; }));
}

Value view(const Value& x, std::vector<int64_t> shape) {
  return single(apply_op(
      spec("view"), {x}, [shape](const Tensors& in, ForwardCtx&) { return Tensors{in[0].view(shape)}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{g[0].reshape(input_sizes(ctx, 0))}; }));
}

Value flatten(const Value& x, int64_t start_dim, int64_t end_dim) {
  return single(apply_op(
      spec("flatten"), {x},
      [start_dim, end_dim](const Tensors& in, ForwardCtx&) { return Tensors{in[0].flatten(start_dim, end_dim)}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{g[0].reshape(input_sizes(ctx, 0))}; }));
}

}  // namespace ration::ops
