// fs_worker.cpp — one rank of the feature-split tests (parallel.features = "table", models/feature_split.h,
// models/ctr_split.cpp; docs/DISTRIBUTED.md, "Feature split"), started N times by ration_dist_launch.
//   FeatureSplitPlacement.*  whole tables balanced by rows x dim (pure; every rank runs them)
//   FeatureSplitRouting.*    ids to their owners and rows back, as messages (pure) and through c10d's all-to-all
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
#include "ration/models/feature_split.h"
#include "ration/ps/server.h"
#include "ration/train/checkpoint.h"
#include "ration/train/trainer.h"
#include "worker_main.h"

namespace ration {
namespace {

using dist::World;
using dist::testing::world;
using models::GlobalBags;
using models::IdRequests;

// ---- placement -------------------------------------------------------------------------------------------

int64_t largest_load(const std::vector<int>& owner, const std::vector<int64_t>& cost, int ranks) {
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  for (size_t f = 0; f < owner.size(); ++f) load[static_cast<size_t>(owner[f])] += cost[f];
  return *std::max_element(load.begin(), load.end());
}

// The best largest load over every assignment of the tables to ranks (each rank at least one table).
int64_t best_largest_load(const std::vector<int64_t>& cost, int ranks) {
  const size_t n = cost.size();
  std::vector<int> owner(n, 0);
  int64_t best = INT64_MAX;
  for (;;) {
    std::vector<bool> used(static_cast<size_t>(ranks), false);
    for (int o : owner) used[static_cast<size_t>(o)] = true;
    if (std::all_of(used.begin(), used.end(), [](bool u) { return u; }))
      best = std::min(best, largest_load(owner, cost, ranks));
    size_t i = 0;
    while (i < n && ++owner[i] == ranks) owner[i++] = 0;
    if (i == n) return best;
  }
}

TEST(FeatureSplitPlacement, ConfigTablesGoWholeToTheLightestRank) {
  // configs/ctr.toml's cardinalities, dim 16: the million-row table alone on rank 0, the rest on rank 1.
  const std::vector<int64_t> rows = {1000000, 100000, 10000, 1000}, dims(4, 16);
  EXPECT_EQ(models::place_tables(rows, dims, 2), (std::vector<int>{0, 1, 1, 1}));
  // Three ranks: the two largest alone, the two small ones with the lighter of them.
  EXPECT_EQ(models::place_tables(rows, dims, 3), (std::vector<int>{0, 1, 2, 2}));
  // Dims count: a 1000-row table of dim 4096 outweighs a 100000-row table of dim 16.
  EXPECT_EQ(models::place_tables({100000, 1000, 10, 10}, {16, 4096, 16, 16}, 2), (std::vector<int>{1, 0, 1, 1}));
  EXPECT_EQ(models::owned_fields({0, 1, 1, 1}, 1), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_THROW(models::place_tables({10, 10}, {4, 4}, 3), Error);
}

TEST(FeatureSplitPlacement, EveryTablePlacedOnceAndBalancedByRowsTimesDim) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 2 + static_cast<int>(rng() % 3);
    const size_t tables = static_cast<size_t>(ranks) + rng() % 4;
    std::vector<int64_t> rows(tables), dims(tables), cost(tables);
    for (size_t f = 0; f < tables; ++f) {
      rows[f] = 1 + static_cast<int64_t>(rng() % 100000);
      dims[f] = int64_t{8} << (rng() % 4);
      cost[f] = rows[f] * dims[f];
    }
    const std::vector<int> owner = models::place_tables(rows, dims, ranks);
    ASSERT_EQ(owner.size(), tables);
    std::vector<int> held(static_cast<size_t>(ranks), 0);
    for (int o : owner) {
      ASSERT_TRUE(o >= 0 && o < ranks);
      ++held[static_cast<size_t>(o)];
    }
    for (int h : held) EXPECT_GE(h, 1) << "a rank without a table";
    // Largest first onto the lightest rank: within Graham's 4/3 - 1/(3 ranks) of the best placement.
    const double bound = 4.0 / 3.0 - 1.0 / (3.0 * ranks);
    EXPECT_LE(static_cast<double>(largest_load(owner, cost, ranks)),
              bound * static_cast<double>(best_largest_load(cost, ranks)) + 1e-9)
        << "trial " << trial;
  }
}

// ---- routing ---------------------------------------------------------------------------------------------

// Rank `rank`'s bags of `fields` fields for `batch` samples; ids encode (rank, field, sample, position), so a
// misrouted id is recognised.
std::vector<data::SparseBag> bags_of(int rank, int64_t fields, int64_t batch) {
  std::vector<data::SparseBag> bags;
  for (int64_t f = 0; f < fields; ++f) {
    std::vector<int64_t> ids, offsets;
    for (int64_t i = 0; i < batch; ++i) {
      offsets.push_back(static_cast<int64_t>(ids.size()));
      for (int64_t k = 0; k < 1 + (i + f) % 3; ++k) ids.push_back(((rank * 100 + f) * 1000 + i) * 10 + k);
    }
    bags.push_back({at::tensor(ids, at::kLong), at::tensor(offsets, at::kLong)});
  }
  return bags;
}

// A stand-in for pooling: sample i's row is (sum of its ids, its bag size, field + 0.5), dim 3.
at::Tensor pool(const at::Tensor& ids, const at::Tensor& offsets, int64_t field) {
  const int64_t b = offsets.numel();
  at::Tensor out = at::zeros({b, 3}, at::kDouble);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t begin = offsets[i].item<int64_t>(), end = i + 1 < b ? offsets[i + 1].item<int64_t>() : ids.numel();
    out[i][0] = ids.narrow(0, begin, end - begin).sum().item<double>();
    out[i][1] = static_cast<double>(end - begin);
    out[i][2] = static_cast<double>(field) + 0.5;
  }
  return out.to(at::kFloat);
}

