// mp_worker.cpp — model and hybrid parallelism in `ration train` (train/model_parallel_step.h), one rank of
// a job started by ration_dist_launch. Each layout of the world (pipeline 2, tensor 2, pipeline 2 x data 2,
// tensor 2 x data 2, ...) trains gpt for 20 steps and must give the same loss as one process at the same
// global batch at every step (relative difference <= 1e-5), the same parameters at the end (its merged shards against the one
// process's checkpoint, within the data-parallel equivalence test's 1e-6), and, resumed from step 10 with
// the same layout, the same parameters again. A case whose layout needs another number of processes
// is skipped (each ctest entry filters its own).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ration/base/allocator.h"
#include "ration/train/checkpoint.h"
#include "ration/train/checkpoint_shards.h"
#include "ration/train/trainer.h"
#include "worker_main.h"

namespace ration::dist {
namespace {

using testing::world;
using testing::rel_diff;
using testing::shared_dir;

// The small gpt of the data-parallel equivalence tests (2 blocks: 4 pipeline units), SGD with momentum,
// the config's gradient clipping (1.0: the global norm over every stage and shard is exercised).
train::TrainOptions gpt_options(const std::filesystem::path& dir, int64_t batch, const World& in,
                                const std::vector<std::string>& layout) {
  train::TrainOptions o;
  o.config_path = std::string(RATION_SOURCE_DIR) + "/configs/gpt.toml";
  o.overrides = {"train.threads=1", "train.checkpoint_dir=" + dir.string(), "train.checkpoint_every=10",
                 "train.keep_checkpoints=3", "train.batch_size=" + std::to_string(batch), "model.dropout=0",
                 "train.eval_batches=1", "train.eval_every=0", "train.log_every=1000", "optim.name=sgd",
                 "optim.lr=0.05", "optim.momentum=0.9", "model.n_layer=2", "model.n_embd=32", "model.block_size=32",
                 "model.n_head=2"};
  o.overrides.insert(o.overrides.end(), layout.begin(), layout.end());
  o.steps = 20;
  o.json = true;
  o.world = in;
  return o;
}

void expect_same_weights(const train::NamedTensors& a, const train::NamedTensors& b, double tol,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : b) {
    const auto it = std::find_if(a.begin(), a.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, a.end()) << what << ": " << name << " missing";
    const double d = rel_diff(it->second, t);
    if (d > worst) worst = d, worst_name = name;
  }
  EXPECT_LE(worst, tol) << what << ": worst parameter " << worst_name;
  std::printf("[rank %d] %s: worst relative parameter difference %.3g (%s)\n", world().rank(), what.c_str(), worst,
              worst_name.c_str());
}

// `layout` splits the world's N processes into T x P shards and stages and D = N / (T x P) replicas of
// `batch` each; the reference is one process with the global batch D x batch. `both`: overrides of both
// runs (e.g. a dropout, which equals one process's where every replica's masks are one process's).
// Returns the split run's report and the resumed run's (which adds `resume_with` to the layout).
struct Reports {
  nlohmann::json split, resumed;
};
Reports check_layout(const std::vector<std::string>& layout, int replicas, int64_t batch, const std::string& name,
                     const std::vector<std::string>& both = {}, const std::vector<std::string>& resume_with = {}) {
  const World& w = world();
  const std::filesystem::path dir = shared_dir(name);
  const std::filesystem::path mine = dir.string() + "-single-" + std::to_string(w.rank());
  std::vector<std::string> split_layout = layout;
  split_layout.insert(split_layout.end(), both.begin(), both.end());
  const nlohmann::json split = train::run_training(gpt_options(dir / "split", batch, w, split_layout));
  const nlohmann::json one =
      train::run_training(gpt_options(mine / "one", batch * replicas, World::init_single(), both));
  EXPECT_EQ(split["loss"].size(), 20u);
  if (split["loss"].size() != 20u) return {split, {}};
  double worst = 0;
  for (size_t s = 0; s < 20; ++s) {
    const double a = split["loss"][s].get<double>(), b = one["loss"][s].get<double>();
    worst = std::max(worst, std::abs(a - b) / std::abs(b));
    EXPECT_LE(std::abs(a - b) / std::abs(b), 1e-5) << name << " step " << s + 1 << ": " << a << " vs " << b;
  }
  std::printf("[rank %d] %s: worst relative loss difference over 20 steps %.3g\n", w.rank(), name.c_str(), worst);
  w.barrier();  // every shard's checkpoints are complete
  const train::NamedTensors reference = train::load_checkpoint((mine / "one" / "ckpt-20").string()).weights;
  const train::NamedTensors merged = train::merge_checkpoint_shards((dir / "split").string(), 20);
  expect_same_weights(merged, reference, 1e-6, name + " vs one process at step 20");
  // Resume every shard from step 10 with the same layout (a run folder whose shards end at step 10).
  namespace fs = std::filesystem;
  const fs::path from10 = dir / "from10";
  if (w.rank() == 0) {
    fs::create_directories(from10);
    fs::copy_file(dir / "split" / "manifest.json", from10 / "manifest.json");
    for (const auto& shard : fs::directory_iterator(dir / "split")) {
      if (!shard.is_directory()) continue;
      const fs::path to = from10 / shard.path().filename();
      fs::create_directories(to);
      fs::copy(shard.path() / "ckpt-10", to / "ckpt-10", fs::copy_options::recursive);
      std::ofstream(to / "latest") << "ckpt-10\n";
    }
  }
  w.barrier();
  std::vector<std::string> resumed_layout = split_layout;
  resumed_layout.insert(resumed_layout.end(), resume_with.begin(), resume_with.end());
  train::TrainOptions again = gpt_options(dir / "resumed", batch, w, resumed_layout);
  again.resume = from10.string();
  const nlohmann::json resumed = train::run_training(again);
  w.barrier();
  expect_same_weights(train::merge_checkpoint_shards((dir / "resumed").string(), 20), merged, 1e-6,
                      name + " resumed at step 10 vs uninterrupted");
  w.barrier();
  std::filesystem::remove_all(mine);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
  return {split, resumed};
}

// The units of each stage, from a report.
std::vector<std::vector<std::string>> stage_units(const nlohmann::json& report) {
  std::vector<std::vector<std::string>> units;
  for (const auto& stage : report["parallel"]["stages"]) units.push_back(stage["units"].get<std::vector<std::string>>());
  return units;
}

bool world_is(int n) { return world().size() == n; }

TEST(ModelParallel, GptPipeline2MatchesOneProcess) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  check_layout({"parallel.pipeline=2", "parallel.micro_batches=2"}, 1, 8, "pipeline 2");
}

