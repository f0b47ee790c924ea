// test_ps_aggregation.cpp — the parameter server's partial and asynchronous aggregation rule
// (distributed/ps_aggregation.h), in one process: workers are threads (or calls in a chosen order), the server
// model records every gradient it is asked to apply. Checks the backup-worker round (the first N-k
// pushes, weighted exactly by their sample shares; the late push dropped and answered with the new
// version), the staleness bound (a worker s pushes ahead waits; s = 0 is one sum per round in rank order),
// failure wake-ups, and the [dist] key errors. The multi-process runs are in tests/distributed/ps_modes_worker.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ration/config/config.h"
#include "ration/distributed/data_parallel.h"
#include "ration/distributed/ps_aggregation.h"
#include "distributed/recording_server_model.h"

namespace ration::dist {
namespace {

Push push_of(int rank, int64_t base, int64_t step, double share, const at::Tensor& g) {
  Push p;
  p.rank = rank;
  p.base_version = base;
  p.step = step;
  p.share = share;
  p.loss_sum = 10.0 * (rank + 1);
  p.samples = 5;
  p.gradient = g;
  return p;
}

// Rank r's gradient: share-weighted, distinct per rank and element.
at::Tensor gradient_of(int rank, double share) {
  at::manual_seed(100 + rank);
  return (at::randn({7}) * share).contiguous();
}

TEST(PsAggregation, BackupWorkersAggregateTheFirstArrivalsWeightedBySamplesAndDropTheLate) {
  const int n = 3;
  RecordingModel model(7);
  PsAggregator agg(n, {PsAggregation::BackupWorkers, /*k=*/1, 0}, model, /*first_version=*/0);
  // Unequal sample shares (a short batch on rank 1): 8, 3, 8 of 19 samples.
  const double share[3] = {8.0 / 19, 3.0 / 19, 8.0 / 19};
  at::Tensor params = at::empty({7});
  // Ranks 2 and 1 arrive first (in that order), rank 0 is late.
  agg.submit(push_of(2, 0, 0, share[2], gradient_of(2, share[2])));
  EXPECT_FALSE(agg.reply_ready(2)) << "one push of the N - k = 2 a round needs";
  agg.submit(push_of(1, 0, 0, share[1], gradient_of(1, share[1])));
  ASSERT_TRUE(agg.reply_ready(1));
  ASSERT_TRUE(agg.reply_ready(2));
  ASSERT_EQ(model.applied.size(), 1u);
  // Reference: sum of the included ranks' weighted gradients in rank order, over the sum of their shares.
  const at::Tensor expected = (gradient_of(1, share[1]) + gradient_of(2, share[2])) / (share[1] + share[2]);
  EXPECT_TRUE(at::equal(model.applied[0], expected)) << "exactly the weighted mean of the included ranks";
  // It is the weighted mean of the unweighted gradients, 8:3 (to rounding).
  const at::Tensor g1 = gradient_of(1, 1.0), g2 = gradient_of(2, 1.0);
  EXPECT_TRUE(at::allclose(model.applied[0], (3 * g1 + 8 * g2) / 11, 1e-6, 1e-6));
  const Reply r1 = agg.await_reply(1, params);
  EXPECT_EQ(r1.version, 1);
  EXPECT_FALSE(r1.dropped);
  EXPECT_DOUBLE_EQ(r1.loss, (20.0 + 30.0) / 10.0);
  EXPECT_TRUE(at::equal(params, -expected));
  (void)agg.await_reply(2, params);
  // Rank 0's push on version 0 comes after the round closed: dropped, answered at once with version 1.
  agg.submit(push_of(0, 0, 0, share[0], gradient_of(0, share[0])));
  ASSERT_TRUE(agg.reply_ready(0));
  const Reply r0 = agg.await_reply(0, params);
  EXPECT_TRUE(r0.dropped);
  EXPECT_EQ(r0.version, 1);
  EXPECT_EQ(model.applied.size(), 1u) << "a dropped push is never applied";
  // Version 1: rank 0 now first, then rank 2; rank 1 late.
  agg.submit(push_of(0, 1, 1, share[0], gradient_of(0, share[0])));
  agg.submit(push_of(2, 1, 1, share[2], gradient_of(2, share[2])));
  ASSERT_EQ(model.applied.size(), 2u);
  EXPECT_TRUE(at::equal(model.applied[1],
                        (gradient_of(0, share[0]) + gradient_of(2, share[2])) / (share[0] + share[2])));
  EXPECT_EQ(model.steps[1], 1);
  agg.submit(push_of(1, 1, 1, share[1], gradient_of(1, share[1])));
  EXPECT_TRUE(agg.await_reply(1, params).dropped);
  const PsAggregationStats st = agg.stats();
  EXPECT_EQ(st.pushes, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(st.included, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(st.dropped, (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(st.total(st.dropped), 2);
  EXPECT_EQ(st.versions, 2);
  EXPECT_EQ(st.max_staleness(), 0) << "a backup round aggregates only pushes on its own version";
}

TEST(PsAggregation, BackupRoundClosesWithFewerPushesOnceRanksFinished) {
  RecordingModel model(7);
  PsAggregator agg(3, {PsAggregation::BackupWorkers, 1, 0}, model, 5);
  agg.finished(0);
  agg.finished(1);  // only rank 2 still trains: its round must not wait for N - k = 2 pushes
  agg.submit(push_of(2, 5, 5, 0.5, gradient_of(2, 0.5)));
  ASSERT_TRUE(agg.reply_ready(2));
  at::Tensor params = at::empty({7});
  EXPECT_EQ(agg.await_reply(2, params).version, 6);
  EXPECT_TRUE(at::equal(model.applied[0], gradient_of(2, 0.5) / 0.5));
}

TEST(PsAggregation, AsyncWorkerWaitsOnlyWhenMoreThanSPushesAhead) {
  const int n = 3;
  RecordingModel model(7);
  PsAggregator agg(n, {PsAggregation::BoundedAsync, 0, /*s=*/1}, model, 0);
  at::Tensor params = at::empty({7});
  // Rank 1 pushes its step 0: one ahead of ranks 0 and 2 (0 pushes): within s = 1, applied at once.
  agg.submit(push_of(1, 0, 0, 1.0 / 3, gradient_of(1, 1.0 / 3)));
  ASSERT_TRUE(agg.reply_ready(1));
  ASSERT_EQ(model.applied.size(), 1u) << "applied as it arrives";
  EXPECT_TRUE(at::equal(model.applied[0], gradient_of(1, 1.0 / 3)));
  EXPECT_EQ(agg.await_reply(1, params).version, 1);
  // Its step 1: two ahead: it waits (its push is pending, not applied)...
  agg.submit(push_of(1, 1, 1, 1.0 / 3, gradient_of(1, 1.0 / 3)));
  EXPECT_FALSE(agg.reply_ready(1));
  EXPECT_EQ(model.applied.size(), 1u);
  // ...until rank 0 pushes (still one behind: rank 2 has 0 pushes), and then rank 2.
  agg.submit(push_of(0, 0, 0, 1.0 / 3, gradient_of(0, 1.0 / 3)));
  EXPECT_TRUE(agg.reply_ready(0));  // rank 0: 1 push against rank 2's 0, within s
  EXPECT_FALSE(agg.reply_ready(1)) << "rank 1 is 2 pushes ahead of rank 2";
  ASSERT_EQ(model.applied.size(), 2u) << "rank 0's release applied every pending push";
  // Pending pushes are summed in (step, rank) order: rank 0's step 0 first, then rank 1's step 1.
  EXPECT_TRUE(at::equal(model.applied[1], gradient_of(0, 1.0 / 3) + gradient_of(1, 1.0 / 3)));
  EXPECT_EQ(model.steps[1], 0) << "the learning rate of the oldest push";
  (void)agg.await_reply(0, params);
  agg.submit(push_of(2, 0, 0, 1.0 / 3, gradient_of(2, 1.0 / 3)));
  EXPECT_TRUE(agg.reply_ready(1));
  EXPECT_TRUE(agg.reply_ready(2));
  (void)agg.await_reply(1, params);
  (void)agg.await_reply(2, params);
  const PsAggregationStats st = agg.stats();
  EXPECT_EQ(st.max_ahead, 1) << "no worker was let go on more than s = 1 pushes ahead";
  EXPECT_EQ(st.versions, 3);
  // Staleness: rank 1's step 0 (0), rank 0's (base 0 applied at version 1: 1), rank 1's step 1 (base 1
  // applied at 1: 0), rank 2's (base 0 applied at version 2: 2).
  EXPECT_EQ(st.staleness, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(st.max_staleness(), 2);
  EXPECT_DOUBLE_EQ(st.mean_staleness(), 3.0 / 4.0);
}

TEST(PsAggregation, AsyncWithZeroStalenessAppliesOneRankOrderedSumPerRound) {
  const int n = 3;
  RecordingModel model(7);
  PsAggregator agg(n, {PsAggregation::BoundedAsync, 0, /*s=*/0}, model, 0);
  at::Tensor params = at::empty({7});
  for (int64_t step = 0; step < 3; ++step) {
    for (int r : {2, 0, 1}) {  // arrival order is not rank order
      EXPECT_EQ(model.applied.size(), static_cast<size_t>(step));
      agg.submit(push_of(r, step, step, 1.0 / 3, gradient_of(r, 1.0 / 3)));
    }
    ASSERT_EQ(model.applied.size(), static_cast<size_t>(step + 1));
    // Bitwise the synchronous server's sum: rank 0's gradient, then rank 1's added, then rank 2's.
    at::Tensor sync = gradient_of(0, 1.0 / 3).clone();
    sync.add_(gradient_of(1, 1.0 / 3));
    sync.add_(gradient_of(2, 1.0 / 3));
    EXPECT_TRUE(at::equal(model.applied.back(), sync));
    for (int r = 0; r < n; ++r) EXPECT_EQ(agg.await_reply(r, params).version, step + 1);
  }
  EXPECT_EQ(agg.stats().max_ahead, 0);
  EXPECT_EQ(agg.stats().max_staleness(), 0);
}

TEST(PsAggregation, AsyncFinishedRankNoLongerHoldsTheOthersBack) {
  RecordingModel model(7);
  PsAggregator agg(2, {PsAggregation::BoundedAsync, 0, 0}, model, 0);
  at::Tensor params = at::empty({7});
  agg.submit(push_of(1, 0, 0, 0.5, gradient_of(1, 0.5)));
  EXPECT_FALSE(agg.reply_ready(1));
  agg.finished(0);  // rank 0 stopped (e.g. a stop request): rank 1 must not wait for it
  EXPECT_TRUE(agg.reply_ready(1));
}

TEST(PsAggregation, FailureWakesAWaitingWorker) {
  RecordingModel model(7);
  PsAggregator agg(2, {PsAggregation::BoundedAsync, 0, 0}, model, 0);
  agg.submit(push_of(1, 0, 0, 0.5, gradient_of(1, 0.5)));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    agg.fail("lost rank 0");
  });
  at::Tensor params = at::empty({7});
  try {
    (void)agg.await_reply(1, params);
    ADD_FAILURE() << "await_reply returned after a failure";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("lost rank 0"), std::string::npos);
  }
  t.join();
  EXPECT_THROW(agg.submit(push_of(0, 0, 0, 0.5, gradient_of(0, 0.5))), CollectiveError);
  EXPECT_TRUE(model.applied.empty());
}

std::string settings_error(const std::string& toml) {
  try {
    Config cfg = Config::from_string(toml, "run.toml");
    (void)read_data_parallel_settings(cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PsAggregation, ConfigErrorsNameTheKeys) {
  EXPECT_NE(settings_error("[dist]\nbackup_workers = 1\n").find(
                "run.toml: dist.backup_workers > 0 needs dist.topology = \"ps\""),
            std::string::npos);
  EXPECT_NE(settings_error("[dist]\nsync = \"async\"\ntopology = \"gossip\"\n")
                .find("dist.sync = \"async\" needs dist.topology = \"ps\""),
            std::string::npos);
  EXPECT_NE(settings_error("[dist]\nsync = \"async\"\nbackup_workers = 1\ntopology = \"ps\"\n")
                .find("do not combine"),
            std::string::npos);
  EXPECT_NE(settings_error("[dist]\nsync = \"sometimes\"\n").find("dist.sync"), std::string::npos);
  EXPECT_NE(settings_error("[dist]\nmax_staleness = -1\nsync = \"async\"\ntopology = \"ps\"\n")
                .find("dist.max_staleness must be an integer >= 0"),
            std::string::npos);
  Config ok = Config::from_string("[dist]\ntopology = \"ps\"\nbackup_workers = 2\n", "run.toml");
  const DataParallelSettings s = read_data_parallel_settings(ok);
  EXPECT_EQ(s.ps.mode, PsAggregation::BackupWorkers);
  EXPECT_EQ(s.ps.backup_workers, 2);
  // PsAggregator itself refuses k >= N (the trainer checks it first, naming the config).
  RecordingModel model(7);
  EXPECT_THROW(PsAggregator(2, {PsAggregation::BackupWorkers, 2, 0}, model, 0), Error);
}

}  // namespace
}  // namespace ration::dist
