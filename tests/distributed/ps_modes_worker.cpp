// ps_modes_worker.cpp — one rank of the partial / asynchronous parameter-server tests
// (ration_ps_modes_worker), started n times by ration_dist_launch; every rank runs every test in order.
// Checks, on every rank (distributed/ps_aggregation.h, distributed/ps_partial_aggregator.cpp):
//   * through the wire (PsServerLinks / PsClient over the "ps" channel): with one rank made slow and
//     k = 1 backup worker, the round's update is exactly the weighted mean of the other ranks' gradients
//     (reference computed here), the slow rank's push is dropped, and it gets the new parameters;
//   * `ration train` with dist.backup_workers = 1 and a slowed rank (dist.debug_delay_ms): the fast ranks
//     do not wait for it (step time far below the delay, while the synchronous server waits every step),
//     every one of the slow rank's pushes is dropped, and each version aggregates exactly N - 1 pushes;
//   * `ration train` with dist.sync = "async": with s = 0 the parameters equal the synchronous server's
//     bitwise; with s = 2 and a slowed rank no worker is ever let go on more than s pushes ahead (the
//     server's own record of every release), and the fast ranks did run ahead (the bound is reached);
//   * model averaging (dist.aggregate = "parameters"): the weighted mean through c10d, K = 1 with SGD equals
//     the gradient all-reduce, and K = 5 averages every 5 steps and once at the end.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "ration/distributed/ps_aggregation.h"
#include "ration/distributed/topology.h"
#include "ration/distributed/world.h"
#include "ration/base/allocator.h"
#include "ration/train/checkpoint.h"
#include "ration/train/trainer.h"
#include "recording_server_model.h"
#include "worker_main.h"

