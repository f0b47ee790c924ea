// attention.cpp — causal scaled-dot-product attention with optional dropout on the attention weights.
//
//   scores = q k^T / sqrt(D)           (B, H, T, T), entries above the diagonal set to -inf
//                                      (window L > 0: also entries more than L below the diagonal)
//   att    = softmax(scores, -1)       (B, H, T, T)
//   att_d  = att * keep / (1 - p)      (B, H, T, T)  only when dropout is active
//   y      = att_d v                   (B, H, T, D)
// With Tk > Tq keys (a chunk of queries after Tk - Tq cached steps, see ops.h) the diagonal is shifted by
// Tk - Tq.
//
// What backward keeps: q, k, v (inputs; each is needed for another's gradient), the weights att
// (internal output 1, (B, H, T, T) — the largest activation of a transformer block) and, only with
// dropout, the bool keep-mask (internal output 2, (B, H, T, T), 1 byte each). The weights are a saved
// value like any other, so the memory plan decides their fate: kept (no budget, or a budget that allows
// it: backward then pays nothing extra), or dropped and rebuilt by re-running this op's forward from q,
// k, v with its recorded generator (bitwise the same att and keep-mask; docs/METHODS.md, "Budgeted
// retention of saved activations"). The softmax gradient is ATen's _softmax_backward_data on att.
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

// q k^T * scale with the masked positions set to -inf: (B, H, Tq, Tk).
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

  // outputs: 0 y (B, H, T, D); 1 att (B, H, T, T), internal; 2 keep-mask (B, H, T, T) bool, internal, dropout only
  OpSpec s = spec("causal_attention", {0, 1, 2}, use_dropout ? std::vector<int>{1, 2} : std::vector<int>{1}, 1,
                  /*uses_rng=*/use_dropout);
  return single(apply_op(
      s, {q, k, v},
      [=](const Tensors& in, ForwardCtx& ctx) {
        const at::Tensor &qt = in[0], &kt = in[1], &vt = in[2];
        const at::Tensor att = at::_softmax(causal_scores(qt, kt, scale, window), -1, false);  // (B, H, T, T)
        if (!use_dropout) return Tensors{at::matmul(att, vt), att};
        RATION_ASSERT(ctx.generator.has_value(), "causal_attention ran without its recorded generator");
        at::Tensor keep = at::empty_like(att, att.options().dtype(at::kBool).requires_grad(false));
        keep.bernoulli_(1.0 - dropout_p, *ctx.generator);
        return Tensors{at::matmul(att.mul(keep).mul_(keep_scale), vt), att, keep};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor qt = ctx.input(0), kt = ctx.input(1), vt = ctx.input(2);
        const at::Tensor att = ctx.output(1);  // (B, H, T, T)
        at::Tensor keep;
        if (use_dropout) keep = ctx.output(2);
        Tensors d(3);
        if (ctx.needs_input_grad(2)) {
          const at::Tensor att_d = use_dropout ? att.mul(keep).mul_(keep_scale) : att;
          d[2] = at::matmul(att_d.transpose(-2, -1), g[0]);
        }
        if (ctx.needs_input_grad(0) || ctx.needs_input_grad(1)) {
          at::Tensor datt = at::matmul(g[0], vt.transpose(-2, -1));  // (B, H, T, T)
          if (use_dropout) datt = at::native_dropout_backward(datt, keep, keep_scale);
          const at::Tensor dscores = at::_softmax_backward_data(datt, att, -1, att.scalar_type()).mul_(scale);
          if (ctx.needs_input_grad(0)) d[0] = at::matmul(dscores, kt);
          if (ctx.needs_input_grad(1)) d[1] = at::matmul(dscores.transpose(-2, -1), qt);
        }
        return d;
      }));
}

}  // namespace ration::ops
