// offload_worker.cpp — one rank of the sharded-offload tests (ration_dist_offload_worker), started n
// times by ration_dist_launch. Seed M2 step 7: with tensor parallelism the input of a column-parallel
// layer is identical on every rank; under ration::OffloadScope each rank writes only its 1/n of it to the
// tier and backward rebuilds it with an all-gather. Checks, on every rank:
//   * gradients (dx, every parameter) of one step inside OffloadScope equal the plain step bitwise, for
//     the disk, host and host+disk tiers, a throttled tier with prefetch 0 and 2, with and without
//     dropout after the gelu;
//   * the sharding happened: exactly one storage (the replicated input, B*T*D f64) was written, and its
//     written and read bytes are ceil(bytes / n) on this rank, not the whole; with T1 = 0 the local
//     values (column output, gelu/dropout output, dropout mask) are written whole on top, and the total
//     is predicted from the shapes;
//   * after backward the engine holds no entries, the tier holds no bytes, the spill dir is empty;
//   * a tier failure on one rank only is a clear ration::Error there ("sharded offload ... failed on this
//     process"), and the other ranks' all-gather fails with an error instead of hanging (a second world
//     with a 5 s collective timeout, RATION_DIST_TIMEOUT_S, carries that step).
// The counting allocator is installed first thing in main: on CPU only storages it tagged as saved
// activations are offloadable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/distributed/tensor_parallel.h"
#include "ration/distributed/world.h"
#include "worker_main.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/runtime/step_runtime.h"
#include "ration/nn/layers.h"
#include "ration/ops/ops.h"

