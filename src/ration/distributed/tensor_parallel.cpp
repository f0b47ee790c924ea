// tensor_parallel.cpp — the tensor-parallel ops (forward closure, backward closure, saves) and modules.
// Each op follows ops/linalg.cpp: one apply_op call with its OpSpec; backward uses ATen kernels and the
// World's blocking collectives.
#include "ration/distributed/tensor_parallel.h"

#include <atomic>
#include <vector>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/nn/layers.h"

namespace ration::dist {
namespace {
using Tensors = std::vector<at::Tensor>;

std::atomic<int64_t> g_collective_bytes{0};  // tensor_parallel_collective_bytes
void count(const at::Tensor& t) { g_collective_bytes += t.numel() * static_cast<int64_t>(t.element_size()); }

OpSpec op_spec(const char* name, std::vector<int> save_inputs) {
  OpSpec s;
  s.name = name;
  s.save_inputs = std::move(save_inputs);
  return s;
}

void check_not_oracle(const char* op) {
  RATION_CHECK(!oracle_mode(), op, " has no libtorch-autograd form (its collectives are invisible to "
               "torch::autograd); build the oracle from the full single-process layers instead");
}

// dW = g^T x over all leading dims: g (..., out), x (..., in) -> (out, in).
at::Tensor weight_grad(const at::Tensor& g, const at::Tensor& x) {
  return at::mm(g.reshape({-1, g.size(-1)}).t(), x.reshape({-1, x.size(-1)}));
}

// db = sum of g over all leading dims: g (..., out) -> (out).
at::Tensor bias_grad(const at::Tensor& g) { return g.reshape({-1, g.size(-1)}).sum(0); }

}  // namespace

int64_t tensor_parallel_collective_bytes() { return g_collective_bytes.load(); }

Value column_parallel_linear(const Value& x, const Value& w_shard, const Value& b_shard, const World& world) {
  check_not_oracle("column_parallel_linear");
  RATION_CHECK(w_shard.dim() == 2 && x.dim() >= 1 && x.size(-1) == w_shard.size(1),
               "column_parallel_linear: input (..., ", w_shard.size(1), ") expected for weight shard ",
               w_shard.sizes(), "; got input ", x.sizes());
  RATION_CHECK(!b_shard.defined() || (b_shard.dim() == 1 && b_shard.size(0) == w_shard.size(0)),
               "column_parallel_linear: bias shard (", w_shard.size(0), ") expected; got ", b_shard.sizes());
  // x is the same tensor on every rank: the memory runtime may store 1/n of it
  // (docs/METHODS.md, Sharded offload over a process group).
  OpSpec spec = op_spec("column_parallel_linear", {0, 1});
  spec.replicated_inputs = {0};
  spec.replicas = world.replica_group();
  Values out = apply_op(
      spec, {x, w_shard, b_shard},
      // Local: no collective, so recomputing this node touches no other rank.
      [](const Tensors& in, ForwardCtx&) { return Tensors{at::linear(in[0], in[1], in[2])}; },
      [world](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(3);
        if (ctx.needs_input_grad(0)) {
          // Each rank holds the part of dx flowing through its output slice; the sum is the full dx.
          at::Tensor dx = at::matmul(g[0], ctx.input(1));  // (..., in)
          world.all_reduce_sum(dx);
          count(dx);
          d[0] = dx;
        }
        if (ctx.needs_input_grad(1)) d[1] = weight_grad(g[0], ctx.input(0));  // (out/n, in)
        if (ctx.needs_input_grad(2)) d[2] = bias_grad(g[0]);                 // (out/n)
        return d;
      });
  return std::move(out.at(0));
}

Value row_parallel_linear(const Value& x_r, const Value& w_shard, const Value& b, const World& world) {
  check_not_oracle("row_parallel_linear");
  RATION_CHECK(w_shard.dim() == 2 && x_r.dim() >= 1 && x_r.size(-1) == w_shard.size(1),
               "row_parallel_linear: input shard (..., ", w_shard.size(1), ") expected for weight shard ",
               w_shard.sizes(), "; got input ", x_r.sizes());
  RATION_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w_shard.size(0)), "row_parallel_linear: bias (",
               w_shard.size(0), ") expected; got ", b.sizes());
  Values out = apply_op(
      op_spec("row_parallel_linear", {0, 1}), {x_r, w_shard, b},
      // Collective in forward: recomputing this node (its output dropped by a memory policy) re-runs the
      // all-reduce inside backward, so every rank must follow the same keep/recompute plan, or the ranks'
      // collectives no longer pair up.
      [world](const Tensors& in, ForwardCtx&) {
        at::Tensor y = at::linear(in[0], in[1]);  // (..., out), this rank's partial sum
        world.all_reduce_sum(y);
        count(y);
        if (in[2].defined()) y.add_(in[2]);  // once, after the sum
        return Tensors{y};
      },
      [](BackwardCtx& ctx, const Tensors& g) {
        Tensors d(3);
        if (ctx.needs_input_grad(0)) d[0] = at::matmul(g[0], ctx.input(1));     // (..., in/n)
        if (ctx.needs_input_grad(1)) d[1] = weight_grad(g[0], ctx.input(0));   // (out, in/n)
        if (ctx.needs_input_grad(2)) d[2] = bias_grad(g[0]);                  // (out)
        return d;
      });
  return std::move(out.at(0));
}

