// tensor_parallel_block.h — a pre-LN transformer block (nn::TransformerBlock) split Megatron-style over a
// tensor-parallel process group, and the layout of its shards (docs/DISTRIBUTED.md, "Tensor parallelism").
// Owns: sharding a block's weights in place (the parameters keep their Values and names; their tensors
//       become this rank's slices and the whole tensors' memory is released), the block's forward over the
//       shards, and where each of its parameters is split (block_split_dim / block_split_parts; tensor_shard
//       and merge_tensor_shards: the one statement of the layout, which checkpoints read).
// Does not own: the ops (tensor_parallel.h: column/row-parallel linear; ops/attention.cpp: the heads'
//       dropout mask), the replicated layers (ln1, ln2, the residual dropouts: the block's own modules,
//       run as they are), the residency of saved values (the memory runtime).
//
// With T ranks, C = n_embd, H = n_head (H % T == 0), D = C / H, rank r keeps:
//   attn.qkv   column parallel by heads. W (3C, C) is [Wq; Wk; Wv] with head h in rows [h D, (h + 1) D) of
//              each part; rank r keeps heads [r H/T, (r + 1) H/T) of each part: (3C/T, C) = [Wq_r; Wk_r;
//              Wv_r], the bias likewise (3C/T). Its input ln1(x) is the same on every rank (marked with the
//              group's ReplicaGroup: under offload each rank stores 1/T of it).
//   attention  over its H/T heads; dropout keeps the slice of the whole layer's mask for these heads.
//   attn.proj  row parallel: W (C, C) keeps columns [r C/T, (r + 1) C/T): (C, C/T); the bias whole (C).
//   mlp.fc     column parallel: (4C/T, C), bias (4C/T). Input ln2(h), marked as replicated.
//   mlp.proj   row parallel: (C, 4C/T), the bias whole (C).
// One all-reduce per sub-block in forward (the row-parallel projection's partial sums) and one in backward
// (the column-parallel layer's input gradient). Everything else is replicated: every rank runs it on the
// same values and consumes the random-seed stream identically, so the residual dropouts draw the same
// masks as one process and the T ranks compute what one process computes (to rounding of the split sums).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ration/core/value.h"
#include "ration/distributed/world.h"
#include "ration/nn/layers.h"

namespace ration::dist {

// Where a block parameter is split over the group, by its name within the block ("attn.qkv.weight"): the
// dimension (the shards in rank order give the whole, see merge_tensor_shards), or -1 when every rank
// holds it whole.
int64_t block_split_dim(const std::string& name_in_block);
// How many equal parts along that dimension are split separately: 3 for attn.qkv (q, k and v each by
// heads), 1 otherwise.
int64_t block_split_parts(const std::string& name_in_block);

// Rank `rank` of `size`'s shard of `full`: each of `parts` equal blocks along `dim` cut into `size` equal
// slices, this rank's slice of every block, concatenated along `dim` (a new contiguous tensor).
at::Tensor tensor_shard(const at::Tensor& full, int64_t dim, int64_t parts, int rank, int size);
// The inverse: the whole tensor from the shards of every rank, in rank order.
at::Tensor merge_tensor_shards(const std::vector<at::Tensor>& shards, int64_t dim, int64_t parts);

class TensorParallelBlock {
 public:
  // Shards `block` over `group` in place (see above). The block's n_head and 4 n_embd must be divisible by
  // group.size() (callers check it first to name their keys; this is the assertion).
  TensorParallelBlock(std::shared_ptr<nn::TransformerBlock> block, World group);
  // x (B, T, C), the same on every rank -> (B, T, C), the same on every rank. Nodes carry the one-process
  // block's scopes ("blocks.0.attn.qkv", ...).
  Value forward(const Value& x);
  nn::TransformerBlock& block() const { return *block_; }

 private:
  Value attention(const Value& x);  // ln1's output (B, T, C) -> the attention sub-block's output (B, T, C)
  Value mlp(const Value& x);        // ln2's output (B, T, C) -> the MLP sub-block's output (B, T, C)

  std::shared_ptr<nn::TransformerBlock> block_;
  World group_;
  int64_t heads_per_rank_ = 0;
};

}  // namespace ration::dist
