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

}  // namespace ration::ops::detail