TEST(ModelParallel, GptPipeline2GPipeMatchesOneProcess) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  // Resumed with parallel.split = "bytes": the checkpoint's (uniform) split is kept, and the report says
  // "checkpoint" exactly where "bytes" alone splits otherwise (a run of its own shows how it splits).
  const Reports r = check_layout({"parallel.pipeline=2", "parallel.micro_batches=4", "parallel.schedule=gpipe",
                                  "parallel.split=uniform"},
                                 1, 8, "pipeline 2 gpipe, uniform split", {"model.n_layer=3"}, {"parallel.split=bytes"});
  ASSERT_FALSE(r.resumed.is_null()) << "the uniform run did not finish its 20 steps";
  const std::vector<std::vector<std::string>> uniform = stage_units(r.split);
  ASSERT_EQ(uniform.size(), 2u);
  EXPECT_EQ(uniform[0].size() + uniform[1].size(), 5u) << "gpt at 3 layers: the embedding, 3 blocks, the head";
  EXPECT_LE(std::max(uniform[0].size(), uniform[1].size()), 3u) << "uniform: unit counts within one";
  EXPECT_EQ(r.split["parallel"]["split"], "uniform");
  EXPECT_EQ(stage_units(r.resumed), uniform) << "a resumed run keeps its checkpoint's split";
  const std::filesystem::path dir = shared_dir("pipeline 2 bytes split");
  const nlohmann::json bytes = train::run_training(gpt_options(
      dir, 8, world(),
      {"parallel.pipeline=2", "parallel.micro_batches=4", "parallel.schedule=gpipe", "parallel.split=bytes", "model.n_layer=3"}));
  EXPECT_EQ(bytes["parallel"]["split"], "bytes");
  EXPECT_NE(stage_units(bytes), uniform) << "at 3 layers bytes splits otherwise (the resumed run keeps the checkpoint's)";
  EXPECT_EQ(r.resumed["parallel"]["split"], stage_units(bytes) == uniform ? "bytes" : "checkpoint");
  std::printf("[rank %d] the bytes split is %s the uniform one; the resumed run reports %s\n", world().rank(),
              stage_units(bytes) == uniform ? "" : "not", r.resumed["parallel"]["split"].dump().c_str());
  world().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

TEST(ModelParallel, GptPipeline2Data2MatchesOneProcess) {
  if (!world_is(4)) GTEST_SKIP() << "needs 4 processes";
  check_layout({"parallel.pipeline=2", "parallel.micro_batches=2"}, 2, 4, "pipeline 2 x data 2");
}

// Tensor parallel (distributed/tensor_parallel_block.h): every block's heads and MLP columns over 2 ranks;
// the merge puts qkv's q, k and v parts back together.
TEST(ModelParallel, GptTensor2MatchesOneProcess) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  check_layout({"parallel.tensor=2"}, 1, 8, "tensor 2");
}

