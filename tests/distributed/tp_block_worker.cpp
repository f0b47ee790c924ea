// tp_block_worker.cpp — one rank of the tensor-parallel transformer block tests (ration_dist_tp_block_worker),
// started n times by ration_dist_launch (n = 2 and 4). Every rank builds the one-process block (or gpt) from
// the same seed, and a second copy that it shards over the world with dist::TensorParallelBlock
// (GPT::shard_tensor_parallel). Checks, on every rank, in f64:
//   * the layout: each parameter is this rank's slice of the whole (qkv: q, k and v each by heads), the
//     ranks' shards all-gathered and merged (merge_tensor_shards) give the whole exactly, a split
//     parameter's storage holds only its shard, and the counting allocator's parameter bytes fell by
//     (n - 1)/n of the split weights' (the whole tensors' memory was released);
//   * one forward + backward: the output, dx and every parameter gradient (this rank's slice of the
//     one-process gradient) equal the one-process block within 1e-12 relative, with dropout 0 and with
//     dropout 0.25 in training mode (the attention mask is the slice of the whole layer's mask, the
//     residual masks are drawn alike on every rank), with 4 collectives of a (B, T, C) activation (two
//     all-reduces in forward, two in backward);
//   * under OffloadScope (only replicated values offloaded) the block's two replicated inputs, ln1(x) and
//     ln2(h), are stored 1/n per rank and gathered back, and the gradients equal the plain step bitwise;
//   * gpt: the sharded model's loss and gradients equal the one-process model's (dropout 0.1), and
//     model.n_head not divisible by the group's size is refused naming both keys.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "op_check.h"
#include "test_util.h"
#include "ration/base/allocator.h"
#include "ration/distributed/tensor_parallel.h"
#include "ration/distributed/tensor_parallel_block.h"
#include "ration/distributed/world.h"
#include "ration/models/gpt.h"
#include "ration/nn/layers.h"
#include "ration/offload/engine.h"
#include "ration/runtime/step_runtime.h"
#include "worker_main.h"

