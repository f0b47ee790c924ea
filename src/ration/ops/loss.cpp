// loss.cpp — cross_entropy (log_softmax + nll with ignore_index, mean) and mse_loss (mean).
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

Value cross_entropy(const Value& logits, const Value& target, int64_t ignore_index) {
  RATION_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
               "cross_entropy expects logits (N, C) and target (N); got ", logits.sizes(), " and ", target.sizes());
  RATION_CHECK(target.dtype() == at::kLong, "cross_entropy target must be int64 class indices; got ", target.dtype());
  // outputs: 0 loss (visible), 1 log-probabilities, 2 total weight (count of non-ignored targets)
  return single(apply_op(
      spec("cross_entropy", {1}, {1, 2}), {logits, target},
      [ignore_index](const Tensors& in, ForwardCtx&) {
        at::Tensor logp = at::log_softmax(in[0], 1);
        auto [loss, total_weight] = at::nll_loss_forward(logp, in[1], {}, at::Reduction::Mean, ignore_index);
        return Tensors{loss, logp, total_weight};
      },
      [ignore_index](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor logp = ctx.output(1);
        at::Tensor dlogp = at::nll_loss_backward(g[0], logp, ctx.input(1), {}, at::Reduction::Mean, ignore_index,
                                                 ctx.output(2));
        return Tensors{at::_log_softmax_backward_data(dlogp, logp, 1, logp.scalar_type()), {}};
      }));
}

Value mse_loss(const Value& input, const Value& target) {
  RATION_CHECK(input.sizes() == target.sizes(), "mse_loss shapes differ: ", input.sizes(), " vs ", target.sizes());
  return single(apply_op(
      spec("mse_loss", {0, 1}), {input, target},
      [](const Tensors& in, ForwardCtx&) { return Tensors{at::mse_loss(in[0], in[1], at::Reduction::Mean)}; },
      [](BackwardCtx& ctx, const Tensors& g) {
        at::Tensor d = at::mse_loss_backward(g[0], ctx.input(0), ctx.input(1), at::Reduction::Mean);
        Tensors out(2);
        if (ctx.needs_input_grad(0)) out[0] = d;
        if (ctx.needs_input_grad(1)) out[1] = -d;
        return out;
      }));
}

}  // namespace ration::ops