namespace ration::dist {
namespace {

using memory::OffloadOptions;
using memory::OffloadStats;
using ration::testing::TempDir;

using testing::world;

// x (B, T, IN) -> Linear -> h (B, T, D), identical on every rank, saved by the column layer and marked
// replicated -> ColumnParallelLinear -> (B, T, H/n) -> gelu -> [dropout] -> RowParallelLinear -> (B, T, D).
// D = 130 makes h 266240 bytes (260 KiB): not a multiple of 3, so n = 3 exercises the padded last shard.
constexpr int64_t kB = 4, kT = 64, kIn = 32, kD = 130, kH = 96;  // H divisible by 2, 3 and 4
constexpr uint64_t kInitSeed = 11, kDataSeed = 12, kDropoutSeed = 13;
constexpr double kDropout = 0.25;
constexpr int64_t kF64 = 8;
constexpr int64_t kInputBytes = kB * kT * kD * kF64;  // the replicated value h

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct ShardedMlp {
  std::shared_ptr<nn::Linear> embed;  // replicated: the same weights on every rank
  std::shared_ptr<ColumnParallelLinear> fc;
  std::shared_ptr<RowParallelLinear> proj;
  bool dropout = false;

  ShardedMlp(const World& w, bool with_dropout) : dropout(with_dropout) {
    at::manual_seed(kInitSeed);
    embed = std::make_shared<nn::Linear>(kIn, kD);
    fc = std::make_shared<ColumnParallelLinear>(kD, kH, w);
    proj = std::make_shared<RowParallelLinear>(kH, kD, w);
    for (nn::Module* m : std::initializer_list<nn::Module*>{embed.get(), fc.get(), proj.get()})
      m->to(at::TensorOptions().dtype(at::kDouble));
  }
  Value forward(const Value& x) const {
    Value h = embed->forward(x);          // (B, T, D)
    Value a = ops::gelu(fc->forward(h));  // (B, T, H/n)
    if (dropout) a = ops::dropout(a, kDropout, /*training=*/true);
    return proj->forward(a);  // (B, T, D), replicated
  }
  std::vector<Value> parameters() const {
    std::vector<Value> ps;
    for (nn::Module* m : std::initializer_list<nn::Module*>{embed.get(), fc.get(), proj.get()})
      for (auto& p : m->parameters()) ps.push_back(p);
    return ps;
  }
  // Bytes of the values saved per rank that are local (not replicated), f64 unless noted.
  int64_t local_saved_bytes(int64_t n) const {
    const int64_t slice = kB * kT * (kH / n);  // elements of a (B, T, H/n) tensor
    int64_t bytes = slice * kF64;              // gelu's input (column output)
    bytes += slice * kF64;                     // row's input (gelu or dropout output)
    if (dropout) bytes += slice;               // dropout's keep-mask, bool
    return bytes;
  }
};

struct Data {
  at::Tensor x, u;  // (B, T, IN) input, (B, T, D) upstream gradient; the same on every rank
};
Data make_data() {
  at::manual_seed(kDataSeed);
  return {at::randn({kB, kT, kIn}, at::kDouble), at::randn({kB, kT, kD}, at::kDouble)};
}

int64_t files_in(const std::filesystem::path& dir) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

struct StepResult {
  at::Tensor y;
  std::vector<at::Tensor> grads;  // dx, then every parameter's gradient
  OffloadStats stats;
  int64_t pending_after = -1, tier_used_after = -1;
};

// One forward + backward; with options, inside an OffloadScope.
StepResult step(const ShardedMlp& m, const Data& d, const OffloadOptions* options) {
  for (auto& p : m.parameters()) p.grad() = at::Tensor();
  StepResult r;
  Value x(d.x.clone(), /*requires_grad=*/true);
  {
    std::unique_ptr<OffloadScope> scope;
    if (options) scope = std::make_unique<OffloadScope>(*options);
    ration::manual_seed(kDropoutSeed);
    Value y = m.forward(x);
    r.y = y.tensor().clone();
    y.backward(d.u);
    if (scope) {
      r.stats = scope->stats();
      r.pending_after = scope->engine().pending_entries();
      r.tier_used_after = scope->engine().tier().used_bytes();
    }
  }
  r.grads.push_back(x.grad());
  for (auto& p : m.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

void expect_bitwise_equal(const StepResult& r, const StepResult& plain) {
  EXPECT_TRUE(at::equal(r.y, plain.y)) << "forward output";
  ASSERT_EQ(r.grads.size(), plain.grads.size());
  for (size_t i = 0; i < r.grads.size(); ++i) {
    ASSERT_TRUE(r.grads[i].defined() && plain.grads[i].defined()) << "gradient " << i << " did not arrive";
    EXPECT_TRUE(at::equal(r.grads[i], plain.grads[i])) << "gradient " << i << " (0 = dx, then embed, fc, proj)";
  }
}

class DistShardedOffload : public ::testing::TestWithParam<bool> {  // param: dropout after gelu
 protected:
  void SetUp() override {
    model_ = std::make_unique<ShardedMlp>(world(), GetParam());
    data_ = make_data();
    plain_ = step(*model_, data_, nullptr);
    ASSERT_GT(plain_.grads[2].abs().max().item<double>(), 1e-3) << "the plain step's gradients are not trivial";
  }

  // Only replicated values are offloaded (T1 never fires); spill dir unique to this rank.
  OffloadOptions options(const std::string& tier) const {
    OffloadOptions o;
    o.tier = tier;
    o.dir = dir_.path.string();
    o.min_bytes = 1024;
    o.t1 = memory::kNoLimit;
    return o;
  }

  // Everything of the step is gone after backward.
  void expect_all_freed(const StepResult& r) const {
    EXPECT_EQ(r.pending_after, 0) << "stored buffers left after backward";
    EXPECT_EQ(r.tier_used_after, 0) << "bytes left in the tier after backward";
    EXPECT_EQ(files_in(dir_.path), 0) << "spill dir " << dir_.path << " not empty";
    EXPECT_EQ(r.stats.fallbacks, 0);
  }

  // The replicated input alone was offloaded, as this rank's shard, and fetched back once.
  void expect_sharded_input_only(const StepResult& r) const {
    const int64_t n = world().size(), shard = ceil_div(kInputBytes, n);
    EXPECT_EQ(r.stats.offloaded_values, 1);
    EXPECT_EQ(r.stats.offloaded_storages, 1);
    EXPECT_EQ(r.stats.written_bytes, shard) << "rank " << world().rank() << " of " << n << " must write ceil("
                                            << kInputBytes << " / " << n << ") bytes";
    EXPECT_EQ(r.stats.read_bytes, shard);
    EXPECT_EQ(r.stats.prefetches + r.stats.demand_fetches, 1);
  }

  TempDir dir_{"dist-offload-rank" + std::to_string(world().rank())};
  std::unique_ptr<ShardedMlp> model_;
  Data data_;
  StepResult plain_;
};

TEST_P(DistShardedOffload, EachRankWritesItsShardAndTheGatherRebuildsTheInput) {
  for (const std::string tier : {"disk", "host", "host+disk"}) {
    SCOPED_TRACE(tier);
    OffloadOptions o = options(tier);
    if (tier == "host+disk") o.host_limit_bytes = 1024;  // the shard overflows to disk
    const StepResult r = step(*model_, data_, &o);
    expect_bitwise_equal(r, plain_);
    expect_sharded_input_only(r);
    expect_all_freed(r);
  }
}

TEST_P(DistShardedOffload, ThrottledTierWithAndWithoutPrefetchGivesEqualGradients) {
  for (const int prefetch : {0, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    OffloadOptions o = options("disk");
    o.throttle_bytes_per_second = 4e6;  // a 65-133 KiB shard takes 15-35 ms each way
    o.prefetch = prefetch;
    const StepResult r = step(*model_, data_, &o);
    expect_bitwise_equal(r, plain_);
    expect_sharded_input_only(r);
    expect_all_freed(r);
    // The column layer is the 2nd forward node: prefetch 2 starts its read two backward nodes ahead
    // (row or dropout); prefetch 0 reads when the column layer asks.
    EXPECT_EQ(r.stats.prefetches, prefetch == 0 ? 0 : 1);
    EXPECT_EQ(r.stats.demand_fetches, prefetch == 0 ? 1 : 0);
    EXPECT_GT(r.stats.write_ms, 10.0) << "the throttle did not slow the tier";
  }
}

// T1 = 0: every saved value is copied out at its producer's hook; the column layer's input is marked
// replicated when it is saved (before the hook), so it is still stored 1/n per rank and gathered, and
// the local values are stored whole.
TEST_P(DistShardedOffload, T1ZeroShardsTheInputAndOffloadsLocalValuesWhole) {
  const int64_t n = world().size();
  OffloadOptions o = options("disk");
  o.t1 = 0;
  const StepResult r = step(*model_, data_, &o);
  expect_bitwise_equal(r, plain_);
  expect_all_freed(r);
  const int64_t expected = (kInputBytes + n - 1) / n + model_->local_saved_bytes(n);
  EXPECT_EQ(r.stats.offloaded_storages, GetParam() ? 4 : 3);
  EXPECT_EQ(r.stats.written_bytes, expected);
  EXPECT_EQ(r.stats.read_bytes, expected);
}

INSTANTIATE_TEST_SUITE_P(Mlp, DistShardedOffload, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Dropout" : "Plain"; });

// A second world over a fresh FileStore with a short collective timeout, so a rank left alone in an
// all-gather gives up within seconds. All ranks are children of one launcher: its pid names the store.
World short_timeout_world(int seconds) {
  const World& w = world();
  const std::filesystem::path store =
      std::filesystem::temp_directory_path() / ("ration-dist-offload-store-" + std::to_string(::getppid()));
  if (w.rank() == 0) std::filesystem::remove(store);
  w.barrier();
  return World::init_from({{"RANK", std::to_string(w.rank())},
                           {"WORLD_SIZE", std::to_string(w.size())},
                           {"RATION_STORE_FILE", store.string()},
                           {"RATION_DIST_TIMEOUT_S", std::to_string(seconds)},
                           {"GLOO_SOCKET_IFNAME", "lo"}});
}

TEST(DistShardedOffloadFailure, TierFailureOnOneRankIsAClearErrorThere) {
  const int failing = world().size() - 1;
  const bool fails_here = world().rank() == failing;
  TempDir dir("dist-offload-fail-rank" + std::to_string(world().rank()));
  {
    World w = short_timeout_world(5);
    ShardedMlp m(w, /*with_dropout=*/false);
    const Data d = make_data();
    OffloadOptions o;
    o.tier = "disk";
    o.dir = dir.path.string();
    o.min_bytes = 1024;
    o.t1 = memory::kNoLimit;
    if (fails_here) o.fail_after_bytes = 1;  // the shard does not fit on this rank only
    const std::string error = ration::testing::error_of([&] { step(m, d, &o); });
    if (fails_here) {
      for (const char* needle : {"sharded offload of", "failed on this process", "injected full",
                                 "cannot fall back to recompute"})
        EXPECT_NE(error.find(needle), std::string::npos) << error << "\n  lacks: " << needle;
    } else {
      // This rank's all-gather lost its peer: an error naming the collective, not a hang.
      EXPECT_NE(error.find("collective all_gather failed"), std::string::npos) << error;
    }
    std::printf("[rank %d/%d] sharded failure: %s\n", world().rank(), world().size(),
                error.substr(0, 160).c_str());
  }
  EXPECT_EQ(files_in(dir.path), 0);
  world().barrier();  // the ranks leave the failed world at different times; meet again here
}

}  // namespace
}  // namespace ration::dist

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();  // before any tensor: offload needs its category tags
  return ration::dist::testing::run_worker(argc, argv, "ration_dist_offload_worker");
}
