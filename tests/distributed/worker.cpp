// worker.cpp — one rank of the multi-process tests (ration_dist_worker), started n times by
// ration_dist_launch (tests/distributed/launch.cpp) with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT or
// RATION_STORE_FILE. Every rank runs every test below in the same order (the collectives pair up).
// Checks, on every rank:
//   * the World collectives and C10dReplicaGroup (uint8 all-gather) against values known in closed form;
//   * the tensor-parallel MLP x -> ColumnParallelLinear -> gelu -> RowParallelLinear: forward output,
//     dx, this rank's dW / db shards equal the full single-process layers differentiated by libtorch
//     autograd (OracleScope) on the full weights (and by ration's engine), f64 <= 1e-12, f32 <= 1e-5
//     relative (max |a-b| / max(1, max |oracle|)); the TP sum order differs from the full matmul, so the
//     f64 results agree to rounding (~1e-16), not bitwise;
//   * dropping every saved value and recomputing it (row parallel's all-reduce re-runs in backward) gives
//     bitwise the same gradients, and the column-parallel input carries the world's ReplicaGroup;
//   * ColumnParallelLinear(gather_output) equals nn::Linear, forward and backward.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <memory>

#include "op_check.h"
#include "test_util.h"
#include "ration/base/check.h"
#include "ration/distributed/tensor_parallel.h"
#include "ration/distributed/world.h"
#include "worker_main.h"
#include "ration/nn/layers.h"
#include "ration/ops/ops.h"

