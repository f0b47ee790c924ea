// op_util.h — small helpers shared by ops/*.cpp (not part of the public API).
#pragma once
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <vector>

#include "ration/core/node.h"

namespace ration::ops::detail {

inline at::IntArrayRef input_sizes(const BackwardCtx& ctx, int i) {
  return ctx.node().input_meta.at(static_cast<size_t>(i)).sizes;
}

// Reduce a broadcast gradient back to the shape of the input it flowed from.
inline at::Tensor unbroadcast(const at::Tensor& g, at::IntArrayRef shape) {
  if (g.sizes() == shape) return g;
  return at::sum_to(g, shape);
}

inline OpSpec spec(const char* name, std::vector<int> save_inputs = {}, std::vector<int> save_outputs = {},
                   int visible_outputs = 1, bool uses_rng = false) {
  OpSpec s;
  s.name = name;
  s.save_inputs = std::move(save_inputs);
  s.save_outputs = std::move(save_outputs);
  s.visible_outputs = visible_outputs;
  s.uses_rng = uses_rng;
  return s;
}

inline Value single(Values v) { return std::move(v.at(0)); }

// Dropout's keep-mask (bool, shape of `like`): true with probability keep_prob, drawn from `gen`. Drawn as
// uniform < keep_prob: one uniform per element, about twice as fast on CPU as ATen's bernoulli_.
inline at::Tensor keep_mask(const at::Tensor& like, double keep_prob, at::Generator& gen) {
  const at::ScalarType draw = like.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // never bf16/half draws
  return at::empty(like.sizes(), like.options().dtype(draw).requires_grad(false)).uniform_(0.0, 1.0, gen).lt(keep_prob);
}

// x * keep * scale (dropout's forward, and its backward with x = the incoming gradient), in one buffer of
// x's shape. The bool mask is first turned into x's dtype: ATen multiplies float by bool several times
// slower than float by float, and 0/1 in float gives bitwise the same products.
inline at::Tensor masked_scaled(const at::Tensor& x, const at::Tensor& keep, double scale) {
  at::Tensor out = keep.to(x.scalar_type());
  if (x.requires_grad()) return x.mul(out).mul(scale);  // oracle mode: torch autograd records it
  return out.mul_(x).mul_(scale);
}

}  // namespace ration::ops::detail
