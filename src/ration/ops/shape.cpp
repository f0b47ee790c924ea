// shape.cpp — reshape/view/flatten, transpose/permute, cat/split/slice. No saved tensors: every
// backward here needs only the input shapes (node input_meta) and the op's own arguments.
// transpose/permute/split/slice return views of their input, as in ATen.
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
// `dim` in [-ndim, ndim) mapped to [0, ndim).
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim, at::IntArrayRef shape) {
  RATION_CHECK(dim >= -ndim && dim < ndim, op, ": dim ", dim, " out of range for shape ", shape,
               " (valid: ", -ndim, " .. ", ndim - 1, ")");
  return dim < 0 ? dim + ndim : dim;
}
}  // namespace

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

Value observe_grad(const Value& x, std::function<void(const at::Tensor&)> observer) {
  return single(apply_op(
      spec("observe_grad"), {x}, [](const Tensors& in, ForwardCtx&) { return Tensors{in[0].view(in[0].sizes())}; },
      [observer = std::move(observer)](BackwardCtx& ctx, const Tensors& g) {
        observer(g[0]);
        return Tensors{g[0]};
      }));
}

Value flatten(const Value& x, int64_t start_dim, int64_t end_dim) {
  return single(apply_op(
      spec("flatten"), {x},
      [start_dim, end_dim](const Tensors& in, ForwardCtx&) { return Tensors{in[0].flatten(start_dim, end_dim)}; },
      [](BackwardCtx& ctx, const Tensors& g) { return Tensors{g[0].reshape(input_sizes(ctx, 0))}; }));
}

Value transpose(const Value& x, int64_t dim0, int64_t dim1) {
  dim0 = wrap_dim("transpose", dim0, x.dim(), x.sizes());
  dim1 = wrap_dim("transpose", dim1, x.dim(), x.sizes());
  return single(apply_op(
      spec("transpose"), {x},
      [dim0, dim1](const Tensors& in, ForwardCtx&) { return Tensors{in[0].transpose(dim0, dim1)}; },
      [dim0, dim1](BackwardCtx&, const Tensors& g) { return Tensors{g[0].transpose(dim0, dim1)}; }));
}

Value permute(const Value& x, std::vector<int64_t> dims) {
  const int64_t nd = x.dim();
  RATION_CHECK(static_cast<int64_t>(dims.size()) == nd, "permute: got ", dims.size(), " dims for shape ", x.sizes(),
               "; give one entry per dimension");
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    dims[i] = wrap_dim("permute", dims[i], nd, x.sizes());
    RATION_CHECK(inverse[static_cast<size_t>(dims[i])] == -1, "permute: dim ", dims[i], " repeated in the order",
                 " (each dimension must appear exactly once)");
    inverse[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
  }
  return single(apply_op(
      spec("permute"), {x}, [dims](const Tensors& in, ForwardCtx&) { return Tensors{in[0].permute(dims)}; },
      [inverse](BackwardCtx&, const Tensors& g) { return Tensors{g[0].permute(inverse)}; }));
}

Value cat(const Values& xs, int64_t dim) {
  RATION_CHECK(!xs.empty(), "cat: needs at least one value");
  for (const auto& x : xs) RATION_CHECK(x.defined(), "cat: got an undefined value");
  const int64_t nd = xs[0].dim();
  dim = wrap_dim("cat", dim, nd, xs[0].sizes());
  for (const auto& x : xs) {
    bool same = x.dim() == nd;
    for (int64_t d = 0; same && d < nd; ++d) same = d == dim || x.size(d) == xs[0].size(d);
    RATION_CHECK(same, "cat along dim ", dim, ": shapes ", xs[0].sizes(), " and ", x.sizes(),
                 " must agree in every other dimension");
  }
  return single(apply_op(
      spec("cat"), xs, [dim](const Tensors& in, ForwardCtx&) { return Tensors{at::cat(in, dim)}; },
      [dim](BackwardCtx& ctx, const Tensors& g) {
        const size_t n = ctx.node().input_meta.size();
        Tensors d(n);
        int64_t offset = 0;
        for (size_t i = 0; i < n; ++i) {
          const int64_t len = input_sizes(ctx, static_cast<int>(i))[static_cast<size_t>(dim)];
          if (ctx.needs_input_grad(static_cast<int>(i))) d[i] = g[0].narrow(dim, offset, len);
          offset += len;
        }
        return d;
      }));
}

Values split(const Value& x, int64_t split_size, int64_t dim) {
  dim = wrap_dim("split", dim, x.dim(), x.sizes());
  RATION_CHECK(split_size > 0, "split: split_size must be positive; got ", split_size);
  const int64_t len = x.size(dim);
  const int pieces = static_cast<int>(len == 0 ? 1 : (len + split_size - 1) / split_size);
  return apply_op(
      spec("split", {}, {}, pieces), {x},
      [split_size, dim](const Tensors& in, ForwardCtx&) { return in[0].split(split_size, dim); },
      [dim](BackwardCtx&, const Tensors& g) { return Tensors{at::cat(g, dim)}; });
}

Value slice(const Value& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrap_dim("slice", dim, x.dim(), x.sizes());
  RATION_CHECK(step > 0, "slice: step must be positive; got ", step);
  return single(apply_op(
      spec("slice"), {x},
      [dim, start, end, step](const Tensors& in, ForwardCtx&) { return Tensors{in[0].slice(dim, start, end, step)}; },
      [dim, start, end, step](BackwardCtx& ctx, const Tensors& g) {
        return Tensors{at::slice_backward(g[0], input_sizes(ctx, 0), dim, start, end, step)};
      }));
}

}  // namespace ration::ops
