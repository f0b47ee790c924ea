// conv.cpp — conv2d, max_pool2d, avg_pool2d (NCHW).
// What backward keeps:
//   conv2d      x and w (convolution_backward needs both: dw reads x, dx reads w).
//   max_pool2d  only the argmax indices (internal output 1, int64, shape of y). The backward kernel reads
//               the input for its shape and memory format only, so it gets a stride-0 stand-in, not x.
//   avg_pool2d  nothing: its backward needs only the input's shape.
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
void check_pair(const char* op, const char* what, const std::vector<int64_t>& v, bool allow_empty) {
  RATION_CHECK(v.size() == 2 || (allow_empty && v.empty()), op, ": ", what, " needs 2 entries (h, w)",
               allow_empty ? " or none" : "", "; got ", v.size());
}

void check_nchw(const char* op, const Value& x) {
  RATION_CHECK(x.defined() && x.dim() == 4, op, " expects input (B, C, H, W); got ",
               x.defined() ? x.sizes() : at::IntArrayRef{}, " (add a batch dimension with reshape)");
}

// A tensor with the input's shape and options but no storage to speak of: for backward kernels that read
// only the input's geometry.
at::Tensor shape_stand_in(const BackwardCtx& ctx, int i) {
  const TensorMeta& m = ctx.node().input_meta.at(static_cast<size_t>(i));
  return at::zeros({}, m.options).expand(m.sizes);
}
}  // namespace

Value conv2d(const Value& x, const Value& w, const Value& b, std::vector<int64_t> stride,
             std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  check_nchw("conv2d", x);
  check_pair("conv2d", "stride", stride, false);
  check_pair("conv2d", "padding", padding, false);
  check_pair("conv2d", "dilation", dilation, false);
  RATION_CHECK(w.dim() == 4, "conv2d weight must be (C_out, C_in/groups, kH, kW); got ", w.sizes());
  RATION_CHECK(groups >= 1 && x.size(1) == w.size(1) * groups && w.size(0) % groups == 0, "conv2d: input ",
               x.sizes(), " has ", x.size(1), " channels but weight ", w.sizes(), " with groups=", groups,
               " expects ", w.size(1) * groups, " (C_out must also divide by groups)");
  RATION_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "conv2d bias must be (C_out=", w.size(0),
               "); got ", b.sizes());
  return single(apply_op(
      spec("conv2d", {0, 1}), {x, w, b},
      [=](const Tensors& in, ForwardCtx&) {
        return Tensors{at::convolution(in[0], in[1], in[2], stride, padding, dilation, /*transposed=*/false,
                                       /*output_padding=*/{0, 0}, groups)};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        const bool has_bias = ctx.node().inputs.at(2) != nullptr;
        const at::Tensor weight = ctx.input(1);
        std::vector<int64_t> bias_sizes{weight.size(0)};
        auto [dx, dw, db] = at::convolution_backward(
            g[0], ctx.input(0), weight, has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt, stride,
            padding, dilation, /*transposed=*/false, /*output_padding=*/{0, 0}, groups,
            {ctx.needs_input_grad(0), ctx.needs_input_grad(1), has_bias && ctx.needs_input_grad(2)});
        return Tensors{dx, dw, db};
      }));
}

Value max_pool2d(const Value& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                 std::vector<int64_t> padding) {
  check_nchw("max_pool2d", x);
  check_pair("max_pool2d", "kernel", kernel, false);
  check_pair("max_pool2d", "stride", stride, true);
  check_pair("max_pool2d", "padding", padding, false);
  // outputs: 0 y (B, C, H', W'), 1 argmax indices (B, C, H', W') int64, internal
  return single(apply_op(
      spec("max_pool2d", {}, {1}), {x},
      [=](const Tensors& in, ForwardCtx&) {
        auto [y, indices] = at::max_pool2d_with_indices(in[0], kernel, stride, padding, /*dilation=*/{1, 1},
                                                        /*ceil_mode=*/false);
        return Tensors{y, indices};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        return Tensors{at::max_pool2d_with_indices_backward(g[0], shape_stand_in(ctx, 0), kernel, stride, padding,
                                                            /*dilation=*/{1, 1}, /*ceil_mode=*/false,
                                                            ctx.output(1))};
      }));
}

Value avg_pool2d(const Value& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                 std::vector<int64_t> padding) {
  check_nchw("avg_pool2d", x);
  check_pair("avg_pool2d", "kernel", kernel, false);
  check_pair("avg_pool2d", "stride", stride, true);
  check_pair("avg_pool2d", "padding", padding, false);
  return single(apply_op(
      spec("avg_pool2d"), {x},
      [=](const Tensors& in, ForwardCtx&) {
        return Tensors{at::avg_pool2d(in[0], kernel, stride, padding, /*ceil_mode=*/false,
                                      /*count_include_pad=*/true)};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        return Tensors{at::avg_pool2d_backward(g[0], shape_stand_in(ctx, 0), kernel, stride, padding,
                                               /*ceil_mode=*/false, /*count_include_pad=*/true, c10::nullopt)};
      }));
}

}  // namespace ration::ops
