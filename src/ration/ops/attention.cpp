// attention.cpp — causal scaled-dot-product attention with optional dropout on the attention weights.
// Owns: ops::causal_attention — its maths, what each of its two nodes saves, and their backward.
// Does not own: whether the weights stay resident (the memory plan decides, see below).
//
//   scores = q k^T / sqrt(D)           (B, H, Tq, Tk), entries above the diagonal set to -inf
//                                      (window L > 0: also entries more than L below the diagonal)
//   att    = softmax(scores, -1)       (B, H, Tq, Tk)
//   att_d  = att * keep / (1 - p)      (B, H, Tq, Tk)  only when dropout is active
//   y      = att_d v                   (B, H, Tq, D)
// With Tk > Tq keys (a chunk of queries after Tk - Tq cached steps, see ops.h) the diagonal is shifted by
// Tk - Tq; window 0 and Tk == Tq build the causal mask.
//
// Two nodes, so that the (B, H, T, T) weights are a saved value like any other (docs/METHODS.md,
// "Attention weights as a saved value"):
//   causal_attention_weights  (q, k) -> att      saves q, k and att (softmax backward reads att)
//   causal_attention          (att, v) -> y      saves att and v; with dropout, its bool keep-mask
//                                                (internal output 1, 1 byte per weight)
// Unconstrained, att stays resident until the weights node's backward: backward never rebuilds it. Under a
// memory budget the plan may drop att like any other saved storage (its bytes against its producer's
// forward time, which the profile measured); a dropped att is rebuilt by re-running the weights node from
// q and k — the same closure, so bitwise the same weights — when the first of its two readers' backward
// needs it. Only the weights node re-runs: y, v and the keep-mask are untouched. The dropout generator
// belongs to the second node, so the masks drawn are independent of how att was obtained. Given a HeadSlice
// (a tensor-parallel rank's heads), the node draws the whole layer's mask and keeps its heads' slice: T
// ranks draw what one process drew (the seed stream advances the same on every rank).
#include <cmath>
#include <limits>

#include "ration/base/check.h"
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

// softmax(q k^T * scale with the masked positions at -inf): (B, H, Tq, Tk), 0 at the masked positions.
// The scores are scaled and masked in place, so at most two (Tq, Tk) planes per head are live at once —
// in forward and in a plan's re-run alike. Under oracle mode (torch autograd tensors) the out-of-place
// forms keep autograd's graph valid.
at::Tensor causal_weights(const at::Tensor& q, const at::Tensor& k, double scale, int64_t window) {
  const at::Tensor mask = future_mask(q.size(2), k.size(2), window, q.device());
  constexpr double kMasked = -std::numeric_limits<double>::infinity();
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (scores.requires_grad()) {
    scores = scores.mul(scale).masked_fill(mask, kMasked);
  } else {
    scores.mul_(scale).masked_fill_(mask, kMasked);
  }
  return at::_softmax(scores, -1, /*half_to_float=*/false);
}

// Node 1: (q, k) -> att. Backward: the softmax gradient, then q's and k's.
Value attention_weights(const Value& q, const Value& k, double scale, int64_t window) {
  OpSpec s = spec("causal_attention_weights", {0, 1}, {0});
  return single(apply_op(
      s, {q, k},
      [=](const Tensors& in, ForwardCtx&) { return Tensors{causal_weights(in[0], in[1], scale, window)}; },
      [=](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor att = ctx.output(0);
        const at::Tensor dscores = at::_softmax_backward_data(g[0], att, -1, att.scalar_type()).mul_(scale);
        Tensors d(2);
        if (ctx.needs_input_grad(0)) d[0] = at::matmul(dscores, ctx.input(1));
        if (ctx.needs_input_grad(1)) d[1] = at::matmul(dscores.transpose(-2, -1), ctx.input(0));
        return d;
      }));
}

// The keep-mask of `att` (B, H, Tq, Tk): drawn for the layer's `heads.total` heads, then this slice's H
// (the generator's draws are in element order, so the slice is the one-process mask's; the whole mask is
// transient, the saved one is the slice's).
at::Tensor head_keep_mask(const at::Tensor& att, double keep_prob, at::Generator& gen, const HeadSlice& heads) {
  if (heads.total == 0 || heads.total == att.size(1)) return keep_mask(att, keep_prob, gen);
  std::vector<int64_t> all = att.sizes().vec();
  all[1] = heads.total;
  const at::Tensor whole = keep_mask(at::empty({}, att.options()).expand(all), keep_prob, gen);  // (B, total, Tq, Tk)
  return whole.narrow(1, heads.first, att.size(1)).contiguous();                                  // (B, H, Tq, Tk)
}

// Node 2: (att, v) -> y, with dropout on att. Backward: v's gradient from (dropped-out) att, att's from v.
Value attention_apply(const Value& att, const Value& v, double dropout_p, bool use_dropout, HeadSlice heads) {
  const double keep_scale = use_dropout ? 1.0 / (1.0 - dropout_p) : 1.0;
  // outputs: 0 y (B, H, T, D); 1 keep-mask (B, H, T, T) bool, internal, dropout only
  OpSpec s = spec("causal_attention", {0, 1}, use_dropout ? std::vector<int>{1} : std::vector<int>{}, 1,
                  /*uses_rng=*/use_dropout);
  return single(apply_op(
      s, {att, v},
      [=](const Tensors& in, ForwardCtx& ctx) {
        const at::Tensor &a = in[0], &vt = in[1];
        if (!use_dropout) return Tensors{at::matmul(a, vt)};
        RATION_ASSERT(ctx.generator.has_value(), "causal_attention ran without its recorded generator");
        at::Tensor keep = head_keep_mask(a, 1.0 - dropout_p, *ctx.generator, heads);
        return Tensors{at::matmul(masked_scaled(a, keep, keep_scale), vt), keep};
      },
      [=](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(2);
        at::Tensor keep;
        if (use_dropout) keep = ctx.output(1);
        if (ctx.needs_input_grad(1)) {
          const at::Tensor a = ctx.input(0);
          d[1] = at::matmul((use_dropout ? masked_scaled(a, keep, keep_scale) : a).transpose(-2, -1), g[0]);
        }
        if (ctx.needs_input_grad(0)) {
          d[0] = at::matmul(g[0], ctx.input(1).transpose(-2, -1));  // (B, H, T, T)
          if (use_dropout) d[0] = masked_scaled(d[0], keep, keep_scale);
        }
        return d;
      }));
}
}  // namespace

Value causal_attention(const Value& q, const Value& k, const Value& v, double dropout_p, bool training,
                       int64_t window, HeadSlice heads) {
  RATION_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == q.size(0) &&
                   k.size(1) == q.size(1) && k.size(3) == q.size(3) && k.size(2) >= q.size(2),
               "causal_attention expects q (B, H, Tq, D) and k, v (B, H, Tk >= Tq, D); got ", q.sizes(), ", ",
               k.sizes(), ", ", v.sizes());
  RATION_CHECK(window >= 0, "causal_attention window must be >= 0 (0 = no window); got ", window);
  RATION_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "causal_attention dropout_p must be in [0, 1); got ", dropout_p);
  RATION_CHECK(heads.total == 0 || (heads.first >= 0 && heads.first + q.size(1) <= heads.total),
               "causal_attention: heads [", heads.first, ", ", heads.first + q.size(1), ") are not within the layer's ",
               heads.total, " heads");
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const bool use_dropout = training && dropout_p > 0.0;
  return attention_apply(attention_weights(q, k, scale, window), v, dropout_p, use_dropout, heads);
}

}  // namespace ration::ops