namespace ration::dist {
namespace {

using ration::testing::max_rel_error;
using testing::world;

constexpr int64_t kB = 2, kT = 8, kC = 16, kHeads = 4;  // heads divisible by 2 and 4
constexpr uint64_t kInitSeed = 31, kDataSeed = 32, kDropoutSeed = 33;
constexpr double kTol = 1e-12;

std::shared_ptr<nn::TransformerBlock> make_block(double dropout) {
  at::manual_seed(kInitSeed);
  auto b = std::make_shared<nn::TransformerBlock>(kC, kHeads, dropout);
  b->to(at::TensorOptions().dtype(at::kDouble));
  // Non-trivial biases and norms (the constructor's are 0 and 1), so every parameter's slice is tested.
  for (auto& [name, p] : b->named_parameters()) p.tensor().normal_(0.0, 0.3);
  return b;
}

struct Data {
  at::Tensor x, u;  // (B, T, C) input and upstream gradient, the same on every rank
};
Data make_data() {
  at::manual_seed(kDataSeed);
  return {at::randn({kB, kT, kC}, at::kDouble), at::randn({kB, kT, kC}, at::kDouble)};
}

struct StepResult {
  at::Tensor y, dx;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // by the block's parameter names
  memory::OffloadStats stats;
};

template <typename Forward>
StepResult step(const nn::Module& block, const Forward& forward, const Data& d,
                const memory::OffloadOptions* offload = nullptr) {
  for (auto& p : block.parameters()) p.grad() = at::Tensor();
  Value x(d.x.clone(), /*requires_grad=*/true);
  StepResult r;
  {
    std::unique_ptr<OffloadScope> scope;
    if (offload) scope = std::make_unique<OffloadScope>(*offload);
    ration::manual_seed(kDropoutSeed);
    Value y = forward(x);
    r.y = y.tensor().clone();
    y.backward(d.u);
    if (scope) r.stats = scope->stats();
  }
  r.dx = x.grad();
  for (auto& [name, p] : block.named_parameters()) r.grads.emplace_back(name, p.grad());
  return r;
}

// This rank's part of a one-process tensor (its gradient or weight) named `name` in the block.
at::Tensor my_part(const std::string& name, const at::Tensor& whole) {
  const int64_t dim = block_split_dim(name);
  if (dim < 0) return whole;
  return tensor_shard(whole, dim, block_split_parts(name), world().rank(), world().size());
}

void expect_matches_one_process(const StepResult& tp, const StepResult& one, const std::string& what) {
  EXPECT_LE(max_rel_error(tp.y, one.y), kTol) << what << ": output";
  ASSERT_TRUE(tp.dx.defined());
  EXPECT_LE(max_rel_error(tp.dx, one.dx), kTol) << what << ": dx";
  ASSERT_EQ(tp.grads.size(), one.grads.size());
  for (size_t i = 0; i < tp.grads.size(); ++i) {
    const auto& [name, g] = tp.grads[i];
    ASSERT_EQ(name, one.grads[i].first);
    ASSERT_TRUE(g.defined()) << what << ": no gradient for " << name;
    EXPECT_GT(g.abs().max().item<double>(), 1e-6) << what << ": " << name << "'s gradient is trivially zero";
    EXPECT_LE(max_rel_error(g, my_part(name, one.grads[i].second)), kTol) << what << ": d" << name;
  }
}

TEST(DistTensorParallelBlock, ShardsAreSlicesThatMergeBackAndOnlyTheShardsStay) {
  const World& w = world();
  const int n = w.size();
  auto whole = make_block(0.0);
  auto sharded = make_block(0.0);
  auto parameter_bytes = [] { return memory::stats().current[static_cast<int>(memory::Category::Parameters)]; };
  const int64_t before = parameter_bytes();
  TensorParallelBlock tp(sharded, w);
  const int64_t released = before - parameter_bytes();
  const auto full_params = whole->named_parameters();
  const auto shard_params = sharded->named_parameters();
  ASSERT_EQ(full_params.size(), shard_params.size());
  int split = 0;
  for (size_t i = 0; i < full_params.size(); ++i) {
    const auto& [name, full] = full_params[i];
    const at::Tensor shard = shard_params[i].second.tensor();
    ASSERT_EQ(name, shard_params[i].first);
    EXPECT_TRUE(at::equal(shard, my_part(name, full.tensor()))) << name;
    const int64_t dim = block_split_dim(name);
    if (dim < 0) continue;
    ++split;
    EXPECT_EQ(shard.size(dim) * n, full.tensor().size(dim)) << name;
    EXPECT_EQ(static_cast<int64_t>(shard.storage().nbytes()), shard.numel() * 8)
        << name << ": the storage still holds more than this rank's shard";
    // What a checkpoint merge does: every rank's shard, in rank order -> the whole.
    std::vector<at::Tensor> shards = w.all_gather(shard).view({n, -1}).unbind(0);
    for (auto& s : shards) s = s.view(shard.sizes());
    EXPECT_TRUE(at::equal(merge_tensor_shards(shards, dim, block_split_parts(name)), full.tensor())) << name;
  }
  EXPECT_EQ(split, 6) << "qkv and fc weight and bias, attn.proj and mlp.proj weight";
  // The counting allocator: the parameters now hold (n - 1)/n fewer bytes of every split weight, f64.
  int64_t split_bytes = 0;
  for (const auto& [name, p] : full_params)
    if (block_split_dim(name) >= 0) split_bytes += p.numel() * 8;
  EXPECT_EQ(released, split_bytes - split_bytes / n) << "the whole weights' memory must be given back";
  // qkv keeps heads [r H/n, (r+1) H/n) of q, k and v: row 0 of its k part is k's row r C/n.
  const at::Tensor& qkv = sharded->attn->qkv->weight.tensor();
  EXPECT_TRUE(at::equal(qkv[kC / n], whole->attn->qkv->weight.tensor()[kC + w.rank() * kC / n]));
}

class DistTensorParallelBlockStep : public ::testing::TestWithParam<double> {};  // param: dropout

TEST_P(DistTensorParallelBlockStep, OutputAndGradientsEqualTheOneProcessBlock) {
  const double dropout = GetParam();
  auto whole = make_block(dropout);
  auto sharded = make_block(dropout);
  TensorParallelBlock tp(sharded, world());
  const Data d = make_data();
  const StepResult one = step(*whole, [&](const Value& x) { return whole->forward(x); }, d);
  const StepResult split = step(*sharded, [&](const Value& x) { return tp.forward(x); }, d);
  expect_matches_one_process(split, one, "dropout " + std::to_string(dropout));
  // Traffic: one all-reduce of a (B, T, C) activation per sub-block in forward and one in backward.
  const int64_t before = tensor_parallel_collective_bytes();
  (void)step(*sharded, [&](const Value& x) { return tp.forward(x); }, d);
  EXPECT_EQ(tensor_parallel_collective_bytes() - before, 4 * kB * kT * kC * 8);
  if (dropout > 0) {  // the masks were drawn: without them the output differs
    whole->eval();
    const StepResult no_dropout = step(*whole, [&](const Value& x) { return whole->forward(x); }, d);
    EXPECT_GT(max_rel_error(no_dropout.y, one.y), 1e-2) << "dropout did not change the output";
  }
  std::printf("[rank %d/%d] block, dropout %.2f: |y - one| %.3g, |dx - one| %.3g\n", world().rank(), world().size(),
              dropout, max_rel_error(split.y, one.y), max_rel_error(split.dx, one.dx));
}

INSTANTIATE_TEST_SUITE_P(Block, DistTensorParallelBlockStep, ::testing::Values(0.0, 0.25),
                         [](const ::testing::TestParamInfo<double>& p) { return p.param > 0 ? "Dropout" : "NoDropout"; });

TEST(DistTensorParallelBlock, OffloadStoresEachReplicatedInputAsOneNthPerRank) {
  const int64_t n = world().size();
  auto sharded = make_block(0.25);
  TensorParallelBlock tp(sharded, world());
  const Data d = make_data();
  auto forward = [&](const Value& x) { return tp.forward(x); };
  const StepResult plain = step(*sharded, forward, d);
  ration::testing::TempDir dir("dist-tp-block-offload-rank" + std::to_string(world().rank()));
  memory::OffloadOptions o;
  o.tier = "host";
  o.dir = dir.path.string();
  o.min_bytes = 1024;
  o.t1 = memory::kNoLimit;  // only the replicated values (the column-parallel inputs) are offloaded
  const StepResult off = step(*sharded, forward, d, &o);
  EXPECT_TRUE(at::equal(off.y, plain.y));
  EXPECT_TRUE(at::equal(off.dx, plain.dx));
  for (size_t i = 0; i < off.grads.size(); ++i)
    EXPECT_TRUE(at::equal(off.grads[i].second, plain.grads[i].second)) << off.grads[i].first;
  constexpr int64_t kInputBytes = kB * kT * kC * 8;  // ln1(x), ln2(h): (B, T, C) f64 each
  const int64_t shard = (kInputBytes + n - 1) / n;
  EXPECT_EQ(off.stats.offloaded_storages, 2) << "ln1(x) and ln2(h), the qkv and fc inputs";
  EXPECT_EQ(off.stats.written_bytes, 2 * shard) << "each rank writes 1/" << n << " of each";
  EXPECT_EQ(off.stats.read_bytes, 2 * shard);
  EXPECT_EQ(off.stats.fallbacks, 0);
}

// ---- gpt -----------------------------------------------------------------------------------------------
models::GPTOptions small_gpt(double dropout) {
  models::GPTOptions o;
  o.vocab_size = 20;
  o.n_layer = 2;
  o.n_head = kHeads;
  o.n_embd = kC;
  o.block_size = kT;
  o.dropout = dropout;
  return o;
}

std::unique_ptr<models::GPT> make_gpt(const models::GPTOptions& o) {
  at::manual_seed(kInitSeed);
  auto m = std::make_unique<models::GPT>(o);
  m->to(at::TensorOptions().dtype(at::kDouble));
  return m;
}

struct LossAndGrads {
  double loss = 0;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

LossAndGrads loss_step(models::GPT& m, const data::Batch& batch) {
  m.zero_grad();
  ration::manual_seed(kDropoutSeed);
  Value loss = m.loss(batch);
  loss.backward();
  LossAndGrads r{loss.tensor().item<double>(), {}};
  for (auto& [name, p] : m.named_parameters()) r.grads.emplace_back(name, p.grad());
  return r;
}

TEST(DistTensorParallelGpt, LossAndGradientsEqualTheOneProcessModel) {
  const World& w = world();
  const models::GPTOptions o = small_gpt(0.1);
  auto one = make_gpt(o);
  auto split = make_gpt(o);
  ASSERT_EQ(split->shard_tensor_parallel(w), "");
  at::manual_seed(kDataSeed);
  data::Batch batch;
  batch.input = Value(at::randint(o.vocab_size, {kB, kT}, at::kLong));
  batch.target = Value(at::randint(o.vocab_size, {kB, kT}, at::kLong));
  const LossAndGrads a = loss_step(*one, batch), b = loss_step(*split, batch);
  EXPECT_LE(std::abs(a.loss - b.loss) / std::abs(a.loss), kTol) << a.loss << " vs " << b.loss;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const std::string& name = a.grads[i].first;
    ASSERT_EQ(name, b.grads[i].first);
    const int64_t dim = split->tensor_split_dim(name);
    const at::Tensor mine =
        dim < 0 ? a.grads[i].second : tensor_shard(a.grads[i].second, dim, split->tensor_split_parts(name), w.rank(), w.size());
    EXPECT_LE(max_rel_error(b.grads[i].second, mine), kTol) << "d" << name;
  }
  EXPECT_EQ(split->tensor_split_dim("blocks.1.attn.qkv.weight"), 0);
  EXPECT_EQ(split->tensor_split_parts("blocks.1.attn.qkv.weight"), 3);
  EXPECT_EQ(split->tensor_split_dim("blocks.0.mlp.proj.weight"), 1);
  EXPECT_EQ(split->tensor_split_dim("blocks.0.mlp.proj.bias"), -1);
  EXPECT_EQ(split->tensor_split_dim("wte.weight"), -1);
  std::printf("[rank %d/%d] gpt, dropout 0.1: loss %.12f (one process %.12f)\n", w.rank(), w.size(), b.loss, a.loss);
}

TEST(DistTensorParallelGpt, HeadsNotDivisibleByTheGroupAreRefusedNamingTheKeys) {
  models::GPTOptions o = small_gpt(0.0);
  o.n_head = 3;
  o.n_embd = 24;
  auto m = make_gpt(o);
  const std::string why = m->shard_tensor_parallel(world());
  for (const std::string& needle : std::vector<std::string>{"model.n_head = 3", "divisible",
                                                            "parallel.tensor = " + std::to_string(world().size())})
    EXPECT_NE(why.find(needle), std::string::npos) << why << "\n  lacks: " << needle;
  EXPECT_TRUE(m->tensor_parallel_blocks.empty());
  EXPECT_EQ(m->blocks[0]->attn->qkv->weight.size(0), 3 * 24) << "a refused split leaves the model whole";
}

}  // namespace
}  // namespace ration::dist

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();  // before any tensor: offload needs its category tags
  return ration::dist::testing::run_worker(argc, argv, "ration_dist_tp_block_worker");
}
