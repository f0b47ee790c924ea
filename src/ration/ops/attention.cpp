// attention.cpp — causal scaled-dot-product attention with optional dropout on the attention weights.
//
//   scores = q k^T / sqrt(D)           (B, H, T, T), entries above the diagonal set to -inf
//                                      (window L > 0: also entries more than L below the diagonal)
//   lse    = logsumexp(scores, -1)     (B, H, T, 1)
//   att    = exp(scores - lse)         (B, H, T, T)  == softmax(scores, -1)
//   att_d  = att * keep / (1 - p)      (B, H, T, T)  only when dropout is active
//   y      = att_d v                   (B, H, T, D)
// With Tk > Tq keys (a chunk of queries after Tk - Tq cached steps, see ops.h) the diagonal is shifted by
// Tk - Tq; window 0 and Tk == Tq build exactly the mask this op always built (bitwise the same results).
//
// What backward keeps: q, k, v (inputs; each is needed for another's gradient), lse (internal output 1,
// (B, H, T, 1)) and, only with dropout, the bool keep-mask (internal output 2, (B, H, T, T), 1 byte each).
// The (B, H, T, T) weights are NOT kept: backward rebuilds att = exp(q k^T / sqrt(D) - lse) with the
// very same ops as forward (so bitwise the same att), paying one extra (T x T) matmul to save
// O(B H T^2) floats — the largest activation of a transformer block. The softmax gradient is then
// ATen's _softmax_backward_data on the rebuilt att.
#include <cmath>
#include <limits>

#include "ration/core/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
// Masked (future, and with a window the too-distant past) positions: (Tq, Tk) bool. Query i sits at key
// position i + Tk - Tq.
at::Tensor future_mask(int64_t tq, int64_t tk, int64_t window, const at::Device& device) {
  const at::Tensor ones = at::ones({tq, tk}, at::TensorOptions().dtype(at::kBool).device(device));
  const int64_t offset = tk - tq;
  at::Tensor mask = ones.triu(1 + offset);
  if (window > 0) mask = mask.logical_or(ones.tril(offset - window - 1));
  return mask;
}

// q k^T * scale with the masked positions set to -inf: (B, H, Tq, Tk). Forward and backward both build the
// weights as exp(causal_scores - lse) from this, so backward's rebuilt weights are bitwise forward's.
at::Tensor causal_scores(const at::Tensor& q, const at::Tensor& k, double scale, int64_t window) {
  return at::matmul(q, k.transpose(-2, -1))
      .mul(scale)
      .masked_fill(future_mask(q.size(2), k.size(2), window, q.device()), -std::numeric_limits<double>::infinity());
}
}  // namespace

Value causal_attention(const Value& q, const Value& k, const Value& v, double dropout_p, bool training,
                       int64_t window) {
  RATION_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == q.size(0) &&
                   k.size(1) == q.size(1) && k.size(3) == q.size(3) && k.size(2) >= q.size(2),
               "causal_attention expects q (B, H, Tq, D) and k, v (B, H, Tk >= Tq, D); got ", q.sizes(), ", ",
               k.sizes(), ", ", v.sizes());
  RATION_CHECK(window >= 0, "causal_attention window must be >= 0 (0 = no window); got ", window);
  RATION_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "causal_attention dropout_p must be in [0, 1); got ", dropout_p);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const bool use_dropout = training && dropout_p > 0.0;
  const double keep_scale = use_dropout ? 1.0 / (1.0 - dropout_p) : 1.0;

  // outputs: 0 y (B, H, T, D); 1 lse (B, H, T, 1), internal; 2 keep-mask (B, H, T, T) bool, internal, dropout only
  OpSpec s = spec("causal_attention", {0, 1, 2}, use_dropout ? std::vector<int>{1, 2} : std::vector<int>{1}, 1,
                  /*uses_rng=*/use_dropout);
  return single(apply_op(
      s, {q, k, v},
      [=](const Tensors& in, ForwardCtx& ctx) {
        const at::Tensor &qt = in[0], &kt = in[1], &vt = in[2];
        const at::Tensor scores = causal_scores(qt, kt, scale, window);       // (B, H, T, T)
        const at::Tensor lse = at::logsumexp(scores, {-1}, /*keepdim=*/true);  // (B, H, T, 1)
        const at::Tensor att = at::exp(at::sub(scores, lse));                 // (B, H, T, T), 0 in the future
        if (!use_dropout) return Tensors{at::matmul(att, vt), lse};
        RATION_ASSERT(ctx.generator.has_value(), "causal_attention ran without its recorded generator");
        at::Tensor keep = at::empty_like(att, att.options().dtype(at::kBool).requires_grad(false));
        keep.bernoulli_(1.0 - dropout_p, *ctx.generator);
        return Tensors{at::matmul(att.mul(keep).mul(keep_scale), vt), lse, keep};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor qt = ctx.input(0), kt = ctx.input(1), vt = ctx.input(2);
        const at::Tensor att = at::exp(at::sub(causal_scores(qt, kt, scale, window), ctx.output(1)));  // (B, H, T, T)
        at::Tensor keep;
        if (use_dropout) keep = ctx.output(2);
        Tensors d(3);
        if (ctx.needs_input_grad(2)) {
          const at::Tensor att_d = use_dropout ? att.mul(keep).mul(keep_scale) : att;
          d[2] = at::matmul(att_d.transpose(-2, -1), g[0]);
        }
        if (ctx.needs_input_grad(0) || ctx.needs_input_grad(1)) {
          at::Tensor datt = at::matmul(g[0], vt.transpose(-2, -1));  // (B, H, T, T)
          if (use_dropout) datt = at::native_dropout_backward(datt, keep, keep_scale);
          const at::Tensor dscores = at::_softmax_backward_data(datt, att, -1, att.scalar_type()).mul(scale);
          if (ctx.needs_input_grad(0)) d[0] = at::matmul(dscores, kt);
          if (ctx.needs_input_grad(1)) d[1] = at::matmul(dscores.transpose(-2, -1), qt);
        }
        return d;
      }));
}

}  // namespace ration::ops