// What an all-to-all does: received[o][s] = sent[s][o].
std::vector<std::vector<at::Tensor>> exchange(const std::vector<std::vector<at::Tensor>>& sent) {
  std::vector<std::vector<at::Tensor>> received(sent.size());
  for (size_t o = 0; o < sent.size(); ++o)
    for (size_t s = 0; s < sent.size(); ++s) received[o].push_back(sent[s][o]);
  return received;
}

TEST(FeatureSplitRouting, IdsReachTheirOwnersAndPooledRowsAndGradientsComeBack) {
  const int ranks = 3;
  const int64_t fields = 5;
  const std::vector<int64_t> batch = {4, 0, 3};  // rank 1's shard is empty (a short last batch)
  const std::vector<int> owner = models::place_tables({50, 40, 30, 20, 10}, std::vector<int64_t>(5, 2), ranks);
  std::vector<std::vector<at::Tensor>> sent;
  for (int s = 0; s < ranks; ++s) sent.push_back(models::pack_id_requests(bags_of(s, fields, batch[static_cast<size_t>(s)]), batch[static_cast<size_t>(s)], owner, ranks));
  const auto received = exchange(sent);
  std::vector<IdRequests> asked;
  for (int o = 0; o < ranks; ++o) {
    const std::vector<int64_t> owned = models::owned_fields(owner, o);
    asked.push_back(models::unpack_id_requests(received[static_cast<size_t>(o)], owned));
    EXPECT_EQ(asked.back().samples, batch);
    ASSERT_EQ(asked.back().fields.size(), owned.size());
    for (size_t k = 0; k < owned.size(); ++k) {
      // The owner sees every rank's bags of its field, in rank order, offsets into the concatenation.
      const GlobalBags& g = asked.back().fields[k];
      EXPECT_EQ(g.field, owned[k]);
      std::vector<at::Tensor> ids, offsets;
      int64_t before = 0;
      for (int s = 0; s < ranks; ++s) {
        const data::SparseBag bag = bags_of(s, fields, batch[static_cast<size_t>(s)])[static_cast<size_t>(owned[k])];
        ids.push_back(bag.ids);
        offsets.push_back(bag.offsets + before);
        before += bag.ids.numel();
      }
      EXPECT_TRUE(at::equal(g.ids, at::cat(ids))) << "field " << owned[k];
      EXPECT_TRUE(at::equal(g.offsets, at::cat(offsets))) << "field " << owned[k];
    }
  }
  // Rows back: each owner pools every rank's bags of its fields; each rank gets its own samples' rows.
  std::vector<std::vector<at::Tensor>> replies;
  for (int o = 0; o < ranks; ++o) {
    std::vector<at::Tensor> rows;
    for (const GlobalBags& g : asked[static_cast<size_t>(o)].fields) rows.push_back(pool(g.ids, g.offsets, g.field));
    replies.push_back(models::pack_by_source(rows, asked[static_cast<size_t>(o)].samples));
  }
  const auto back = exchange(replies);
  for (int s = 0; s < ranks; ++s) {
    const std::vector<at::Tensor> rows = models::unpack_from_owners(back[static_cast<size_t>(s)], owner, batch[static_cast<size_t>(s)], 3);
    const std::vector<data::SparseBag> mine = bags_of(s, fields, batch[static_cast<size_t>(s)]);
    ASSERT_EQ(rows.size(), static_cast<size_t>(fields));
    for (int64_t f = 0; f < fields; ++f)
      EXPECT_TRUE(at::equal(rows[static_cast<size_t>(f)], pool(mine[static_cast<size_t>(f)].ids, mine[static_cast<size_t>(f)].offsets, f)))
          << "rank " << s << " field " << f;
  }
  // Gradients: every rank's (B_s, 3) per field go to the owner, concatenated in rank order.
  auto grad_of = [](int s, int64_t f, int64_t b) { return at::arange(b * 3, at::kFloat).view({b, 3}) + 1000 * s + 10 * f; };
  std::vector<std::vector<at::Tensor>> grads;
  for (int s = 0; s < ranks; ++s) {
    std::vector<at::Tensor> g;
    for (int64_t f = 0; f < fields; ++f) g.push_back(grad_of(s, f, batch[static_cast<size_t>(s)]));
    grads.push_back(models::pack_by_owner(g, owner, ranks));
  }
  const auto to_owners = exchange(grads);
  for (int o = 0; o < ranks; ++o) {
    const std::vector<int64_t> owned = models::owned_fields(owner, o);
    const std::vector<at::Tensor> summed = models::unpack_from_sources(to_owners[static_cast<size_t>(o)],
                                                                       static_cast<int64_t>(owned.size()), batch, 3);
    for (size_t k = 0; k < owned.size(); ++k) {
      std::vector<at::Tensor> expected;
      for (int s = 0; s < ranks; ++s) expected.push_back(grad_of(s, owned[k], batch[static_cast<size_t>(s)]));
      EXPECT_TRUE(at::equal(summed[k], at::cat(expected))) << "owner " << o << " field " << owned[k];
    }
  }
}

