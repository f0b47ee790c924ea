// fs_worker.cpp — one rank of the feature-split tests (parallel.features = "table", models/feature_split.h,
// models/ctr_split.cpp; docs/DISTRIBUTED.md, "Feature split"), started N times by ration_dist_launch.
//   FeatureSplitRouting.*    World::all_to_all: every piece to its rank, in rank order (the placement and the
//                            message layouts alone are tests/test_feature_split.cpp)
//   FeatureSplitTrain.*      ctr with the feature split over N ranks == one process at the global batch for 20
//                            steps (loss, dense parameters, evaluation with a rank whose last shard is empty),
//                            resumed per rank from step 10; bad input
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ration/base/allocator.h"
#include "ration/base/check.h"
#include "ration/distributed/world.h"
#include "ration/ps/server.h"
#include "ration/train/checkpoint.h"
#include "ration/train/setup.h"
#include "ration/train/trainer.h"
#include "worker_main.h"

namespace ration {
namespace {

using dist::World;
using dist::testing::world;
using dist::testing::shared_dir;

// ---- routing through c10d (the placement and the messages alone: tests/test_feature_split.cpp) -----------

// Through c10d: rank s sends rank r a piece of its own length (none between two other ranks of equal parity:
// at N >= 3 some pieces are empty), holding s * 1000 + r * 100 + k; every rank checks what it got.
TEST(FeatureSplitRouting, AllToAllDeliversEveryPieceInRankOrder) {
  const World& w = world();
  std::vector<at::Tensor> pieces;
  auto length = [](int s, int r) { return (s + r) % 2 == 0 && s != r ? int64_t{0} : int64_t{s * 3 + r + 1}; };
  for (int r = 0; r < w.size(); ++r)
    pieces.push_back(at::arange(length(w.rank(), r), at::kLong) + w.rank() * 1000 + r * 100);
  const std::vector<at::Tensor> got = w.all_to_all(pieces);
  ASSERT_EQ(static_cast<int>(got.size()), w.size());
  for (int s = 0; s < w.size(); ++s)
    EXPECT_TRUE(at::equal(got[static_cast<size_t>(s)], at::arange(length(s, w.rank()), at::kLong) + s * 1000 + w.rank() * 100))
        << "from rank " << s;
  // Floats, and a round in which every piece is empty.
  const std::vector<at::Tensor> none = w.all_to_all(std::vector<at::Tensor>(static_cast<size_t>(w.size()), at::empty({0})));
  for (const at::Tensor& t : none) EXPECT_EQ(t.numel(), 0);
}

// ---- ration train: ctr, feature split over N ranks == one process at the global batch ---------------------

// configs/ctr.toml, small: 4 tables of 3000 / 800 / 120 / 40 rows (zipf ids that recur), 20 steps. The
// evaluation set's last global batch holds one sample, so with N ranks every rank but rank 0 has none.
train::TrainOptions ctr_options(const std::filesystem::path& dir, int64_t batch, const World& in,
                                const std::vector<std::string>& extra) {
  train::TrainOptions o;
  o.config_path = std::string(RATION_SOURCE_DIR) + "/configs/ctr.toml";
  o.overrides = {"train.threads=1", "train.checkpoint_dir=" + dir.string(), "train.checkpoint_every=10",
                 "train.keep_checkpoints=3", "train.batch_size=" + std::to_string(batch), "train.log_every=1000",
                 "data.cardinalities=[3000, 800, 120, 40]", "data.train_samples=4096",
                 "data.eval_samples=" + std::to_string(2 * 32 * world().size() + 1), "train.eval_every=10",
                 "train.eval_batches=0"};
  o.overrides.insert(o.overrides.end(), extra.begin(), extra.end());
  o.steps = 20;
  o.json = true;
  o.world = in;
  return o;
}

// The error a run stops with ("no error" when it trains).
std::string error_of(const train::TrainOptions& o) {
  try {
    (void)train::run_training(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

double loss_rel_diff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

TEST(FeatureSplitTrain, CtrMatchesOneProcessWithTheGlobalBatch) {
  const World& w = world();
  const int n = w.size();
  const int64_t b = 32;
  const std::filesystem::path dir = shared_dir("ctr");
  const std::filesystem::path mine = dir.string() + "-single-" + std::to_string(w.rank());
  const nlohmann::json split = train::run_training(ctr_options(dir / "split", b, w, {"parallel.features=table"}));
  const nlohmann::json one = train::run_training(ctr_options(mine / "one", b * n, World::init_single(), {}));
  ASSERT_EQ(split["loss"].size(), 20u);
  ASSERT_EQ(one["loss"].size(), 20u);
  double worst = 0;
  for (size_t i = 0; i < 20; ++i) {
    const double d = loss_rel_diff(split["loss"][i].get<double>(), one["loss"][i].get<double>());
    EXPECT_LE(d, 1e-5) << "step " << i << ": " << split["loss"][i] << " vs " << one["loss"][i];
    worst = std::max(worst, d);
  }
  std::printf("[rank %d] ctr feature split N=%d b=%lld vs N=1 b=%lld: worst loss relative difference %.3g over 20 steps "
              "(first %.6f, last %.6f)\n", w.rank(), n, static_cast<long long>(b), static_cast<long long>(b * n), worst,
              one["loss"][0].get<double>(), one["loss"][19].get<double>());
  // Evaluation (rank 1.. evaluate an empty last shard and still serve the lookups): the same figures.
  ASSERT_EQ(split["eval"].size(), one["eval"].size());
  for (size_t e = 0; e < one["eval"].size(); ++e) {
    EXPECT_EQ(split["eval"][e]["items"], one["eval"][e]["items"]);
    EXPECT_LE(loss_rel_diff(split["eval"][e]["loss"].get<double>(), one["eval"][e]["loss"].get<double>()), 1e-5);
    EXPECT_NEAR(split["eval"][e]["auc"].get<double>(), one["eval"][e]["auc"].get<double>(), 1e-6);
  }
  // Where every table lives (rank 0 holds the 3000-row table; the others share the rest), and the report's layout.
  EXPECT_EQ(split["ps"]["feature_split"], 1.0);
  EXPECT_EQ(split["ps"]["owner.field0"], 0.0);
  for (int f = 0; f < 4; ++f) EXPECT_TRUE(split["ps"].contains("owner.field" + std::to_string(f)));
  EXPECT_EQ(split["ps"]["rows_x_dim.field0"], 3000.0 * 16);
  EXPECT_EQ(split["parallel"]["features"], "table");
  if (n == 2) {
    // Per step, rank 0 (field0) sends rank 1 the ids of fields 1-3 (8 x (1 + 3 x (1 + 32) + their 32..256 ids:
    // bags of 1-4, 1-3 and 1 ids), field0's pooled rows of rank 1's 32 samples (32 x 16 x 4) and the
    // gradients of fields 1-3's pooled rows (3 x 32 x 16 x 4); rank 1 sends rank 0 field0's ids
    // (8 x (1 + 1 + 32 + 32): bags of one id), fields 1-3's pooled rows and field0's gradients.
    const double bytes = split["ps"]["split_bytes_sent_per_step"].get<double>();
    if (w.rank() == 0) {
      EXPECT_GE(bytes, 8.0 * (100 + 3 * 32) + 2048 + 6144);
      EXPECT_LE(bytes, 8.0 * (100 + 8 * 32) + 2048 + 6144);
    } else {
      EXPECT_EQ(bytes, 8.0 * 66 + 6144 + 2048);
    }
    std::printf("[rank %d] ctr feature split: %.0f bytes sent per step\n", w.rank(), bytes);
  }
  // The dense parameters at step 20 (rank 0's checkpoint) against the one process's.
  w.barrier();
  const train::Checkpoint cs = train::load_checkpoint((dir / "split" / "ckpt-20").string());
  const train::Checkpoint co = train::load_checkpoint((mine / "one" / "ckpt-20").string());
  ASSERT_EQ(cs.weights.size(), co.weights.size());
  double worst_p = 0;
  for (size_t i = 0; i < cs.weights.size(); ++i) {
    const at::Tensor& a = cs.weights[i].second;
    const at::Tensor& r = co.weights[i].second;
    const double scale = r.abs().max().item<double>();
    worst_p = std::max(worst_p, (a.to(at::kDouble) - r.to(at::kDouble)).abs().max().item<double>() / scale);
  }
  EXPECT_LE(worst_p, 1e-5);
  std::printf("[rank %d] ctr feature split: worst relative dense parameter difference at step 20 %.3g\n", w.rank(),
              worst_p);
  // Resumed from step 10 with the same split: every rank restores its own tables (ps/rank<r>) and the
  // curve continues as the uninterrupted run's.
  train::TrainOptions again = ctr_options(dir / "resumed", b, w, {"parallel.features=table"});
  again.resume = (dir / "split" / "ckpt-10").string();
  const nlohmann::json resumed = train::run_training(again);
  EXPECT_TRUE(std::filesystem::exists(dir / "split" / "ps" / ("rank" + std::to_string(w.rank()))));
  ASSERT_EQ(resumed["loss"].size(), 10u);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_LE(loss_rel_diff(resumed["loss"][i].get<double>(), split["loss"][10 + i].get<double>()), 1e-6)
        << "resumed step " << 10 + i;
  // Resumed with the tables placed otherwise (field3 the largest now): an error naming both placements.
  train::TrainOptions moved = ctr_options(dir / "moved", b, w, {"parallel.features=table",
                                                                "data.cardinalities=[40, 800, 120, 3000]"});
  moved.resume = (dir / "split" / "ckpt-10").string();
  const std::string replaced = error_of(moved);
  const std::string saved = n == 2 ? "[0 1 1 1]" : "[0 1 2 2]", now = n == 2 ? "[1 1 1 0]" : "[2 1 2 0]";
  EXPECT_NE(replaced.find("tables were placed on ranks " + saved), std::string::npos) << replaced;
  EXPECT_NE(replaced.find("this run places them on " + now), std::string::npos) << replaced;
  // Resumed in one process without the split: its tables are per rank, so that is an error naming the layout.
  train::TrainOptions unsplit = ctr_options(mine / "unsplit", b * n, World::init_single(), {});
  unsplit.resume = (dir / "split" / "ckpt-10").string();
  const std::string across = error_of(unsplit);
  EXPECT_NE(across.find("holds tables split over ranks"), std::string::npos) << across;
  w.barrier();
  std::filesystem::remove_all(mine);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// Bad input: errors name the config and say what to change, on every rank, before training.
TEST(FeatureSplitTrain, BadInputIsAClearError) {
  const World& w = world();
  // Through the trainer (one process: a refusal right after the process groups are built would race the
  // peers' group set-up in this shared world; `Dist.ModelParallel.FeatureSplitWithoutTablesIsAnError` runs it over 2).
  train::TrainOptions mlp;
  mlp.config_path = std::string(RATION_SOURCE_DIR) + "/configs/mlp.toml";
  mlp.overrides = {"train.threads=1", "train.checkpoint_dir=", "parallel.features=table"};
  mlp.steps = 1;
  mlp.json = true;
  mlp.world = World::init_single();
  const std::string no_tables = error_of(mlp);
  EXPECT_NE(no_tables.find("mlp.toml: parallel.features = \"table\": model.type = \"mlp\" has no tables"),
            std::string::npos) << no_tables;

  // The ctr model over this world's ranks: a config with fewer tables than ranks ...
  auto model_of = [&](const std::vector<std::string>& extra) {
    return train::build_setup(train::load_config(std::string(RATION_SOURCE_DIR) + "/configs/ctr.toml",
                                                 ctr_options("", 8, w, extra).overrides));
  };
  const train::Setup one_table = model_of({"train.checkpoint_dir=", "data.cardinalities=[100]", "data.bag_min=[1]",
                                           "data.bag_max=[1]"});
  const std::string too_few = one_table.model->split_features(w);
  EXPECT_NE(too_few.find("model.num_fields = 1 tables cannot be placed whole on " + std::to_string(w.size())),
            std::string::npos) << too_few;
  // ... and remote parameter servers (one per rank here, each its own shard 0 of 1), which hold every table.
  ps::PsServer server(ps::ServeOptions{});
  const train::Setup remote = model_of({"train.checkpoint_dir=", "ps.shards=1",
                                        "ps.endpoints=127.0.0.1:" + std::to_string(server.port())});
  const std::string refused = remote.model->split_features(w);
  EXPECT_NE(refused.find("ps.endpoints is set"), std::string::npos) << refused;
  server.shutdown(0);
}

}  // namespace
}  // namespace ration

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();  // before any tensor: the reports' memory categories
  return ration::dist::testing::run_worker(argc, argv, "ration_fs_worker");
}
