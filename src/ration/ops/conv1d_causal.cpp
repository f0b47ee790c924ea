// conv1d_causal.cpp — causal 1-D convolution over time (the type-2 layer of docs/METHODS.md,
// "Temporal-dependency buffers for sequence models").
// Owns: the op's forward, backward and saved list. Does not own the layer around it (nn/sequence_layers.h)
//       or the ring buffer that feeds `past` when streaming (seq/ring_buffer.h).
//
//   x     (B, C_in, T)        the current steps
//   past  (B, C_in, P)        the P <= L steps before x (no gradient), or undefined: P = 0
//   xp  = [zeros (B, C_in, L - P), past, x]                    (B, C_in, L + T), L = (k - 1) * dilation
//   y   = conv1d(xp, w, b, dilation)                           (B, C_out, T)
// So y[t] reads x[t - L .. t] only (zeros before the sequence began): output t depends on the current
// step and the previous L steps. With `past` the same op continues a sequence chunk by chunk.
//
// What backward keeps: x and w (convolution_backward needs both) and `past` when given (L steps at most).
// Backward rebuilds xp from them with the same ops as forward, runs ATen's convolution_backward over xp,
// and returns dx = dxp[..., L:] (the gradient for `past` is not formed: it stops at the chunk boundary).
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
// [zeros, past, x] along time: (B, C_in, L + T).
at::Tensor left_context(const at::Tensor& x, const at::Tensor& past, int64_t span) {
  const int64_t have = past.defined() ? past.size(2) : 0;
  at::Tensor xp = have > 0 ? at::cat({past, x}, 2) : x;
  if (span > have) xp = at::constant_pad_nd(xp, {span - have, 0}, 0.0);
  return xp;
}
}  // namespace

Value conv1d_causal(const Value& x, const Value& w, const Value& b, int64_t dilation, const Value& past) {
  RATION_CHECK(x.defined() && x.dim() == 3, "conv1d_causal expects input (B, C_in, T); got ",
               x.defined() ? x.sizes() : at::IntArrayRef{});
  RATION_CHECK(w.defined() && w.dim() == 3 && w.size(1) == x.size(1) && w.size(2) >= 1,
               "conv1d_causal weight must be (C_out, C_in=", x.size(1), ", k >= 1); got ", w.sizes());
  RATION_CHECK(dilation >= 1, "conv1d_causal dilation must be >= 1; got ", dilation);
  RATION_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "conv1d_causal bias must be (C_out=",
               w.size(0), "); got ", b.sizes());
  const int64_t span = (w.size(2) - 1) * dilation;  // L
  RATION_CHECK(!past.defined() || (past.dim() == 3 && past.size(0) == x.size(0) && past.size(1) == x.size(1) &&
                                   past.size(2) <= span),
               "conv1d_causal past must be (B=", x.size(0), ", C_in=", x.size(1), ", P <= L=", span, "); got ",
               past.sizes());
  RATION_CHECK(!past.defined() || !past.requires_grad(),
               "conv1d_causal past carries no gradient (it is the previous chunk's context); detach it");
  // inputs: 0 x, 1 w, 2 b, 3 past; outputs: 0 y (B, C_out, T)
  return single(apply_op(
      spec("conv1d_causal", past.defined() ? std::vector<int>{0, 1, 3} : std::vector<int>{0, 1}), {x, w, b, past},
      [=](const Tensors& in, ForwardCtx&) {
        return Tensors{at::convolution(left_context(in[0], in[3], span), in[1], in[2], {1}, {0}, {dilation},
                                       /*transposed=*/false, /*output_padding=*/{0}, /*groups=*/1)};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        const bool has_bias = ctx.node().inputs.at(2) != nullptr;
        const bool has_past = ctx.node().inputs.at(3) != nullptr;
        const at::Tensor weight = ctx.input(1);
        const at::Tensor xp = left_context(ctx.input(0), has_past ? ctx.input(3) : at::Tensor(), span);
        std::vector<int64_t> bias_sizes{weight.size(0)};
        auto [dxp, dw, db] = at::convolution_backward(
            g[0], xp, weight, has_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt, {1}, {0}, {dilation},
            /*transposed=*/false, /*output_padding=*/{0}, /*groups=*/1,
            {ctx.needs_input_grad(0), ctx.needs_input_grad(1), has_bias && ctx.needs_input_grad(2)});
        at::Tensor dx;
        if (dxp.defined()) dx = dxp.narrow(2, span, dxp.size(2) - span).contiguous();
        return Tensors{dx, dw, db, at::Tensor()};
      }));
}

}  // namespace ration::ops
