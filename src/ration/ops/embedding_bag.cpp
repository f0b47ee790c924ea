// embedding_bag.cpp — embedding_bag (multi-hot lookups reduced per bag) with a sparse row gradient.
// Owns: the op (forward through at::embedding_bag, so the libtorch oracle differentiates the same
//       kernel), its backward, and sparse_rows(), the accessor for the gradient it produces.
// Does not own: where the table lives (a model parameter, or rows pulled from a parameter server:
//       ps/client.h) or how sparse gradients are applied (ps/store.h runs the optimiser on the rows).
//
// Gradient for the table: a coalesced sparse COO tensor of the table's shape whose indices are the
// unique ids of the batch (sorted) and whose values are their summed row gradients (U, D). Nothing of
// the table's size is allocated. When the table is itself computed by other ops (not a leaf), the
// gradient is densified so the producer's backward sees an ordinary tensor.
// What backward keeps: ids, offsets and per_sample_weights (inputs); the table only when the weights
// need a gradient (d out[b] / d w_i = row[id_i]).
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {

// For each position i of ids, the bag it belongs to. offsets (B) are bag starts (non-decreasing, first 0);
// bags may be empty (repeated offsets), including trailing ones (offsets equal to n).
at::Tensor bag_of_position(const at::Tensor& offsets, int64_t n) {
  at::Tensor marks = at::zeros({n + 1}, offsets.options());
  if (offsets.size(0) > 1) {
    at::Tensor starts = offsets.slice(0, 1);
    marks.index_add_(0, starts, at::ones_like(starts));
  }
  return marks.slice(0, 0, n).cumsum(0);
}

// Number of ids in each bag (B).
at::Tensor bag_sizes(const at::Tensor& offsets, int64_t n) {
  at::Tensor ends = at::cat({offsets.slice(0, 1), at::full({1}, n, offsets.options())});
  return ends - offsets;
}

}  // namespace

std::string embedding_bag_mode_name(EmbeddingBagMode mode) { return mode == EmbeddingBagMode::Sum ? "sum" : "mean"; }

Value embedding_bag(const Value& table_rows, const Value& ids, const Value& offsets, EmbeddingBagMode mode,
                    const Value& per_sample_weights) {
  RATION_CHECK(table_rows.dim() == 2, "embedding_bag table must be (rows, D); got ", table_rows.sizes());
  RATION_CHECK(ids.dim() == 1 && ids.dtype() == at::kLong, "embedding_bag ids must be int64 (n); got ", ids.dtype(),
               " ", ids.sizes());
  RATION_CHECK(offsets.dim() == 1 && offsets.dtype() == at::kLong && offsets.size(0) >= 1,
               "embedding_bag offsets must be int64 (B) bag starts with B >= 1; got ", offsets.dtype(), " ",
               offsets.sizes());
  RATION_CHECK(!ids.requires_grad() && !offsets.requires_grad(), "embedding_bag ids/offsets cannot require grad");
  const int64_t rows = table_rows.size(0);
  const int64_t n = ids.size(0);
  {
    const at::Tensor& o = offsets.tensor();
    RATION_CHECK(o[0].item<int64_t>() == 0, "embedding_bag offsets must start at 0; got ", o[0].item<int64_t>());
    RATION_CHECK(o.size(0) < 2 || (o.slice(0, 1) >= o.slice(0, 0, -1)).all().item<bool>(),
                 "embedding_bag offsets must be non-decreasing");
    RATION_CHECK(o[-1].item<int64_t>() <= n, "embedding_bag last offset ", o[-1].item<int64_t>(),
                 " is past the ", n, " ids");
  }
  if (n > 0) {
    const int64_t lo = ids.tensor().min().item<int64_t>();
    const int64_t hi = ids.tensor().max().item<int64_t>();
    RATION_CHECK(lo >= 0 && hi < rows, "embedding_bag ids must be in [0, ", rows, "); got range [", lo, ", ", hi, "]");
  }
  const bool weighted = per_sample_weights.defined();
  if (weighted) {
    RATION_CHECK(mode == EmbeddingBagMode::Sum, "embedding_bag per_sample_weights need mode sum (as in PyTorch); got ",
                 embedding_bag_mode_name(mode));
    RATION_CHECK(per_sample_weights.dim() == 1 && per_sample_weights.size(0) == n &&
                     per_sample_weights.dtype() == table_rows.dtype(),
                 "embedding_bag per_sample_weights must be (", n, ") of the table's dtype; got ",
                 per_sample_weights.dtype(), " ", per_sample_weights.sizes());
  }
  const int64_t torch_mode = mode == EmbeddingBagMode::Sum ? 0 : 1;
  const bool weights_need_grad = weighted && per_sample_weights.requires_grad();
  std::vector<int> saved = {1, 2};
  if (weighted) saved.push_back(3);
  if (weights_need_grad) saved.push_back(0);
  return single(apply_op(
      spec("embedding_bag", saved), {table_rows, ids, offsets, per_sample_weights},
      [torch_mode](const Tensors& in, ForwardCtx&) {
        auto out = at::embedding_bag(in[0], in[1], in[2], /*scale_grad_by_freq=*/false, torch_mode,
                                     /*sparse=*/false, in[3], /*include_last_offset=*/false);
        return Tensors{std::get<0>(out)};
      },
      [mode, rows](BackwardCtx& ctx, const Tensors& g) {
        const at::Tensor idx = ctx.input(1);
        const at::Tensor off = ctx.input(2);
        const int64_t count = idx.size(0);
        const at::Tensor bag = bag_of_position(off, count);
        at::Tensor per_pos = g[0].index_select(0, bag);  // (n, D): upstream of each position's bag
        Tensors out(4);
        if (ctx.needs_input_grad(3)) {
          out[3] = (per_pos * ctx.input(0).index_select(0, idx)).sum(1);
        }
        if (ctx.needs_input_grad(0)) {
          at::Tensor scale;
          if (mode == EmbeddingBagMode::Mean) {
            scale = bag_sizes(off, count).clamp_min(1).to(g[0].scalar_type()).reciprocal().index_select(0, bag);
          }
          if (ctx.node().inputs[3] != nullptr) scale = ctx.input(3);
          if (scale.defined()) per_pos = per_pos * scale.unsqueeze(1);
          auto [unique, inverse, counts] = at::_unique2(idx, /*sorted=*/true, /*return_inverse=*/true, false);
          at::Tensor row_grads = at::zeros({unique.size(0), g[0].size(1)}, g[0].options());
          row_grads.index_add_(0, inverse, per_pos);
          at::Tensor sparse = at::sparse_coo_tensor(unique.unsqueeze(0), row_grads, {rows, g[0].size(1)},
                                                    g[0].options().layout(at::kSparse))
                                  ._coalesced_(true);
          const bool table_is_leaf = ctx.node().next_edges[0].node == nullptr;
          out[0] = table_is_leaf ? sparse : sparse.to_dense();
        }
        return out;
      }));
}

SparseRows sparse_rows(const at::Tensor& grad) {
  RATION_CHECK(grad.defined() && grad.is_sparse() && grad.sparse_dim() == 1 && grad.dense_dim() == 1,
               "sparse_rows expects a sparse (rows, D) gradient from embedding_bag; got ",
               grad.defined() ? grad.toString() : std::string("undefined"));
  at::Tensor c = grad.is_coalesced() ? grad : grad.coalesce();
  return {c._indices().view({-1}), c._values()};
}

}  // namespace ration::ops
