// test_dist.cpp — dist/ checks that need no second process: World::init's environment errors, the
// one-process world (init_single, and a real Gloo group of size 1 over a FileStore), and the tensor-parallel
// ops on one rank against finite differences, nn::Linear and drop-all recompute. The multi-process checks
// (n = 2, 4) are tests/distributed/worker.cpp, launched by ctest through ration_dist_launch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "op_check.h"
#include "ration/distributed/tensor_parallel.h"
#include "ration/distributed/world.h"
#include "ration/nn/layers.h"
#include "ration/ops/ops.h"
#include "test_util.h"

namespace ration::dist {
namespace {

using ration::testing::expect_error_containing;
using Env = std::map<std::string, std::string>;

Env tcp_env() { return {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}; }

Env without(Env env, const std::string& name) {
  env.erase(name);
  return env;
}
Env with(Env env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}

// ---- World::init errors -------------------------------------------------------------------------------
TEST(DistWorldEnv, MissingVariablesAreNamedWithTheirForm) {
  expect_error_containing([] { World::init_from(without(tcp_env(), "RANK")); },
                          {"RANK is not set", "an integer in [0, WORLD_SIZE) = [0, 2)", "init_single"});
  expect_error_containing([] { World::init_from(without(tcp_env(), "WORLD_SIZE")); },
                          {"WORLD_SIZE is not set", "an integer >= 1"});
  expect_error_containing([] { World::init_from(without(tcp_env(), "MASTER_ADDR")); },
                          {"MASTER_ADDR is not set", "host name or IP address of rank 0", "RATION_STORE_FILE"});
  expect_error_containing([] { World::init_from(without(tcp_env(), "MASTER_PORT")); },
                          {"MASTER_PORT is not set", "integer in [1, 65535]"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "RANK", "")); }, {"RANK is empty"});
}

TEST(DistWorldEnv, GarbledVariablesAreNamedWithTheirValue) {
  expect_error_containing([] { World::init_from(with(tcp_env(), "RANK", "1x")); },
                          {"RANK='1x' is not valid", "[0, 2)"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "RANK", "2")); }, {"RANK='2' is not valid"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "RANK", "-1")); }, {"RANK='-1' is not valid"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "WORLD_SIZE", "two")); },
                          {"WORLD_SIZE='two' is not valid", "an integer >= 1"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "WORLD_SIZE", "0")); },
                          {"WORLD_SIZE='0' is not valid"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "MASTER_PORT", "70000")); },
                          {"MASTER_PORT='70000' is not valid", "[1, 65535]"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "MASTER_PORT", "http")); },
                          {"MASTER_PORT='http' is not valid"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "RATION_STORE_FILE", "")); },
                          {"RATION_STORE_FILE is set but empty"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "RATION_DIST_TIMEOUT_S", "soon")); },
                          {"RATION_DIST_TIMEOUT_S='soon' is not valid"});
  expect_error_containing([] { World::init_from(with(tcp_env(), "RATION_DIST_BACKEND", "mpi")); },
                          {"RATION_DIST_BACKEND='mpi'", "gloo or nccl"});
#ifndef RATION_CUDA
  expect_error_containing([] { World::init_from(with(tcp_env(), "RATION_DIST_BACKEND", "nccl")); },
                          {"nccl needs a build with -DRATION_CUDA=ON"});
#endif
}

// Sets (or unsets) one process environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(DistWorldEnv, InitReadsTheProcessEnvironment) {
  ScopedEnv rank("RANK", nullptr), size("WORLD_SIZE", "4"), addr("MASTER_ADDR", "127.0.0.1"),
      port("MASTER_PORT", "1234"), file("RATION_STORE_FILE", nullptr);
  expect_error_containing([] { World::init(); }, {"RANK is not set", "[0, 4)"});
  ScopedEnv bad_rank("RANK", "zero");
  expect_error_containing([] { World::init(); }, {"RANK='zero' is not valid"});
}

// ---- one-process worlds -------------------------------------------------------------------------------
void check_collectives_on_one_rank(const World& w) {
  ASSERT_EQ(w.rank(), 0);
  ASSERT_EQ(w.size(), 1);
  at::Tensor t = at::arange(6, at::kDouble).view({2, 3});
  at::Tensor before = t.clone();
  w.all_reduce_sum(t);
  EXPECT_TRUE(at::equal(t, before));
  at::Tensor g = w.all_gather(t);
  EXPECT_EQ(g.sizes(), at::IntArrayRef({6}));
  EXPECT_TRUE(at::equal(g, before.view({-1})));
  EXPECT_FALSE(g.is_same(t));
  w.broadcast(t, 0);
  EXPECT_TRUE(at::equal(t, before));
  expect_error_containing([&] { w.broadcast(t, 1); }, "broadcast root 1 is not a rank");
  w.barrier();
  auto group = w.replica_group();
  at::Tensor shard = at::arange(250, 256, at::kInt).to(at::kByte);
  at::Tensor all = group->all_gather(shard);
  EXPECT_EQ(all.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(all, shard));
}

