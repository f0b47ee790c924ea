// norm.cpp — layer_norm, batch_norm, dropout, embedding.
// What backward keeps:
//   layer_norm  x, w, b and the internal outputs mean/rstd (B..., 1) from native_layer_norm.
//   batch_norm  train: x, w and the internal outputs save_mean/save_invstd (C);
//               eval: x, w and the running stats (inputs, so an in-place change before backward is caught).
//   dropout     the bool keep-mask (internal output 1, shape of x): 1 byte per element, never x or y.
//               y = x * mask * scale and dx = g * mask * scale in one buffer each (op_util.h, masked_scaled).
//   embedding   the int64 indices only.
//
// batch_norm running statistics (the buffers, not graph values) are updated OUTSIDE the forward closure,
// in batch_norm() after apply_op returns, so a recompute that re-runs the closure never touches them.
// The closure computes the batch statistics exactly as libtorch's kernel feeds its own running update:
// native_batch_norm is given fresh zero buffers with momentum 1, so they come back holding exactly the
// batch mean and the unbiased batch variance (1*s + 0*0 == s). Those two (C) tensors are extra visible
// outputs (their gradient is zero and ignored) that batch_norm() folds into the real buffers:
//   running = (1 - momentum) * running + momentum * batch_stat.
// This matches at::batch_norm's running stats up to the rounding of that one update (a few ulps).
#include "ration/base/check.h"

#include <ATen/core/grad_mode.h>
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
bool has_input(const BackwardCtx& ctx, int i) { return ctx.node().inputs.at(static_cast<size_t>(i)) != nullptr; }
at::Tensor input_or_undefined(BackwardCtx& ctx, int i) { return has_input(ctx, i) ? ctx.input(i) : at::Tensor(); }
}  // namespace

Value layer_norm(const Value& x, std::vector<int64_t> normalized_shape, const Value& w, const Value& b, double eps) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool trailing = k >= 1 && x.dim() >= k;
  for (int64_t i = 0; trailing && i < k; ++i) trailing = x.size(x.dim() - k + i) == normalized_shape[static_cast<size_t>(i)];
  RATION_CHECK(trailing, "layer_norm: normalized_shape ", at::IntArrayRef(normalized_shape),
               " must be the trailing dims of the input ", x.sizes());
  RATION_CHECK(!w.defined() || w.sizes() == at::IntArrayRef(normalized_shape), "layer_norm weight ", w.sizes(),
               " must have shape ", at::IntArrayRef(normalized_shape));
  RATION_CHECK(!b.defined() || b.sizes() == at::IntArrayRef(normalized_shape), "layer_norm bias ", b.sizes(),
               " must have shape ", at::IntArrayRef(normalized_shape));
  // outputs: 0 y (shape of x), 1 mean (B..., 1...), 2 rstd (B..., 1...), internal
  return single(apply_op(
      spec("layer_norm", {0, 1, 2}, {1, 2}), {x, w, b},
      [normalized_shape, eps](const Tensors& in, ForwardCtx&) {
        auto [y, mean, rstd] = at::native_layer_norm(in[0], normalized_shape, in[1], in[2], eps);
        return Tensors{y, mean, rstd};
      },
      [normalized_shape](BackwardCtx& ctx, const Tensors& g) {
        const std::array<bool, 3> mask{ctx.needs_input_grad(0), has_input(ctx, 1) && ctx.needs_input_grad(1),
                                       has_input(ctx, 2) && ctx.needs_input_grad(2)};
        auto [dx, dw, db] =
            at::native_layer_norm_backward(g[0], ctx.input(0), normalized_shape, ctx.output(1), ctx.output(2),
                                           input_or_undefined(ctx, 1), input_or_undefined(ctx, 2), mask);
        return Tensors{dx, dw, db};
      }));
}

