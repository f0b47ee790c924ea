// reduce.cpp — sum and mean, over everything or over dims.
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
// Gradient of a reduction over `dims` (empty = all) broadcast back to the input's shape.
at::Tensor expand_reduced(at::Tensor g, at::IntArrayRef input_shape, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t nd = static_cast<int64_t>(input_shape.size());
  if (!keepdim && !dims.empty()) {
    std::vector<int64_t> sorted;
    for (auto d : dims) sorted.push_back(d < 0 ? d + nd : d);
    std::sort(sorted.begin(), sorted.end());
    for (auto d : sorted) g = g.unsqueeze(d);
  }
  return g.expand(input_shape);
}

int64_t reduced_count(at::IntArrayRef shape, const std::vector<int64_t>& dims) {
  if (dims.empty()) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  int64_t n = 1;
  for (auto d : dims) n *= shape[static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(shape.size()) : d)];
  return n;
}

Value reduce(const char* name, const Value& x, std::vector<int64_t> dims, bool keepdim, bool is_mean) {
  return single(apply_op(
      spec(name), {x},
      [dims, keepdim, is_mean](const Tensors& in, ForwardCtx&) {
        if (dims.empty()) return Tensors{is_mean ? in[0].mean() : in[0].sum()};
        return Tensors{is_mean ? in[0].mean(dims, keepdim) : in[0].sum(dims, keepdim)};
      },
      [dims, keepdim, is_mean](BackwardCtx& ctx, const Tensors& g) {
        const auto shape = input_sizes(ctx, 0);
        at::Tensor d = expand_reduced(g[0], shape, dims, keepdim);
        if (is_mean) d = d / static_cast<double>(reduced_count(shape, dims));
        return Tensors{d};
      }));
}
}  // namespace

Value sum(const Value& x) { return reduce("sum", x, {}, false, false); }
Value sum(const Value& x, std::vector<int64_t> dims, bool keepdim) { return reduce("sum", x, std::move(dims), keepdim, false); }
Value mean(const Value& x) { return reduce("mean", x, {}, false, true); }
Value mean(const Value& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce("mean", x, std::move(dims), keepdim, true);
}

}  // namespace ration::ops