Value all_gather_last_dim(const Value& y_r, const World& world) {
  check_not_oracle("all_gather_last_dim");
  RATION_CHECK(y_r.dim() >= 1, "all_gather_last_dim needs at least 1 dim; got ", y_r.sizes());
  Values out = apply_op(
      op_spec("all_gather_last_dim", {}), {y_r},
      // Collective in forward: a recompute of this node re-runs the all-gather (same rule as row parallel).
      [world](const Tensors& in, ForwardCtx&) {
        const int n = world.size();
        at::Tensor flat = world.all_gather(in[0]);  // (n * numel)
        count(flat);
        Tensors parts;
        for (int r = 0; r < n; ++r) parts.push_back(flat.narrow(0, r * in[0].numel(), in[0].numel()).view(in[0].sizes()));
        return Tensors{at::cat(parts, -1)};  // (..., n*k)
      },
      [world](BackwardCtx& ctx, const Tensors& g) {
        const int64_t k = g[0].size(-1) / world.size();
        return Tensors{g[0].narrow(-1, world.rank() * k, k).contiguous()};  // (..., k)
      });
  return std::move(out.at(0));
}

// ---- modules --------------------------------------------------------------------------------------
ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, World world_, bool with_bias, bool gather)
    : in_features(in), out_features(out), out_per_rank(0), gather_output(gather), world(std::move(world_)) {
  RATION_CHECK(world.defined(), "ColumnParallelLinear needs an initialised World");
  RATION_CHECK(in > 0 && out > 0 && out % world.size() == 0, "ColumnParallelLinear(", in, " -> ", out,
               "): out_features must be positive and divisible by the world size ", world.size());
  out_per_rank = out / world.size();
  // The same draw as nn::Linear (same generator calls, same order), then this rank's rows.
  nn::Linear full(in, out, with_bias);
  const int64_t first = world.rank() * out_per_rank;
  weight = register_parameter("weight", full.weight.tensor().narrow(0, first, out_per_rank).clone());  // (out/n, in)
  if (with_bias) bias = register_parameter("bias", full.bias.tensor().narrow(0, first, out_per_rank).clone());
}

Value ColumnParallelLinear::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "ColumnParallelLinear(", in_features, " -> ",
               out_features, ") expects input (..., ", in_features, "); got ", x.sizes());
  Value y = column_parallel_linear(x, weight, bias, world);  // (..., out/n)
  return gather_output ? all_gather_last_dim(y, world) : y;
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, World world_, bool with_bias)
    : in_features(in), out_features(out), in_per_rank(0), world(std::move(world_)) {
  RATION_CHECK(world.defined(), "RowParallelLinear needs an initialised World");
  RATION_CHECK(in > 0 && out > 0 && in % world.size() == 0, "RowParallelLinear(", in, " -> ", out,
               "): in_features must be positive and divisible by the world size ", world.size());
  in_per_rank = in / world.size();
  nn::Linear full(in, out, with_bias);
  const int64_t first = world.rank() * in_per_rank;
  weight = register_parameter("weight", full.weight.tensor().narrow(1, first, in_per_rank).clone());  // (out, in/n)
  if (with_bias) bias = register_parameter("bias", full.bias.tensor().clone());                     // (out)
}

Value RowParallelLinear::forward(const Value& x_r) {
  ScopeGuard scope(name());
  RATION_CHECK(x_r.dim() >= 1 && x_r.size(-1) == in_per_rank, "RowParallelLinear(", in_features, " -> ",
               out_features, ") on rank ", world.rank(), " of ", world.size(), " expects its input shard (..., ",
               in_per_rank, "); got ", x_r.sizes());
  return row_parallel_linear(x_r, weight, bias, world);
}

}  // namespace ration::dist