TEST(FeatureSplitRouting, AMessageOfTheWrongLengthIsRefused) {
  const std::vector<int> owner = {0, 1};
  std::vector<at::Tensor> sent = models::pack_id_requests(bags_of(0, 2, 2), 2, owner, 2);
  // Rank 1 owns field 1 only; told it owns both, the message ends early.
  EXPECT_THROW(models::unpack_id_requests({sent[1], sent[1]}, {0, 1}), Error);
  EXPECT_THROW(models::unpack_from_owners({at::zeros({6}), at::zeros({5})}, owner, 2, 3), Error);
}

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

std::filesystem::path shared_dir(const std::string& tag) {
  at::Tensor id = at::empty({1}, at::kLong);
  id.data_ptr<int64_t>()[0] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  world().broadcast(id, 0);
  return std::filesystem::temp_directory_path() / ("ration-fs-" + tag + "-" + std::to_string(id.data_ptr<int64_t>()[0]));
}

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
  w.barrier();
  std::filesystem::remove_all(mine);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// Bad input: errors name the config and say what to change, on every rank, before training.
std::string error_of(const train::TrainOptions& o) {
  try {
    (void)train::run_training(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(FeatureSplitTrain, BadInputIsAClearError) {
  const World& w = world();
  train::TrainOptions mlp;
  mlp.config_path = std::string(RATION_SOURCE_DIR) + "/configs/mlp.toml";
  mlp.overrides = {"train.threads=1", "train.checkpoint_dir=", "parallel.features=table"};
  mlp.steps = 1;
  mlp.json = true;
  mlp.world = w;
  const std::string no_tables = error_of(mlp);
  EXPECT_NE(no_tables.find("mlp.toml"), std::string::npos) << no_tables;
  EXPECT_NE(no_tables.find("parallel.features"), std::string::npos) << no_tables;
  EXPECT_NE(no_tables.find("has no tables"), std::string::npos) << no_tables;

  const std::string too_few = error_of(ctr_options("", 8, w, {"train.checkpoint_dir=", "parallel.features=table",
                                                               "data.cardinalities=[100]", "data.bag_min=[1]",
                                                               "data.bag_max=[1]"}));
  EXPECT_NE(too_few.find("ctr.toml"), std::string::npos) << too_few;
  EXPECT_NE(too_few.find("1 tables cannot be placed whole on " + std::to_string(w.size())), std::string::npos) << too_few;

  // Remote parameter servers (one per rank here, each its own shard 0 of 1) hold every table already.
  ps::PsServer server(ps::ServeOptions{});
  const std::string remote = error_of(ctr_options("", 8, w, {"train.checkpoint_dir=", "parallel.features=table",
                                                              "ps.shards=1", "ps.endpoints=127.0.0.1:" + std::to_string(server.port())}));
  EXPECT_NE(remote.find("ps.endpoints is set"), std::string::npos) << remote;
  server.shutdown(0);
}

}  // namespace
}  // namespace ration

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();  // before any tensor: the reports' memory categories
  return ration::dist::testing::run_worker(argc, argv, "ration_fs_worker");
}