// With dropout: each rank draws the residual masks of the whole activation and the attention mask of
// every head (keeping its heads' slice), from the same seeds as one process.
TEST(ModelParallel, GptTensor2WithDropoutMatchesOneProcess) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  check_layout({"parallel.tensor=2"}, 1, 8, "tensor 2 dropout 0.1", {"model.dropout=0.1"});
}

TEST(ModelParallel, GptTensor2Data2MatchesOneProcess) {
  if (!world_is(4)) GTEST_SKIP() << "needs 4 processes";
  check_layout({"parallel.tensor=2"}, 2, 4, "tensor 2 x data 2");
}

// A memory budget under tensor parallelism: both shards plan from shard 0's profile, so they drop and
// recompute the same values (a recomputed row-parallel output re-runs its all-reduce on both); recomputing
// is exact, so the curve is still one process's (which keeps everything).
TEST(ModelParallel, GptTensor2UnderABudgetMatchesOneProcess) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  const World& w = world();
  const std::filesystem::path dir = shared_dir("tensor-budget");
  const nlohmann::json loose = train::run_training(gpt_options(dir / "loose", 8, w, {"parallel.tensor=2", "memory.budget=1GiB"}));
  at::Tensor figure = at::zeros({1}, at::kLong);  // rank 0's: between its plan's floor and its peak
  const int64_t floor = loose["plan"]["minimum_peak_bytes"].get<int64_t>();
  figure.data_ptr<int64_t>()[0] = floor + (loose["memory"]["peak_bytes"].get<int64_t>() - floor) / 3;
  w.broadcast(figure, 0);
  const std::string budget = "memory.budget=" + std::to_string(figure.data_ptr<int64_t>()[0]);
  const nlohmann::json tight = train::run_training(gpt_options(dir / "tight", 8, w, {"parallel.tensor=2", budget}));
  const nlohmann::json one = train::run_training(
      gpt_options(dir.string() + "-one-" + std::to_string(w.rank()), 8, World::init_single(), {}));
  EXPECT_GT(tight["plan"]["dropped_groups"].get<int64_t>(), 0) << "the budget should make the shards recompute";
  double worst = 0;
  for (size_t s = 0; s < 20; ++s) {
    const double a = tight["loss"][s].get<double>(), b = one["loss"][s].get<double>();
    worst = std::max(worst, std::abs(a - b) / std::abs(b));
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("[rank %d] tensor 2 under %s: %lld groups dropped, worst relative loss difference %.3g\n", w.rank(),
              budget.c_str(), static_cast<long long>(tight["plan"]["dropped_groups"].get<int64_t>()), worst);
  w.barrier();
  std::filesystem::remove_all(dir.string() + "-one-" + std::to_string(w.rank()));
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// Both kinds of model parallelism: each pipeline stage's blocks split over 2 ranks (4 shards to merge).
TEST(ModelParallel, GptTensor2Pipeline2MatchesOneProcess) {
  if (!world_is(4)) GTEST_SKIP() << "needs 4 processes";
  check_layout({"parallel.tensor=2", "parallel.pipeline=2", "parallel.micro_batches=2"}, 1, 8, "tensor 2 x pipeline 2");
}

// Per-stage memory plans: each stage plans its micro-batches in flight for the same per-process budget;
// the measured peak stays within it and equals the prediction (to 0.5%), and stage 0 (two micro-batches
// in flight under 1F1B) recomputes where it would not fit. The stages are split by memory alone
// (parallel.split = "bytes"), so both runs split alike: a split by measured time can differ between two
// runs on a busy machine, and the second budget is derived from the first run's stage 0.
TEST(ModelParallel, GptPipeline2StagePlansFitTheirBudget) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  const World& w = world();
  auto run = [&](const std::string& budget) {
    train::TrainOptions o = gpt_options("", 8, w, {"parallel.pipeline=2", "parallel.micro_batches=4", "parallel.split=bytes",
                                                   "memory.budget=" + budget, "model.n_embd=64"});
    o.steps = 4;
    return train::run_training(o);
  };
  const nlohmann::json loose = run("1GiB");
  const auto& stages = loose["parallel"]["memory"];
  ASSERT_EQ(stages.size(), 2u);
  int64_t top = 0;
  for (const auto& m : stages) {
    const double measured = m["measured_peak_bytes"].get<double>(), predicted = m["predicted_peak_bytes"].get<double>();
    EXPECT_LE(std::abs(measured - predicted), 0.005 * measured) << m.dump();
    top = std::max(top, m["measured_peak_bytes"].get<int64_t>());
  }
  // A budget below stage 0's unconstrained peak (and above its floor, rank 0's plan's): stage 0 must drop
  // activations. Every rank uses rank 0's figure.
  at::Tensor figure = at::zeros({1}, at::kLong);
  const int64_t floor = loose["plan"]["minimum_peak_bytes"].get<int64_t>();
  figure.data_ptr<int64_t>()[0] = floor + (stages[0]["measured_peak_bytes"].get<int64_t>() - floor) / 3;
  w.broadcast(figure, 0);
  const int64_t budget = figure.data_ptr<int64_t>()[0];
  const nlohmann::json tight = run(std::to_string(budget));
  EXPECT_EQ(tight["parallel"]["split"], "bytes");
  EXPECT_EQ(tight["parallel"]["stages"][0]["units"], loose["parallel"]["stages"][0]["units"]);
  if (w.rank() == 0) {
    EXPECT_GT(tight["plan"]["dropped_groups"].get<int64_t>(), 0) << "stage 0's plan recomputes";
  }
  for (const auto& m : tight["parallel"]["memory"]) {
    const double measured = m["measured_peak_bytes"].get<double>(), predicted = m["predicted_peak_bytes"].get<double>();
    EXPECT_LE(m["measured_peak_bytes"].get<int64_t>(), budget) << m.dump();
    EXPECT_LE(std::abs(measured - predicted), 0.005 * measured) << m.dump();
  }
  std::printf("[rank %d] stage peaks: loose %s, budget %lld: %s\n", w.rank(), stages.dump().c_str(),
              static_cast<long long>(budget), tight["parallel"]["memory"].dump().c_str());
}