namespace ration::dist {
namespace {

using testing::world;
using testing::shared_dir;

// ---- the wire protocol ----------------------------------------------------------------------------

constexpr int64_t kNumel = 1000;
double share_of(int rank, int n) { return static_cast<double>(rank + 2) / static_cast<double>(n * (n + 3) / 2); }
at::Tensor gradient_of(int rank, int n) {
  at::manual_seed(7 + rank);
  return (at::randn({kNumel}) * share_of(rank, n)).contiguous();
}

TEST(PsModes, BackupRoundThroughTheWireIsTheWeightedMeanOfTheFastRanks) {
  const World& w = world();
  const int n = w.size(), slow = n - 1;
  const World channel = w.open_channel("ps-wire-test");
  // Reference: ranks 0 .. n-2 in rank order, over the sum of their shares.
  at::Tensor expected = gradient_of(0, n).clone();
  double shares = share_of(0, n);
  for (int r = 1; r < slow; ++r) {
    expected.add_(gradient_of(r, n));
    shares += share_of(r, n);
  }
  expected.div_(shares);
  Push push;
  push.rank = w.rank();
  push.base_version = 0;
  push.share = share_of(w.rank(), n);
  push.samples = 1;
  push.gradient = gradient_of(w.rank(), n);
  at::Tensor params = at::empty({kNumel});
  Reply reply;
  if (w.rank() == slow) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  if (w.rank() == 0) {
    RecordingModel model(kNumel);
    auto agg = std::make_shared<PsAggregator>(n, PsAggregationOptions{PsAggregation::BackupWorkers, 1, 0}, model, 0);
    PsServerLinks links(channel, agg);
    agg->submit(push);
    reply = agg->await_reply(0, params);
    agg->finished(0);
    links.wait_for_workers();
    ASSERT_EQ(model.applied.size(), 1u);
    EXPECT_TRUE(at::equal(model.applied[0], expected)) << "the update is the weighted mean of ranks 0.." << slow - 1;
    const PsAggregationStats st = agg->stats();
    EXPECT_EQ(st.dropped[static_cast<size_t>(slow)], 1);
    EXPECT_EQ(st.total(st.dropped), 1);
    EXPECT_EQ(st.total(st.included), n - 1);
  } else {
    PsClient client(channel, kNumel);
    reply = client.exchange(push, params);
    client.finish();
  }
  EXPECT_EQ(reply.version, 1);
  EXPECT_EQ(reply.dropped, w.rank() == slow);
  EXPECT_TRUE(at::equal(params, -expected)) << "every rank, the late one too, gets the new parameters";
  w.barrier();
}

nlohmann::json train_mlp(const std::filesystem::path& dir, const std::vector<std::string>& extra, int64_t steps = 20) {
  train::TrainOptions o;
  o.config_path = std::string(RATION_SOURCE_DIR) + "/configs/mlp.toml";
  o.overrides = {"train.threads=1", "train.checkpoint_dir=" + dir.string(), "train.checkpoint_every=10",
                 "train.keep_checkpoints=3", "train.batch_size=16", "model.dropout=0", "train.eval_batches=1",
                 "train.eval_every=0", "train.log_every=1000", "dist.topology=ps"};
  o.overrides.insert(o.overrides.end(), extra.begin(), extra.end());
  o.steps = steps;
  o.json = true;
  o.world = world();
  return train::run_training(o);
}

void expect_bitwise_same_weights(const std::string& a, const std::string& b) {
  const train::Checkpoint ca = train::load_checkpoint(a), cb = train::load_checkpoint(b);
  ASSERT_EQ(ca.weights.size(), cb.weights.size());
  for (size_t i = 0; i < ca.weights.size(); ++i) {
    ASSERT_EQ(ca.weights[i].first, cb.weights[i].first);
    EXPECT_TRUE(at::equal(ca.weights[i].second, cb.weights[i].second)) << ca.weights[i].first << " differs";
  }
}

TEST(PsModes, AsyncWithZeroStalenessIsTheSynchronousServerBitwise) {
  const World& w = world();
  const std::filesystem::path dir = shared_dir("async0");
  (void)train_mlp(dir / "sync", {});
  const nlohmann::json async = train_mlp(dir / "async", {"dist.sync=async", "dist.max_staleness=0"});
  EXPECT_EQ(async["dist"]["aggregation"], "async");
  if (w.rank() == 0) {
    EXPECT_EQ(async["dist"]["versions"], 20);
    EXPECT_EQ(async["dist"]["max_ahead"], 0);
    EXPECT_EQ(async["dist"]["staleness"]["max"], 0);
    for (int r = 0; r < w.size(); ++r) EXPECT_EQ(async["dist"]["pushes_by_rank"][r], 20);
  }
  w.barrier();
  expect_bitwise_same_weights((dir / "async" / "ckpt-10").string(), (dir / "sync" / "ckpt-10").string());
  expect_bitwise_same_weights((dir / "async" / "ckpt-20").string(), (dir / "sync" / "ckpt-20").string());
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(PsModes, BackupWorkerDropsTheSlowRankAndTheFastRanksDoNotWaitForIt) {
  const World& w = world();
  const int n = w.size(), slow = n - 1;
  const int64_t steps = 20, delay_ms = 250;
  const std::filesystem::path dir = shared_dir("backup");
  const std::vector<std::string> slowed = {"dist.debug_delay_ms=" + std::to_string(delay_ms),
                                           "dist.debug_delay_rank=" + std::to_string(slow)};
  // The synchronous server waits for the slow rank every step.
  const nlohmann::json sync = train_mlp(dir / "sync", slowed, steps);
  std::vector<std::string> backup = slowed;
  backup.push_back("dist.backup_workers=1");
  const nlohmann::json rep = train_mlp(dir / "backup", backup, steps);
  const nlohmann::json& d = rep["dist"];
  EXPECT_EQ(d["aggregation"], "backup");
  const double sync_s = sync["time"]["train_seconds"].get<double>(), backup_s = rep["time"]["train_seconds"].get<double>();
  std::printf("[rank %d] %lld steps, rank %d slowed by %lld ms/step: sync ps %.2f s, backup_workers=1 %.2f s\n",
              w.rank(), static_cast<long long>(steps), slow, static_cast<long long>(delay_ms), sync_s, backup_s);
  // (The synchronous server waits inside its step; a synchronous worker waits for the parameters after
  // the step's timing, so only rank 0's time shows the wait.)
  if (w.rank() == 0)
    EXPECT_GE(sync_s, 0.9 * steps * delay_ms / 1000.0) << "the synchronous server waits for the slow rank";
  if (w.rank() != slow)
    EXPECT_LT(backup_s, 0.5 * steps * delay_ms / 1000.0) << "with a backup worker the fast ranks do not wait";
  if (w.rank() == 0) {
    EXPECT_EQ(d["versions"], steps);
    EXPECT_EQ(d["included_contributions"], (n - 1) * steps) << "every version aggregates exactly N - k pushes";
    for (int r = 0; r < n; ++r) {
      if (r == slow) {
        EXPECT_GE(d["dropped_by_rank"][r].get<int64_t>(), 1);
        EXPECT_EQ(d["dropped_by_rank"][r], d["pushes_by_rank"][r]) << "every push of the slow rank came late";
      } else {
        EXPECT_EQ(d["dropped_by_rank"][r], 0);
        EXPECT_EQ(d["pushes_by_rank"][r], steps);
      }
    }
    EXPECT_EQ(d["dropped_contributions"], d["dropped_by_rank"][slow]);
  }
  if (w.rank() == slow) {
    EXPECT_EQ(d["dropped"], d["pushes"]) << "the slow rank's own count agrees";
    EXPECT_LT(d["pushes"].get<int64_t>(), steps) << "it adopted the server's version and skipped steps";
  }
  w.barrier();
  if (w.rank() == 0) {
    // Rank 0's checkpoint is the server's model at version 20.
    EXPECT_TRUE(std::filesystem::exists(dir / "backup" / "ckpt-20"));
    std::filesystem::remove_all(dir);
  }
}

TEST(PsModes, AsyncNeverLetsAWorkerRunMoreThanSPushesAhead) {
  const World& w = world();
  const int n = w.size(), slow = n - 1;
  const int64_t steps = 20, s = 2;
  const std::filesystem::path dir = shared_dir("async2");
  const nlohmann::json rep = train_mlp(dir / "async", {"dist.sync=async", "dist.max_staleness=" + std::to_string(s),
                                                       "dist.debug_delay_ms=60",
                                                       "dist.debug_delay_rank=" + std::to_string(slow)}, steps);
  const nlohmann::json& d = rep["dist"];
  if (w.rank() == 0) {
    std::printf("[rank 0] async s=%lld: versions %lld, max ahead %lld, staleness max %lld mean %.2f\n",
                static_cast<long long>(s), d["versions"].get<long long>(), d["max_ahead"].get<long long>(),
                d["staleness"]["max"].get<long long>(), d["staleness"]["mean"].get<double>());
    EXPECT_LE(d["max_ahead"].get<int64_t>(), s) << "a worker ran more than s pushes ahead of the slowest";
    EXPECT_EQ(d["max_ahead"].get<int64_t>(), s) << "with a slow rank the fast ones reach the bound";
    for (int r = 0; r < n; ++r) EXPECT_EQ(d["pushes_by_rank"][r], steps);
    EXPECT_EQ(d["included_contributions"], n * steps) << "asynchronous pushes are all applied";
    EXPECT_EQ(d["dropped_contributions"], 0);
    EXPECT_GT(d["versions"].get<int64_t>(), steps) << "pushes applied as they arrive, not once per round";
    EXPECT_GE(d["staleness"]["max"].get<int64_t>(), 1);
    const auto& losses = rep["loss"];
    EXPECT_LT(losses.back().get<double>(), losses.front().get<double>());
  }
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- dist.weights and data.sampling = "local_shuffle" -----------------------------------------------------
// Equal user weights are the sample-count default bitwise (equal batches on every rank); unequal ones
// change the model and are reported; a list of the wrong length is named. Local shuffle trains and is
// reported, with another model than the global permutation's.
TEST(DataParallelKeys, UserWeightsAndLocalShuffle) {
  const World& w = world();
  const int n = w.size();
  const std::filesystem::path dir = shared_dir("weights");
  auto list = [&](auto weight_of) {
    std::string s = "dist.weights=[";
    for (int r = 0; r < n; ++r) s += (r ? "," : "") + std::to_string(weight_of(r));
    return s + "]";
  };
  const nlohmann::json plain = train_mlp(dir / "samples", {"dist.topology=allreduce"});
  const nlohmann::json equal = train_mlp(dir / "equal", {"dist.topology=allreduce", list([](int) { return 1; })});
  const nlohmann::json skewed = train_mlp(dir / "skewed", {"dist.topology=allreduce", list([](int r) { return r + 1; })});
  EXPECT_EQ(plain["dist"]["weights"], "samples");
  EXPECT_EQ(skewed["dist"]["weights"][static_cast<size_t>(n - 1)].get<double>(), n);
  w.barrier();
  expect_bitwise_same_weights((dir / "samples" / "ckpt-20").string(), (dir / "equal" / "ckpt-20").string());
  const train::Checkpoint a = train::load_checkpoint((dir / "samples" / "ckpt-20").string());
  const train::Checkpoint b = train::load_checkpoint((dir / "skewed" / "ckpt-20").string());
  EXPECT_FALSE(at::equal(a.weights[0].second, b.weights[0].second)) << "other weights, another model";
  try {
    (void)train_mlp(dir / "bad", {"dist.topology=allreduce", "dist.weights=[1,1,1,1,1]"}, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.weights must hold one weight per rank: " + std::to_string(n) +
                                         " ranks, got 5 weights"),
              std::string::npos)
        << e.what();
  }
  const nlohmann::json local = train_mlp(dir / "local", {"dist.topology=allreduce", "data.sampling=local_shuffle"});
  EXPECT_EQ(local["dist"]["sampling"], "local_shuffle");
  EXPECT_LT(local["loss"].back().get<double>(), local["loss"].front().get<double>()) << "it trains";
  w.barrier();
  const train::Checkpoint c = train::load_checkpoint((dir / "local" / "ckpt-20").string());
  EXPECT_FALSE(at::equal(a.weights[0].second, c.weights[0].second)) << "each rank's own shard: other batches";
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- ensembles (dist.aggregate = "ensemble") ------------------------------------------------------------
// Each rank trains its own member on its own bootstrap sample, with no exchange; the evaluation combines
// the members: every member's accuracy, the mean probability's and the majority vote's, on every rank.
// The members differ, and the ensemble beats the mean member. A checkpoint holds every member: resumed
// at step 30, every member ends bitwise as in the straight run.
TEST(Ensemble, MembersTrainApartAndTheEnsembleBeatsTheMeanMember) {
  const World& w = world();
  const int n = w.size();
  const std::filesystem::path dir = shared_dir("ensemble");
  const std::vector<std::string> keys = {"dist.topology=allreduce", "dist.aggregate=ensemble", "train.eval_batches=40",
                                         "train.eval_every=60", "train.keep_checkpoints=10"};
  const nlohmann::json rep = train_mlp(dir / "straight", keys, 60);
  EXPECT_EQ(rep["dist"]["aggregate"], "ensemble");
  EXPECT_EQ(rep["dist"]["members"], n);
  EXPECT_EQ(rep["dist"]["sampling"], "bootstrap");
  EXPECT_EQ(rep["dist"]["bytes_sent_per_step"].get<double>(), 0.0) << "no exchange while training";
  const nlohmann::json& e = rep["eval"].back()["ensemble"];
  ASSERT_EQ(e["member_accuracy"].size(), static_cast<size_t>(n));
  std::set<double> distinct;
  for (const auto& a : e["member_accuracy"]) distinct.insert(a.get<double>());
  EXPECT_GT(distinct.size(), 1u) << "every member trained on its own sample";
  EXPECT_GT(e["soft_vote_accuracy"].get<double>(), e["mean_member_accuracy"].get<double>()) << e.dump();
  EXPECT_GE(e["vote_accuracy"].get<double>(), *std::min_element(distinct.begin(), distinct.end())) << e.dump();
  EXPECT_EQ(rep["eval"].back()["accuracy"], e["soft_vote_accuracy"]);
  if (w.rank() == 0)
    std::printf("ensemble N=%d: members %s, mean %.4f, soft vote %.4f, majority vote %.4f\n", n,
                e["member_accuracy"].dump().c_str(), e["mean_member_accuracy"].get<double>(),
                e["soft_vote_accuracy"].get<double>(), e["vote_accuracy"].get<double>());
  // Resume at 30: every member continues from its own state.
  train::TrainOptions o;
  o.config_path = std::string(RATION_SOURCE_DIR) + "/configs/mlp.toml";
  o.overrides = {"train.threads=1", "train.checkpoint_dir=" + (dir / "resumed").string(), "train.checkpoint_every=10",
                 "train.keep_checkpoints=3", "train.batch_size=16", "model.dropout=0", "train.eval_batches=1",
                 "train.eval_every=0", "train.log_every=1000", "dist.topology=ps"};
  o.overrides.insert(o.overrides.end(), keys.begin(), keys.end());
  o.steps = 60;
  o.json = true;
  o.world = w;
  o.resume = (dir / "straight" / "ckpt-30").string();
  (void)train::run_training(o);
  w.barrier();
  const train::Checkpoint a = train::load_checkpoint((dir / "straight" / "ckpt-60").string());
  const train::Checkpoint b = train::load_checkpoint((dir / "resumed" / "ckpt-60").string());
  int members = 0;
  for (size_t i = 0; i < a.optimizer.size(); ++i) {
    if (a.optimizer[i].first.rfind("dist.member", 0) != 0) continue;
    ASSERT_LT(i, b.optimizer.size());
    ASSERT_EQ(a.optimizer[i].first, b.optimizer[i].first);
    EXPECT_TRUE(at::equal(a.optimizer[i].second, b.optimizer[i].second)) << a.optimizer[i].first;
    members += a.optimizer[i].first.find(".param.") != std::string::npos &&
               a.optimizer[i].first.find("out.weight") != std::string::npos;
  }
  EXPECT_EQ(members, n) << "the checkpoint holds every member";
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- evolution strategies (optim.name = "es") -------------------------------------------------------------
// Forward passes only: each rank evaluates its antithetic pairs, one all-reduce of the population's losses
// per step (4 bytes each, whatever the model's size), and the accuracy rises over the evaluations.
TEST(EvolutionStrategies, MlpLearnsFromThePopulationsLossesAlone) {
  const World& w = world();
  const std::filesystem::path dir = shared_dir("es");
  const nlohmann::json rep = train_mlp(dir / "es", {"dist.topology=allreduce", "optim.name=es", "optim.lr=0.0005",
                                                    "optim.es_population=32", "train.eval_every=50",
                                                    "train.eval_batches=20"},
                                       150);
  EXPECT_EQ(rep["dist"]["es"]["bytes_sent_per_step"], 4 * 32);
  EXPECT_EQ(rep["dist"]["es"]["population"], 32);
  ASSERT_GE(rep["eval"].size(), 3u);
  std::string curve;
  for (const auto& e : rep["eval"]) curve += std::to_string(e["accuracy"].get<double>()) + " ";
  EXPECT_GT(rep["eval"].back()["accuracy"].get<double>(), 0.3) << curve;
  EXPECT_GT(rep["eval"].back()["accuracy"].get<double>(), rep["eval"].front()["accuracy"].get<double>()) << curve;
  EXPECT_LT(rep["loss"].back().get<double>(), rep["loss"].front().get<double>());
  if (w.rank() == 0) std::printf("es N=%d: accuracy at steps 50/100/150: %s\n", w.size(), curve.c_str());
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- K-FAC (optim.name = "kfac") ---------------------------------------------------------------------------
// N ranks on their shards equal one process on the global batch: the factors are the global batch's (each
// rank's sums all-reduced), the inverses computed round-robin and broadcast, so after 12 steps with two
// factor updates (update_every = 5: steps 0, 5, 10) the weights agree within 1e-5.
TEST(Kfac, RanksOnShardsEqualOneProcessOnTheGlobalBatch) {
  const World& w = world();
  const int n = w.size();
  const std::filesystem::path dir = shared_dir("kfac");
  const std::vector<std::string> keys = {"dist.topology=allreduce", "optim.name=kfac", "optim.lr=0.1",
                                         "optim.kfac_damping=0.1", "optim.kfac_update_every=5"};
  const nlohmann::json rep = train_mlp(dir / "ranks", keys, 12);
  EXPECT_EQ(rep["dist"]["kfac"]["updates"], 3);
  train::TrainOptions one;
  one.config_path = std::string(RATION_SOURCE_DIR) + "/configs/mlp.toml";
  const std::filesystem::path mine = dir / ("one-" + std::to_string(w.rank()));
  one.overrides = {"train.threads=1", "train.checkpoint_dir=" + mine.string(), "train.checkpoint_every=12",
                   "train.batch_size=" + std::to_string(16 * n), "model.dropout=0", "train.eval_batches=1",
                   "train.eval_every=0", "train.log_every=1000"};
  one.overrides.insert(one.overrides.end(), keys.begin(), keys.end());
  one.steps = 12;
  one.json = true;
  one.world = World::init_single();
  (void)train::run_training(one);
  w.barrier();
  const train::Checkpoint a = train::load_checkpoint((dir / "ranks" / "ckpt-12").string());
  const train::Checkpoint b = train::load_checkpoint((mine / "ckpt-12").string());
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    const double scale = b.weights[i].second.abs().max().item<double>();
    const double diff = (a.weights[i].second - b.weights[i].second).abs().max().item<double>();
    EXPECT_LE(diff / scale, 1e-5) << a.weights[i].first;
  }
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- model averaging (dist.aggregate = "parameters") ------------------------------------------------
TEST(ModelAveraging, AverageIsTheSampleWeightedMeanOverRanks) {
  const World& w = world();
  const int n = w.size();
  at::Tensor a = at::full({3, 4}, static_cast<float>(w.rank() + 1)), b = at::arange(5).to(at::kFloat) * (w.rank() + 1);
  const double weight = static_cast<double>(w.rank() + 1);
  const Traffic t = average_parameters(w, {a, b}, weight);
  double num = 0, den = 0;
  for (int r = 0; r < n; ++r) num += (r + 1.0) * (r + 1.0), den += r + 1.0;
  EXPECT_NEAR(a[0][0].item<double>(), num / den, 1e-6);
  EXPECT_NEAR(b[4].item<double>(), 4 * num / den, 1e-5);
  EXPECT_EQ(t.payload_bytes, (12 + 5 + 1) * 4);
}

// With SGD + momentum (linear in the gradient) and K = 1, averaging the parameters after every local
// step is the gradient all-reduce (to rounding).
TEST(ModelAveraging, WithSgdAndKEqualToOneIsTheGradientAllReduce) {
  const World& w = world();
  const std::filesystem::path dir = shared_dir("avg1");
  const std::vector<std::string> sgd = {"dist.topology=allreduce", "optim.name=sgd", "optim.lr=0.05",
                                        "optim.momentum=0.9"};
  (void)train_mlp(dir / "allreduce", sgd);
  std::vector<std::string> avg = sgd;
  avg.push_back("dist.aggregate=parameters");
  const nlohmann::json rep = train_mlp(dir / "avg", avg);
  EXPECT_EQ(rep["dist"]["aggregate"], "parameters");
  EXPECT_EQ(rep["dist"]["averages"], 20);
  w.barrier();
  const train::Checkpoint ca = train::load_checkpoint((dir / "avg" / "ckpt-20").string());
  const train::Checkpoint cb = train::load_checkpoint((dir / "allreduce" / "ckpt-20").string());
  ASSERT_EQ(ca.weights.size(), cb.weights.size());
  for (size_t i = 0; i < ca.weights.size(); ++i) {
    const double scale = cb.weights[i].second.abs().max().item<double>();
    const double diff = (ca.weights[i].second - cb.weights[i].second).abs().max().item<double>();
    // The average rounds differently from the all-reduced gradient (each rank's parameters times its
    // weight, summed, divided by the summed weight): ~1e-7 per step at N = 3, 1.05e-6 after 20 steps.
    EXPECT_LE(diff / scale, 5e-6) << ca.weights[i].first;
  }
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// K = 5 local steps between averages, 22 steps: 4 averages on the way and one at the end, so every rank
// ends with the same model; one all-reduce of P + 1 floats per average.
TEST(ModelAveraging, AveragesEveryKStepsAndOnceAtTheEnd) {
  const World& w = world();
  const std::filesystem::path dir = shared_dir("avg5");
  const nlohmann::json rep =
      train_mlp(dir / "avg", {"dist.topology=allreduce", "dist.aggregate=parameters", "dist.sync_every=5"}, 22);
  const nlohmann::json& d = rep["dist"];
  EXPECT_EQ(d["average_every"], 5);
  EXPECT_EQ(d["averages"], 5);
  const double params = rep["parameters"].get<double>();
  EXPECT_DOUBLE_EQ(d["bytes_sent_per_step"].get<double>(), 5 * 4 * (params + 1) / 22.0);
  EXPECT_LT(rep["loss"].back().get<double>(), rep["loss"].front().get<double>());
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ration::dist

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();
  return ration::dist::testing::run_worker(argc, argv, "ration_ps_modes_worker");
}
