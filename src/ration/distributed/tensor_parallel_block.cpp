// tensor_parallel_block.cpp — the tensor-parallel transformer block (see tensor_parallel_block.h): the shard
// layout, sharding in place, and the forward over column-parallel, attention and row-parallel ops.
#include "ration/distributed/tensor_parallel_block.h"

#include <utility>

#include "ration/base/allocator.h"
#include "ration/base/check.h"
#include "ration/distributed/tensor_parallel.h"
#include "ration/ops/ops.h"

namespace ration::dist {

// ---- the layout -------------------------------------------------------------------------------------
int64_t block_split_dim(const std::string& name) {
  if (name == "attn.qkv.weight" || name == "attn.qkv.bias" || name == "mlp.fc.weight" || name == "mlp.fc.bias")
    return 0;  // column parallel: output rows
  if (name == "attn.proj.weight" || name == "mlp.proj.weight") return 1;  // row parallel: input columns
  return -1;  // ln1, ln2, the row-parallel biases
}

int64_t block_split_parts(const std::string& name) {
  return name == "attn.qkv.weight" || name == "attn.qkv.bias" ? 3 : 1;
}

at::Tensor tensor_shard(const at::Tensor& full, int64_t dim, int64_t parts, int rank, int size) {
  RATION_CHECK(dim >= 0 && dim < full.dim() && parts >= 1 && size >= 1 && rank >= 0 && rank < size &&
                   full.size(dim) % (parts * size) == 0,
               "tensor_shard: ", full.sizes(), " along dim ", dim, " does not split into ", parts, " parts of ", size,
               " equal slices (rank ", rank, ")");
  const int64_t part = full.size(dim) / parts, slice = part / size;
  std::vector<at::Tensor> pieces;
  for (int64_t p = 0; p < parts; ++p) pieces.push_back(full.narrow(dim, p * part + rank * slice, slice));
  return at::cat(pieces, dim).contiguous();
}

at::Tensor merge_tensor_shards(const std::vector<at::Tensor>& shards, int64_t dim, int64_t parts) {
  RATION_CHECK(!shards.empty() && parts >= 1, "merge_tensor_shards needs at least one shard and one part");
  const int64_t slice = shards[0].size(dim) / parts;
  std::vector<at::Tensor> pieces;
  for (int64_t p = 0; p < parts; ++p)
    for (const at::Tensor& s : shards) {
      RATION_CHECK(s.sizes() == shards[0].sizes(), "merge_tensor_shards: shards of different shapes ", s.sizes(),
                   " and ", shards[0].sizes());
      pieces.push_back(s.narrow(dim, p * slice, slice));
    }
  return at::cat(pieces, dim);
}

// ---- sharding in place --------------------------------------------------------------------------------
TensorParallelBlock::TensorParallelBlock(std::shared_ptr<nn::TransformerBlock> block, World group)
    : block_(std::move(block)), group_(std::move(group)) {
  RATION_ASSERT(block_ && group_.defined(), "TensorParallelBlock needs a block and a process group");
  const nn::MultiHeadAttention& attn = *block_->attn;
  const int size = group_.size();
  RATION_ASSERT(attn.n_head % size == 0 && (4 * attn.n_embd) % size == 0, "block ", block_->name(), ": n_head ",
                attn.n_head, " and 4 n_embd ", 4 * attn.n_embd, " must be divisible by the group's ", size, " ranks");
  heads_per_rank_ = attn.n_head / size;
  // The block's own parameters, by their names within it: each becomes this rank's slice (same Value,
  // same TensorImpl, new storage); the whole tensor's storage goes when its last holder does, which is now
  // (the model holds parameters only through these Values).
  for (auto& [name, p] : block_->named_parameters()) {
    const int64_t dim = block_split_dim(name);
    if (dim < 0) continue;
    const at::Tensor t = p.tensor();
    at::Tensor shard = tensor_shard(t, dim, block_split_parts(name), group_.rank(), size);
    memory::retag(shard, memory::Category::Parameters);
    t.set_data(shard);
  }
}

// ---- forward ------------------------------------------------------------------------------------------
Value TensorParallelBlock::forward(const Value& x) {
  nn::TransformerBlock& b = *block_;
  ScopeGuard scope(b.name());
  Value h = x + attention(b.ln1->forward(x));  // (B, T, C)
  return h + mlp(b.ln2->forward(h));           // (B, T, C)
}

Value TensorParallelBlock::attention(const Value& x) {
  nn::MultiHeadAttention& a = *block_->attn;
  ScopeGuard scope(a.name());
  RATION_CHECK(x.dim() == 3 && x.size(2) == a.n_embd, "attention expects (B, T, ", a.n_embd, "); got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), H = heads_per_rank_, D = a.n_embd / a.n_head, Cr = H * D;
  Value qkv;
  {
    ScopeGuard qkv_scope(a.qkv->name());
    qkv = column_parallel_linear(x, a.qkv->weight, a.qkv->bias, group_);  // (B, T, 3 Cr): [q_r, k_r, v_r]
  }
  Values parts = ops::split(qkv, Cr, 2);  // 3 x (B, T, Cr)
  auto to_heads = [&](const Value& t) { return ops::transpose(ops::reshape(t, {B, T, H, D}), 1, 2); };
  const ops::HeadSlice heads{group_.rank() * H, a.n_head};
  Value y = ops::causal_attention(to_heads(parts[0]), to_heads(parts[1]), to_heads(parts[2]), a.attn_dropout,
                                  a.is_training(), a.window, heads);  // (B, H/T, T, D)
  y = ops::reshape(ops::transpose(y, 1, 2), {B, T, Cr});             // (B, T, C/T): columns of this rank's heads
  Value out;
  {
    ScopeGuard proj_scope(a.proj->name());
    out = row_parallel_linear(y, a.proj->weight, a.proj->bias, group_);  // (B, T, C), all-reduced
  }
  return a.resid_drop->forward(out);
}

Value TensorParallelBlock::mlp(const Value& x) {
  nn::TransformerMLP& m = *block_->mlp;
  ScopeGuard scope(m.name());
  Value hidden;
  {
    ScopeGuard fc_scope(m.fc->name());
    hidden = column_parallel_linear(x, m.fc->weight, m.fc->bias, group_);  // (B, T, 4C/T)
  }
  hidden = ops::gelu(hidden);
  Value out;
  {
    ScopeGuard proj_scope(m.proj->name());
    out = row_parallel_linear(hidden, m.proj->weight, m.proj->bias, group_);  // (B, T, C), all-reduced
  }
  return m.drop->forward(out);
}

}  // namespace ration::dist