// Offload inside a stage's plan: each micro-batch's copies are its own (the engine keeps micro-batches in
// flight apart), so at a budget between the stage's floor and its unconstrained peak the plan offloads to
// the host tier, the measured peak stays within the budget and equals the prediction (to 0.5%), and the
// losses are those of the run that keeps everything, bit for bit (offload and recompute are exact).
TEST(ModelParallel, GptPipeline2StagePlansOffload) {
  if (!world_is(2)) GTEST_SKIP() << "needs 2 processes";
  const World& w = world();
  auto run = [&](const std::string& budget) {
    // Wider and longer than the other cases: copies of a micro-batch's activations must be cheaper than
    // re-running their producers for the plan to offload at all. Split by memory alone, as above.
    train::TrainOptions o = gpt_options("", 16, w, {"parallel.pipeline=2", "parallel.micro_batches=4", "parallel.split=bytes",
                                                    "memory.budget=" + budget, "model.n_embd=128", "model.block_size=64",
                                                    "offload.enabled=true", "offload.tier=host", "offload.min_bytes=1"});
    o.steps = 4;
    return train::run_training(o);
  };
  const nlohmann::json loose = run("1GiB");
  at::Tensor figure = at::zeros({1}, at::kLong);
  const int64_t floor = loose["plan"]["minimum_peak_bytes"].get<int64_t>();
  figure.data_ptr<int64_t>()[0] = floor + (loose["parallel"]["memory"][0]["measured_peak_bytes"].get<int64_t>() - floor) / 3;
  w.broadcast(figure, 0);
  const int64_t budget = figure.data_ptr<int64_t>()[0];
  const nlohmann::json tight = run(std::to_string(budget));
  EXPECT_EQ(tight["parallel"]["split"], "bytes");
  EXPECT_EQ(tight["parallel"]["stages"][0]["units"], loose["parallel"]["stages"][0]["units"]);
  if (w.rank() == 0) {
    EXPECT_GT(tight["plan"]["offloaded_groups"].get<int64_t>(), 0) << "stage 0's plan offloads: " << tight["plan"].dump();
    EXPECT_GT(tight["offload"]["totals"]["written_bytes"].get<int64_t>(), 0) << tight["offload"].dump();
  }
  for (const auto& m : tight["parallel"]["memory"]) {
    const double measured = m["measured_peak_bytes"].get<double>(), predicted = m["predicted_peak_bytes"].get<double>();
    EXPECT_LE(m["measured_peak_bytes"].get<int64_t>(), budget) << m.dump();
    EXPECT_LE(std::abs(measured - predicted), 0.005 * measured) << m.dump();
  }
  ASSERT_EQ(tight["loss"].size(), loose["loss"].size());
  for (size_t s = 0; s < loose["loss"].size(); ++s)
    EXPECT_EQ(tight["loss"][s].get<double>(), loose["loss"][s].get<double>()) << "step " << s + 1;
  std::printf("[rank %d] offload plan at %lld B: %lld groups offloaded, %lld dropped; stage peaks %s\n", w.rank(),
              static_cast<long long>(budget), static_cast<long long>(tight["plan"]["offloaded_groups"].get<int64_t>()),
              static_cast<long long>(tight["plan"]["dropped_groups"].get<int64_t>()),
              tight["parallel"]["memory"].dump().c_str());
}

}  // namespace
}  // namespace ration::dist

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();  // before any tensor: the reports' memory categories
  return ration::dist::testing::run_worker(argc, argv, "ration_mp_worker");
}