TEST(DistWorld, InitSingleNeedsNoEnvironment) {
  World w = World::init_single();
  EXPECT_EQ(w.process_group().get(), nullptr);
  EXPECT_EQ(w.backend(), Backend::Gloo);
  check_collectives_on_one_rank(w);
}

TEST(DistWorld, GlooGroupOfOneOverAFileStore) {
  ration::testing::TempDir dir("dist-filestore");
  World w = World::init_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"RATION_STORE_FILE", (dir.path / "store").string()}});
  ASSERT_NE(w.process_group().get(), nullptr);
  EXPECT_EQ(w.process_group()->getSize(), 1);
  check_collectives_on_one_rank(w);
}

TEST(DistWorld, UndefinedWorldIsAClearError) {
  World w;
  EXPECT_FALSE(w.defined());
  expect_error_containing([&] { (void)w.rank(); }, "uninitialised dist::World");
}

// ---- tensor-parallel ops on one rank ---------------------------------------------------------------------
using ration::testing::finite_difference;
using ration::testing::grads_of;
using ration::testing::max_rel_error;
using ration::testing::Mode;
using ration::testing::OpInput;
using ration::testing::randd;

// check_op without its libtorch leg (the ops refuse oracle mode): engine vs finite differences, and
// drop-all recompute bitwise equal to plain.
void check_single_rank_op(const ration::testing::OpFn& f, const std::vector<OpInput>& inputs) {
  at::Tensor y;
  {
    NoGradGuard no_grad;
    Values vals;
    for (const auto& in : inputs) vals.emplace_back(in.tensor, false);
    y = f(vals).tensor();
  }
  const at::Tensor upstream = at::randn(y.sizes(), at::kDouble);
  const auto engine = grads_of(f, inputs, upstream, Mode::Engine);
  int recomputes = 0;
  const auto dropped = grads_of(f, inputs, upstream, Mode::DropAll, 1234, &recomputes);
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(engine[i].defined());
    EXPECT_EQ(engine[i].sizes(), inputs[i].tensor.sizes());
    EXPECT_TRUE(at::equal(engine[i], dropped[i]));
    EXPECT_LE(max_rel_error(engine[i], finite_difference(f, inputs, upstream, i, 1e-6, 1234)), 1e-6);
  }
}

TEST(DistTensorParallelSingle, OpsMatchFiniteDifferences) {
  const World w = World::init_single();
  at::manual_seed(3);
  // gelu after each op so drop-all has something to recompute.
  check_single_rank_op([&](const Values& v) { return ops::gelu(column_parallel_linear(v[0], v[1], v[2], w)); },
                       {{randd({2, 3, 4})}, {randd({5, 4})}, {randd({5})}});
  check_single_rank_op([&](const Values& v) { return ops::gelu(row_parallel_linear(v[0], v[1], v[2], w)); },
                       {{randd({2, 3, 4})}, {randd({5, 4})}, {randd({5})}});
  check_single_rank_op([&](const Values& v) { return ops::gelu(all_gather_last_dim(v[0], w)); }, {{randd({3, 4})}});
}

TEST(DistTensorParallelSingle, ModulesOfOneRankEqualLinear) {
  const World w = World::init_single();
  at::manual_seed(11);
  nn::Linear full(6, 4);
  at::manual_seed(11);
  ColumnParallelLinear col(6, 4, w);
  at::manual_seed(11);
  RowParallelLinear row(6, 4, w);
  EXPECT_TRUE(at::equal(col.weight.tensor(), full.weight.tensor()));
  EXPECT_TRUE(at::equal(col.bias.tensor(), full.bias.tensor()));
  EXPECT_TRUE(at::equal(row.weight.tensor(), full.weight.tensor()));
  EXPECT_TRUE(at::equal(row.bias.tensor(), full.bias.tensor()));
  EXPECT_EQ(col.named_parameters().at(0).first, "weight");
  const Value x(at::randn({2, 6}));
  EXPECT_TRUE(at::allclose(col.forward(x).tensor(), full.forward(x).tensor()));
  EXPECT_TRUE(at::allclose(row.forward(x).tensor(), full.forward(x).tensor()));
}

TEST(DistTensorParallelSingle, ShapeAndOracleErrorsAreClear) {
  const World w = World::init_single();
  const Value x(at::randn({2, 6}, at::kDouble), true), wt(at::randn({4, 5}, at::kDouble), true);
  expect_error_containing([&] { column_parallel_linear(x, wt, Value(), w); },
                          {"column_parallel_linear", "input (..., 5)"});
  expect_error_containing([&] { RowParallelLinear(6, 4, World()); }, "needs an initialised World");
  OracleScope scope({wt});
  expect_error_containing([&] { row_parallel_linear(x, Value(at::randn({4, 6}, at::kDouble)), Value(), w); },
                          {"row_parallel_linear has no libtorch-autograd form", "full single-process layers"});
}

}  // namespace
}  // namespace ration::dist