Value batch_norm(const Value& x, const Value& w, const Value& b, at::Tensor running_mean, at::Tensor running_var,
                 bool training, double momentum, double eps) {
  RATION_CHECK(x.defined() && x.dim() >= 2, "batch_norm expects input (B, C, ...); got ",
               x.defined() ? x.sizes() : at::IntArrayRef{});
  const int64_t channels = x.size(1);
  for (const Value* p : {&w, &b}) {
    RATION_CHECK(!p->defined() || (p->dim() == 1 && p->size(0) == channels), "batch_norm weight/bias must be (C=",
                 channels, "); got ", p->sizes());
  }
  for (const at::Tensor* r : {&running_mean, &running_var}) {
    RATION_CHECK(!r->defined() || (r->dim() == 1 && r->size(0) == channels), "batch_norm running stats must be (C=",
                 channels, "); got ", r->sizes());
  }
  RATION_CHECK(running_mean.defined() == running_var.defined(),
               "batch_norm: give both running_mean and running_var, or neither");

  if (!training) {
    RATION_CHECK(running_mean.defined(), "batch_norm in eval mode needs running_mean/running_var buffers");
    // inputs: x, w, b, running_mean (C), running_var (C) — the stats are constants, saved for backward.
    return single(apply_op(
        spec("batch_norm_eval", {0, 1, 3, 4}), {x, w, b, Value(running_mean), Value(running_var)},
        [eps](const Tensors& in, ForwardCtx&) {
          auto [y, unused_mean, unused_invstd] =
              at::native_batch_norm(in[0], in[1], in[2], in[3], in[4], /*training=*/false, 0.0, eps);
          return Tensors{y};
        },
        [eps](BackwardCtx& ctx, const Tensors& g) {
          const std::array<bool, 3> mask{ctx.needs_input_grad(0), has_input(ctx, 1) && ctx.needs_input_grad(1),
                                         has_input(ctx, 2) && ctx.needs_input_grad(2)};
          auto [dx, dw, db] = at::native_batch_norm_backward(g[0], ctx.input(0), input_or_undefined(ctx, 1),
                                                             ctx.input(3), ctx.input(4), {}, {},
                                                             /*train=*/false, eps, mask);
          return Tensors{dx, dw, db, {}, {}};
        }));
  }

  RATION_CHECK(x.numel() / channels > 1, "batch_norm in training needs more than one value per channel; got input ",
               x.sizes());
  // outputs: 0 y (shape of x); 1 batch mean (C), 2 unbiased batch var (C) — visible only so batch_norm()
  // can update the running buffers; 3 save_mean (C), 4 save_invstd (C) — internal, for backward.
  Values outs = apply_op(
      spec("batch_norm", {0, 1}, {3, 4}, /*visible_outputs=*/3), {x, w, b},
      [eps](const Tensors& in, ForwardCtx&) {
        // The stats take the parameters' dtype when given (CPU mixed precision: bf16 input, float params).
        const at::TensorOptions stat_options = (in[1].defined() ? in[1] : in[0]).options().requires_grad(false);
        at::Tensor batch_mean = at::zeros({in[0].size(1)}, stat_options);  // (C)
        at::Tensor batch_var = at::zeros({in[0].size(1)}, stat_options);   // (C)
        auto [y, save_mean, save_invstd] =
            at::native_batch_norm(in[0], in[1], in[2], batch_mean, batch_var, /*training=*/true, /*momentum=*/1.0, eps);
        return Tensors{y, batch_mean, batch_var, save_mean, save_invstd};
      },
      [eps](BackwardCtx& ctx, const Tensors& g) {
        const std::array<bool, 3> mask{ctx.needs_input_grad(0), has_input(ctx, 1) && ctx.needs_input_grad(1),
                                       has_input(ctx, 2) && ctx.needs_input_grad(2)};
        auto [dx, dw, db] = at::native_batch_norm_backward(g[0], ctx.input(0), input_or_undefined(ctx, 1), {}, {},
                                                           ctx.output(3), ctx.output(4), /*train=*/true, eps, mask);
        return Tensors{dx, dw, db};
      });
  if (running_mean.defined()) {
    at::NoGradGuard no_grad;
    running_mean.mul_(1.0 - momentum).add_(outs[1].tensor().detach(), momentum);
    running_var.mul_(1.0 - momentum).add_(outs[2].tensor().detach(), momentum);
  }
  return outs[0];
}

Value dropout(const Value& x, double p, bool training) {
  RATION_CHECK(p >= 0.0 && p <= 1.0, "dropout probability must be in [0, 1]; got ", p);
  if (!training || p == 0.0) return x;
  const double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  // outputs: 0 y (shape of x), 1 keep-mask (shape of x, bool), internal
  return single(apply_op(
      spec("dropout", {}, {1}, 1, /*uses_rng=*/true), {x},
      [p, scale](const Tensors& in, ForwardCtx& ctx) {
        RATION_ASSERT(ctx.generator.has_value(), "dropout ran without its recorded generator");
        at::Tensor mask = keep_mask(in[0], 1.0 - p, *ctx.generator);
        return Tensors{masked_scaled(in[0], mask, scale), mask};
      },
      [scale](BackwardCtx& ctx, const Tensors& g) { return Tensors{masked_scaled(g[0], ctx.output(1), scale)}; }));
}

Value embedding(const Value& weight, const Value& indices, int64_t padding_idx) {
  RATION_CHECK(weight.dim() == 2, "embedding weight must be (num_embeddings, D); got ", weight.sizes());
  RATION_CHECK(indices.dtype() == at::kLong, "embedding indices must be int64; got ", indices.dtype());
  RATION_CHECK(!indices.requires_grad(), "embedding indices cannot require grad (they are integer positions)");
  const int64_t num = weight.size(0);
  RATION_CHECK(padding_idx >= -1 && padding_idx < num, "embedding padding_idx ", padding_idx,
               " out of range for ", num, " embeddings (use -1 for none)");
  return single(apply_op(
      spec("embedding", {1}), {weight, indices},
      [padding_idx](const Tensors& in, ForwardCtx&) { return Tensors{at::embedding(in[0], in[1], padding_idx)}; },
      [num, padding_idx](BackwardCtx& ctx, const Tensors& g) {
        return Tensors{at::embedding_dense_backward(g[0], ctx.input(1), num, padding_idx,
                                                    /*scale_grad_by_freq=*/false),
                       {}};
      }));
}

}  // namespace ration::ops