namespace ration::dist {
namespace {

using ration::testing::max_rel_error;

using testing::world;

double tolerance(at::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-5; }

// ---- collectives -----------------------------------------------------------------------------------
TEST(DistCollectives, AllReduceSumIsTheSumOverRanks) {
  const World& w = world();
  const int n = w.size(), r = w.rank();
  at::Tensor t = at::full({2, 3}, r + 1.0, at::kDouble) + at::arange(6, at::kDouble).view({2, 3});
  w.all_reduce_sum(t);
  const at::Tensor expected = at::full({2, 3}, n * (n + 1) / 2.0, at::kDouble) + n * at::arange(6, at::kDouble).view({2, 3});
  EXPECT_TRUE(at::equal(t, expected)) << t;
  // A non-contiguous view is reduced in place too.
  at::Tensor base = at::full({3, 2}, static_cast<float>(r), at::kFloat);
  at::Tensor view = base.t();
  w.all_reduce_sum(view);
  EXPECT_TRUE(at::equal(base, at::full({3, 2}, n * (n - 1) / 2.0, at::kFloat))) << base;
}

TEST(DistCollectives, AllGatherConcatenatesInRankOrder) {
  const World& w = world();
  const int n = w.size(), r = w.rank();
  at::Tensor t = at::arange(6, at::kLong).view({2, 3}) + 100 * r;
  at::Tensor flat = w.all_gather(t);
  ASSERT_EQ(flat.sizes(), at::IntArrayRef({6 * n}));
  EXPECT_EQ(flat.scalar_type(), at::kLong);
  for (int q = 0; q < n; ++q) {
    EXPECT_TRUE(at::equal(flat.narrow(0, 6 * q, 6), at::arange(6, at::kLong) + 100 * q)) << "rank " << q << flat;
  }
}

TEST(DistCollectives, BroadcastCopiesTheRoot) {
  const World& w = world();
  const int root = w.size() - 1;
  at::Tensor t = at::full({4}, 10.0 * w.rank(), at::kFloat);
  w.broadcast(t, root);
  EXPECT_TRUE(at::equal(t, at::full({4}, 10.0 * root, at::kFloat))) << t;
  w.barrier();
}

TEST(DistCollectives, ReplicaGroupGathersUint8Shards) {
  const World& w = world();
  std::shared_ptr<ReplicaGroup> group = w.replica_group();
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group, w.replica_group()) << "one shared instance per world";
  EXPECT_EQ(group->rank(), w.rank());
  EXPECT_EQ(group->size(), w.size());
  // Bytes that overflow int8 (>= 128) must come back unchanged: uint8 is carried as uint8.
  at::Tensor shard = (at::arange(5, at::kInt) * 51 + 200 + 7 * w.rank()).remainder(256).to(at::kByte);
  at::Tensor all = group->all_gather(shard);
  ASSERT_EQ(all.scalar_type(), at::kByte);
  ASSERT_EQ(all.sizes(), at::IntArrayRef({5 * w.size()}));
  for (int q = 0; q < w.size(); ++q) {
    const at::Tensor expected = (at::arange(5, at::kInt) * 51 + 200 + 7 * q).remainder(256).to(at::kByte);
    EXPECT_TRUE(at::equal(all.narrow(0, 5 * q, 5), expected)) << "rank " << q << " " << all;
  }
  ration::testing::expect_error_containing([&] { group->all_gather(at::zeros({2, 2}, at::kByte)); }, "1-D uint8");
}

// ---- tensor-parallel MLP -------------------------------------------------------------------------------
constexpr int64_t kB = 3, kT = 5, kD = 8, kH = 16;  // x (B, T, D), hidden H (divisible by 2 and 4)
constexpr uint64_t kInitSeed = 2024, kDataSeed = 7;

struct FullMlp {
  std::shared_ptr<nn::Linear> fc, proj;
};
struct TpMlp {
  std::shared_ptr<ColumnParallelLinear> fc;
  std::shared_ptr<RowParallelLinear> proj;
};

FullMlp make_full(at::ScalarType dtype) {
  at::manual_seed(kInitSeed);
  FullMlp m{std::make_shared<nn::Linear>(kD, kH), std::make_shared<nn::Linear>(kH, kD)};
  m.fc->to(at::TensorOptions().dtype(dtype));
  m.proj->to(at::TensorOptions().dtype(dtype));
  return m;
}

TpMlp make_tp(at::ScalarType dtype) {
  at::manual_seed(kInitSeed);
  TpMlp m{std::make_shared<ColumnParallelLinear>(kD, kH, world()), std::make_shared<RowParallelLinear>(kH, kD, world())};
  m.fc->to(at::TensorOptions().dtype(dtype));
  m.proj->to(at::TensorOptions().dtype(dtype));
  return m;
}

Value full_forward(const FullMlp& m, const Value& x) { return m.proj->forward(ops::gelu(m.fc->forward(x))); }
Value tp_forward(const TpMlp& m, const Value& x) { return m.proj->forward(ops::gelu(m.fc->forward(x))); }

struct Grads {
  at::Tensor y, dx, dw1, db1, dw2, db2;
};

std::pair<at::Tensor, at::Tensor> make_data(at::ScalarType dtype) {
  at::manual_seed(kDataSeed);
  at::Tensor x = at::randn({kB, kT, kD}, at::kDouble).to(dtype);  // (B, T, D)
  at::Tensor u = at::randn({kB, kT, kD}, at::kDouble).to(dtype);  // (B, T, D) upstream gradient
  return {x, u};
}

template <typename Mlp>
Grads grads_of_mlp(const Mlp& m, const at::Tensor& xt, const at::Tensor& u, bool oracle, MemoryPolicy* policy,
                   Value (*forward)(const Mlp&, const Value&)) {
  Value x(xt.clone(), /*requires_grad=*/true);
  std::vector<Value> params{x};
  for (auto& p : m.fc->parameters()) params.push_back(p);
  for (auto& p : m.proj->parameters()) params.push_back(p);
  for (auto& p : params) p.grad() = at::Tensor();
  Grads g;
  if (oracle) {
    OracleScope scope(params);
    Value y = forward(m, x);
    g.y = y.tensor().detach().clone();
    y.backward(u);
  } else {
    PolicyScope scope(policy);
    Value y = forward(m, x);
    g.y = y.tensor().clone();
    y.backward(u);
  }
  g.dx = x.grad();
  g.dw1 = m.fc->weight.grad();
  g.db1 = m.fc->bias.grad();
  g.dw2 = m.proj->weight.grad();
  g.db2 = m.proj->bias.grad();
  return g;
}

void check_tp_mlp_matches_full(at::ScalarType dtype) {
  const World& w = world();
  const int64_t n = w.size(), r = w.rank(), h = kH / n;
  const double tol = tolerance(dtype);
  FullMlp full = make_full(dtype);
  TpMlp tp = make_tp(dtype);

  // The shards are exactly this rank's slices of the full initialisation.
  ASSERT_EQ(tp.fc->weight.sizes(), at::IntArrayRef({h, kD}));
  ASSERT_EQ(tp.proj->weight.sizes(), at::IntArrayRef({kD, h}));
  EXPECT_TRUE(at::equal(tp.fc->weight.tensor(), full.fc->weight.tensor().narrow(0, r * h, h)));
  EXPECT_TRUE(at::equal(tp.fc->bias.tensor(), full.fc->bias.tensor().narrow(0, r * h, h)));
  EXPECT_TRUE(at::equal(tp.proj->weight.tensor(), full.proj->weight.tensor().narrow(1, r * h, h)));
  EXPECT_TRUE(at::equal(tp.proj->bias.tensor(), full.proj->bias.tensor()));

  auto [x, u] = make_data(dtype);
  const Grads oracle = grads_of_mlp(full, x, u, /*oracle=*/true, nullptr, &full_forward);
  const Grads engine = grads_of_mlp(full, x, u, /*oracle=*/false, nullptr, &full_forward);
  const Grads tpg = grads_of_mlp(tp, x, u, /*oracle=*/false, nullptr, &tp_forward);
  for (const at::Tensor* t : {&oracle.dx, &oracle.dw1, &oracle.db1, &oracle.dw2, &oracle.db2, &tpg.dx, &tpg.dw1,
                              &tpg.db1, &tpg.dw2, &tpg.db2}) {
    ASSERT_TRUE(t->defined()) << "a gradient did not arrive";
  }
  // Sanity: the oracle is not trivially zero, and ration's engine on the full layers agrees with it.
  EXPECT_GT(oracle.dw1.abs().max().item<double>(), 1e-3);
  EXPECT_LE(max_rel_error(engine.y, oracle.y), tol);
  EXPECT_LE(max_rel_error(engine.dx, oracle.dx), tol);

  EXPECT_EQ(tpg.y.sizes(), oracle.y.sizes());
  EXPECT_EQ(tpg.y.scalar_type(), dtype);
  EXPECT_LE(max_rel_error(tpg.y, oracle.y), tol) << "forward output";
  EXPECT_LE(max_rel_error(tpg.dx, oracle.dx), tol) << "dx (all-reduced in column-parallel backward)";
  EXPECT_LE(max_rel_error(tpg.dw1, oracle.dw1.narrow(0, r * h, h)), tol) << "column dW shard";
  EXPECT_LE(max_rel_error(tpg.db1, oracle.db1.narrow(0, r * h, h)), tol) << "column db shard";
  EXPECT_LE(max_rel_error(tpg.dw2, oracle.dw2.narrow(1, r * h, h)), tol) << "row dW shard";
  EXPECT_LE(max_rel_error(tpg.db2, oracle.db2), tol) << "row db (replicated)";
  // Replicated results agree across ranks (compare every rank's copy with rank 0's).
  for (const at::Tensor* t : {&tpg.y, &tpg.dx, &tpg.db2}) {
    at::Tensor all = w.all_gather(*t).view({n, -1});
    for (int64_t q = 1; q < n; ++q) EXPECT_LE(max_rel_error(all[q], all[0]), tol) << "rank " << q << " vs rank 0";
  }
  std::printf("[rank %d/%d] %s: |y-oracle| %.3g, |dx-oracle| %.3g, |dW1-oracle| %.3g, |dW2-oracle| %.3g\n",
              w.rank(), w.size(), c10::toString(dtype), max_rel_error(tpg.y, oracle.y),
              max_rel_error(tpg.dx, oracle.dx), max_rel_error(tpg.dw1, oracle.dw1.narrow(0, r * h, h)),
              max_rel_error(tpg.dw2, oracle.dw2.narrow(1, r * h, h)));
}

TEST(DistTensorParallel, MlpMatchesFullLayersFloat64) { check_tp_mlp_matches_full(at::kDouble); }
TEST(DistTensorParallel, MlpMatchesFullLayersFloat32) { check_tp_mlp_matches_full(at::kFloat); }

// x -> column -> gelu -> row -> y*y: y is saved by mul, so dropping it makes backward re-run the row
// all-reduce; every rank drops the same values, so the collectives pair up.
Value tp_forward_squared(const TpMlp& m, const Value& x) {
  Value y = tp_forward(m, x);
  return ops::mul(y, y);
}

TEST(DistTensorParallel, DropAllRecomputeIsBitwiseEqual) {
  TpMlp tp = make_tp(at::kDouble);
  auto [x, u] = make_data(at::kDouble);
  const Grads plain = grads_of_mlp(tp, x, u, false, nullptr, &tp_forward_squared);
  ration::testing::DropAllPolicy drop;
  const Grads dropped = grads_of_mlp(tp, x, u, false, &drop, &tp_forward_squared);
  EXPECT_GE(drop.recomputes, 3) << "column, gelu and row outputs should have been recomputed";
  EXPECT_TRUE(at::equal(plain.y, dropped.y));
  EXPECT_TRUE(at::equal(plain.dx, dropped.dx));
  EXPECT_TRUE(at::equal(plain.dw1, dropped.dw1));
  EXPECT_TRUE(at::equal(plain.db1, dropped.db1));
  EXPECT_TRUE(at::equal(plain.dw2, dropped.dw2));
  EXPECT_TRUE(at::equal(plain.db2, dropped.db2));
}

TEST(DistTensorParallel, ColumnInputIsMarkedReplicated) {
  const World& w = world();
  TpMlp tp = make_tp(at::kDouble);
  auto [xt, u] = make_data(at::kDouble);
  Value x(xt, true);
  Value h = tp.fc->forward(x);
  ASSERT_NE(h.grad_fn(), nullptr);
  int found = 0;
  for (const auto& ref : h.grad_fn()->saved) {
    if (!ref.is_output && ref.index == 0) {
      ++found;
      ASSERT_NE(ref.value->replicas(), nullptr);
      EXPECT_EQ(ref.value->replicas(), w.replica_group());
      EXPECT_EQ(ref.value->replicas()->size(), w.size());
      EXPECT_EQ(ref.value->replicas()->rank(), w.rank());
    } else {
      EXPECT_EQ(ref.value->replicas(), nullptr) << "only x is identical across ranks";
    }
  }
  EXPECT_EQ(found, 1);
}

TEST(DistTensorParallel, GatheredColumnOutputMatchesLinear) {
  const World& w = world();
  const int64_t n = w.size(), r = w.rank(), h = kH / n;
  at::manual_seed(kInitSeed);
  nn::Linear full(kD, kH);
  at::manual_seed(kInitSeed);
  ColumnParallelLinear col(kD, kH, w, /*bias=*/true, /*gather_output=*/true);
  full.to(at::TensorOptions().dtype(at::kDouble));
  col.to(at::TensorOptions().dtype(at::kDouble));
  at::manual_seed(kDataSeed);
  at::Tensor xt = at::randn({kB, kT, kD}, at::kDouble);
  at::Tensor u = at::randn({kB, kT, kH}, at::kDouble);

  Value xo(xt.clone(), true);
  at::Tensor y_oracle, dx_oracle;
  {
    OracleScope scope({xo, full.weight, full.bias});
    Value y = full.forward(xo);
    y_oracle = y.tensor().detach().clone();
    y.backward(u);
  }
  Value x(xt.clone(), true);
  Value y = col.forward(x);
  ASSERT_EQ(y.sizes(), at::IntArrayRef({kB, kT, kH}));
  y.backward(u);
  EXPECT_LE(max_rel_error(y.tensor(), y_oracle), 1e-12);
  EXPECT_LE(max_rel_error(x.grad(), xo.grad()), 1e-12);
  EXPECT_LE(max_rel_error(col.weight.grad(), full.weight.grad().narrow(0, r * h, h)), 1e-12);
  EXPECT_LE(max_rel_error(col.bias.grad(), full.bias.grad().narrow(0, r * h, h)), 1e-12);
}

}  // namespace
}  // namespace ration::dist

int main(int argc, char** argv) {
  // Launcher self-test (ctest Dist.LauncherStopsAllRanksWhenOneFails): this rank dies before rendezvous.
  const char* fail_rank = std::getenv("RATION_DIST_TEST_FAIL_RANK");
  const char* rank = std::getenv("RANK");
  if (fail_rank != nullptr && rank != nullptr && std::string(fail_rank) == rank) {
    std::fprintf(stderr, "rank %s: failing on purpose (RATION_DIST_TEST_FAIL_RANK)\n", rank);
    return 3;
  }
  return ration::dist::testing::run_worker(argc, argv, "ration_dist_worker");
}
