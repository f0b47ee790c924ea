// tensor_parallel.h — Megatron-style tensor-parallel linear layers as ops of ration's autograd.
// Owns: the ops column_parallel_linear, row_parallel_linear, all_gather_last_dim (forward, backward,
//       what they save, where their collectives run) and the modules ColumnParallelLinear /
//       RowParallelLinear (shard construction from the same initialisation as nn::Linear).
// Does not own: the collectives (distributed/world.h), residency of saved values (memory/).
//
// With n = world.size() ranks and a full layer y = x W^T + b, W (out, in):
//   column parallel: rank r holds W_r = W[r*out/n : (r+1)*out/n, :] and b_r; y_r = x W_r^T + b_r is the
//                    r-th slice of y's last dim. x is identical on every rank (its saved handle is marked
//                    with the world's ReplicaGroup: an offloader may keep 1/n of it; docs/METHODS.md,
//                    Sharded offload over a process group).
//   row parallel:    rank r holds W_r = W[:, r*in/n : (r+1)*in/n] and the whole b; it receives x_r, the
//                    r-th slice of x's last dim (e.g. a column-parallel output), and
//                    y = sum_r x_r W_r^T + b, identical on every rank.
// A column-parallel layer followed by pointwise ops and a row-parallel layer (an MLP block) needs one
// all-reduce in forward (row) and one in backward (column), and nothing in between.
//
// Conventions: every rank runs the same program (SPMD): the same ops in the same order with the same
// requires_grad flags, because backward closures call collectives when an input needs a gradient. The
// loss downstream of a replicated output is computed identically on every rank, so gradients of
// replicated values are replicated too. These ops have no libtorch-autograd (OracleScope) form: compare
// against the full single-process layers instead (tests/distributed/worker.cpp does).
#pragma once
#include <cstdint>

#include "ration/core/value.h"
#include "ration/distributed/world.h"
#include "ration/nn/module.h"

namespace ration::dist {

// x (..., in), w_shard (out/n, in), b_shard (out/n) or undefined -> y_r (..., out/n).
// Forward is local (recompute is local); backward: dW_r = g_r^T x, db_r = sum g_r, dx = all_reduce(g_r W_r).
Value column_parallel_linear(const Value& x, const Value& w_shard, const Value& b_shard, const World& world);

// x_r (..., in/n), w_shard (out, in/n), b (out, replicated) or undefined -> y (..., out), replicated.
// Forward all-reduces; backward is local: dx_r = g W_r, dW_r = g^T x_r, db = sum g.
Value row_parallel_linear(const Value& x_r, const Value& w_shard, const Value& b, const World& world);

// y_r (..., k) on every rank -> (..., n*k): the ranks' tensors concatenated along the last dim in rank
// order. Backward takes this rank's slice of the (replicated) gradient.
Value all_gather_last_dim(const Value& y_r, const World& world);

// Bytes the ops above have all-reduced or all-gathered in this process so far (each collective's payload,
// the tensor's bytes: a ring all-reduce sends 2(n-1)/n of it per rank), recomputes included; read before
// and after a step for the step's tensor-parallel traffic.
int64_t tensor_parallel_collective_bytes();

// Linear split over output features. Built from the same draw as nn::Linear(in, out, bias) (so with the
// same at::manual_seed the full weight equals nn::Linear's), keeping rows [rank*out/n, (rank+1)*out/n).
// Parameters: weight (out/n, in), bias (out/n). forward: x (..., in) -> (..., out/n), or (..., out) when
// gather_output.
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, World world, bool bias = true,
                       bool gather_output = false);
  Value forward(const Value& x);
  Value weight;
  Value bias;  // undefined when bias = false
  int64_t in_features, out_features, out_per_rank;
  bool gather_output;
  World world;
};

// Linear split over input features. Built from the same draw as nn::Linear(in, out, bias), keeping
// columns [rank*in/n, (rank+1)*in/n) of the weight and the whole bias.
// Parameters: weight (out, in/n), bias (out). forward: x_r (..., in/n) -> (..., out), replicated.
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, World world, bool bias = true);
  Value forward(const Value& x_r);
  Value weight;
  Value bias;  // undefined when bias = false
  int64_t in_features, out_features, in_per_rank;
  World world;
};

}  // namespace ration::dist
