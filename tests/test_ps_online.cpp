// The online parameter server: deltas carry changed rows and tombstones, so a disabled id disappears from
// the mirror after the next sync; a missing or out-of-order delta is refused and the table is copied in
// full; kill -9 of the online server while it applies a delta, then restart, resumes from its persisted
// version without a full copy; Lookups during syncs never see a torn row (checksum column) or a
// half-applied delta; Predict equals the trainer's own evaluation after a sync; bad flags name the flag.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <set>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>

#include "proto/ps.grpc.pb.h"
#include "ration/base/check.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/models/ctr.h"
#include "ration/ps/client.h"
#include "ration/serving/online_server.h"
#include "ration/train/checkpoint.h"
#include "ration/train/trainer.h"
#include "test_ps_util.h"
#include "test_util.h"

namespace ration {
namespace {
namespace fs = std::filesystem;
namespace wire = ps::wire;
using testing::TempDir;
using ps::OnlineServer;

ps::TableOptions table_opts(const std::string& name, int64_t dim) {
  ps::TableOptions o;
  o.name = name;
  o.dim = dim;
  o.seed = 3;
  o.init_scale = 0.1f;
  o.optimizer.kind = ps::OptimizerKind::Adagrad;
  return o;
}

std::vector<std::unique_ptr<ps::DeltaSource>> sources_of(ps::ShardCore& core) {
  std::vector<std::unique_ptr<ps::DeltaSource>> v;
  v.push_back(ps::embedded_delta_source(core));
  return v;
}

std::vector<float> online_row(ps::OnlineStore& s, const std::string& table, uint64_t id) {
  std::vector<float> v(static_cast<size_t>(s.dim(table)));
  EXPECT_TRUE(s.lookup(table, &id, 1, v.data()));
  return v;
}
std::vector<float> training_row(ps::Table& t, uint64_t id) {
  std::vector<float> v(static_cast<size_t>(t.dim()));
  t.pull(&id, 1, v.data(), ps::MissingRow::ReadDefault);
  return v;
}

void push_some(ps::Table& t, const std::vector<uint64_t>& ids, int64_t step, float g0 = 0.5f) {
  std::vector<float> g(ids.size() * static_cast<size_t>(t.dim()));
  for (size_t i = 0; i < g.size(); ++i) g[i] = g0 * static_cast<float>((i % 7) + 1) / 7.0f;
  t.push(ids.data(), static_cast<int64_t>(ids.size()), g.data(), step);
}

TEST(PsOnline, ChangesAndDisabledIdsReachTheMirrorAtTheNextSync) {
  ps::ShardCore core({0, 1}, "");
  ps::Table& t = core.store().ensure_table(table_opts("user", 4));
  std::vector<uint64_t> ids(100);
  std::iota(ids.begin(), ids.end(), 1000);
  push_some(t, ids, 1);
  ps::OnlineOptions o;
  o.sync_interval_s = 0;
  OnlineServer online(o, sources_of(core));
  ps::SyncReport r = online.sync_now();
  EXPECT_TRUE(r.full);  // first sync: a full copy
  for (uint64_t id : ids) ASSERT_EQ(online_row(online.store(), "user", id), training_row(t, id));
  // Change 10 rows and disable 5 others: the next delta holds exactly those.
  std::vector<uint64_t> changed(ids.begin(), ids.begin() + 10), gone(ids.begin() + 50, ids.begin() + 55);
  push_some(t, changed, 2, -1.0f);
  ASSERT_EQ(t.disable(gone.data(), 5), 5);
  // Before the sync the mirror still serves the old rows.
  EXPECT_NE(online_row(online.store(), "user", gone[0]), std::vector<float>(4, 0.0f));
  r = online.sync_now();
  EXPECT_FALSE(r.full);
  EXPECT_EQ(r.rows, 10);
  EXPECT_EQ(r.tombstones, 5);
  for (uint64_t id : gone) EXPECT_EQ(online_row(online.store(), "user", id), std::vector<float>(4, 0.0f)) << id;
  for (uint64_t id : ids) ASSERT_EQ(online_row(online.store(), "user", id), training_row(t, id)) << id;
  const auto mirrors = online.store().mirrors();
  ASSERT_EQ(mirrors.size(), 1u);
  EXPECT_EQ(mirrors[0].rows, 95);  // the rows are freed on the mirror too
  EXPECT_EQ(mirrors[0].disabled, 5);
  EXPECT_EQ(mirrors[0].version, t.version());
  // Never-seen ids read their initial value, as on the training side.
  EXPECT_EQ(online_row(online.store(), "user", 77), training_row(t, 77));
  wire::OnlineStatsResponse st;
  ASSERT_TRUE(online.stats(&st).ok());
  EXPECT_EQ(st.versions_behind(), 0);
  EXPECT_EQ(st.full_resyncs(), 1);
  EXPECT_GE(st.staleness_s(), 0);
  push_some(t, changed, 3);
  ASSERT_TRUE(online.stats(&st).ok());
  EXPECT_EQ(st.versions_behind(), 1);
}

// A source that restarted (a new epoch, versions from 0 again) is followed by its new versions: Stats'
// source_version does not keep the old epoch's maximum.
TEST(PsOnline, SourceVersionFollowsANewEpoch) {
  ps::OnlineStore store(1, "");
  ps::Delta d;
  d.table = "item";
  d.options = table_opts("item", 3);
  d.full = true;
  d.epoch = 1;
  d.to_version = 50;
  ASSERT_EQ(store.apply(d), ps::ApplyResult::Applied);
  d.epoch = 2;
  d.to_version = 3;
  ASSERT_EQ(store.apply(d), ps::ApplyResult::Applied);
  const std::vector<ps::MirrorInfo> m = store.mirrors();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].epoch, 2u);
  EXPECT_EQ(m[0].source_version, 3) << "the restarted source's version, not the old epoch's 50";
  d.full = false;
  d.from_version = 3;
  d.to_version = 7;
  ASSERT_EQ(store.apply(d), ps::ApplyResult::Applied);
  EXPECT_EQ(store.mirrors()[0].source_version, 7);
}

TEST(PsOnline, MissingOrOutOfOrderDeltaIsRefusedAndTheTableCopiedInFull) {
  ps::ShardCore core({0, 1}, "");
  ps::Table& t = core.store().ensure_table(table_opts("item", 3));
  auto src = ps::embedded_delta_source(core);
  ps::OnlineStore store(1, "");
  bool need_full = false;
  push_some(t, {1, 2, 3}, 1);
  ps::Delta d0 = ps::fetch_delta(*src, 0, "item", -1, 100, &need_full);
  ASSERT_EQ(store.apply(d0), ps::ApplyResult::Applied);
  const int64_t v0 = d0.to_version;
  push_some(t, {1}, 2);
  ps::Delta d1 = ps::fetch_delta(*src, 0, "item", v0, 100, &need_full);
  push_some(t, {2}, 3);
  ps::Delta d2 = ps::fetch_delta(*src, 0, "item", d1.to_version, 100, &need_full);
  // Out of order: d2 before d1 is refused and changes nothing.
  EXPECT_EQ(store.apply(d2), ps::ApplyResult::Gap);
  EXPECT_EQ(store.version(0, "item"), v0);
  EXPECT_EQ(store.apply(d1), ps::ApplyResult::Applied);
  EXPECT_EQ(store.apply(d1), ps::ApplyResult::Gap);  // a replay too
  EXPECT_EQ(store.apply(d2), ps::ApplyResult::Applied);
  EXPECT_EQ(online_row(store, "item", 2), training_row(t, 2));
  // Missing delta: the mirror skips one; sync_source notices the gap and copies in full.
  push_some(t, {3}, 4);
  ps::Delta d3 = ps::fetch_delta(*src, 0, "item", d2.to_version, 100, &need_full);
  push_some(t, {1}, 5);
  ps::Delta d4 = ps::fetch_delta(*src, 0, "item", d3.to_version, 100, &need_full);
  EXPECT_EQ(store.apply(d4), ps::ApplyResult::Gap);
  const ps::SyncReport r = ps::sync_source(store, 0, *src);
  EXPECT_FALSE(r.full);  // sync_source asks from the mirror's own version: no gap there
  EXPECT_EQ(store.version(0, "item"), t.version());
  // A tombstone log that no longer reaches the mirror's version: need_full -> full copy.
  t.set_tombstone_limit(2);
  std::vector<uint64_t> gone = {1, 2, 3};
  t.disable(gone.data(), 3);
  ps::fetch_delta(*src, 0, "item", store.version(0, "item"), 100, &need_full);
  EXPECT_TRUE(need_full);
  const ps::SyncReport full = ps::sync_source(store, 0, *src);
  EXPECT_TRUE(full.full);
  for (uint64_t id : gone) EXPECT_EQ(online_row(store, "item", id), std::vector<float>(3, 0.0f));
  EXPECT_EQ(store.counters().full_resyncs, 1);
  // A new training table object (restart without the old one): the epoch changes -> full copy.
  ps::ShardCore core2({0, 1}, "");
  ps::Table& t2 = core2.store().ensure_table(table_opts("item", 3));
  push_some(t2, {9}, 1);
  for (int i = 0; i < 20; ++i) push_some(t2, {9}, 2 + i);  // a version above the mirror's
  auto src2 = ps::embedded_delta_source(core2);
  const ps::SyncReport e = ps::sync_source(store, 0, *src2);
  EXPECT_TRUE(e.full);
  EXPECT_EQ(online_row(store, "item", 9), training_row(t2, 9));
  EXPECT_EQ(online_row(store, "item", 2), training_row(t2, 2));  // not held any more: initial value
}

// Row layout for the checksum test: values[0..6] = k + i/8, values[7] = their sum.
std::vector<float> checksum_rows(const std::vector<uint64_t>& ids, int64_t k) {
  std::vector<float> v(ids.size() * 8);
  for (size_t r = 0; r < ids.size(); ++r) {
    float sum = 0;
    for (int i = 0; i < 7; ++i) {
      v[r * 8 + static_cast<size_t>(i)] = static_cast<float>(k) + static_cast<float>(i) / 8.0f + static_cast<float>(ids[r] % 5);
      sum += v[r * 8 + static_cast<size_t>(i)];
    }
    v[r * 8 + 7] = sum;
  }
  return v;
}

TEST(PsOnline, LookupsDuringSyncsNeverSeeATornRowOrAHalfAppliedDelta) {
  ps::ShardCore core({0, 1}, "");
  ps::Table& t = core.store().ensure_table(table_opts("c", 8));
  std::vector<uint64_t> ids(3000);
  std::iota(ids.begin(), ids.end(), 1);
  t.assign(ids.data(), static_cast<int64_t>(ids.size()), checksum_rows(ids, 0).data());
  ps::OnlineOptions o;
  o.sync_interval_s = 0;
  o.max_rows = 257;  // many pages per delta
  OnlineServer online(o, sources_of(core));
  online.sync_now();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> torn{0}, mixed{0}, reads{0};
  // Writer + syncer in one thread: every delta holds exactly one write of all rows (one k).
  std::thread writer([&] {
    for (int64_t k = 1; k <= 60; ++k) {
      t.assign(ids.data(), static_cast<int64_t>(ids.size()), checksum_rows(ids, k).data());
      online.sync_now();
    }
    stop = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      std::vector<float> out(ids.size() * 8);
      while (!stop) {
        online.store().lookup("c", ids.data(), static_cast<int64_t>(ids.size()), out.data());
        const float k0 = out[0] - static_cast<float>(ids[0] % 5);
        for (size_t i = 0; i < ids.size(); ++i) {
          float sum = 0;
          for (int j = 0; j < 7; ++j) sum += out[i * 8 + static_cast<size_t>(j)];
          if (sum != out[i * 8 + 7]) ++torn;
          if (out[i * 8] - static_cast<float>(ids[i] % 5) != k0) ++mixed;
        }
        ++reads;
      }
    });
  writer.join();
  for (auto& r : readers) r.join();
  EXPECT_GT(reads.load(), 5);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(mixed.load(), 0);
  // Concurrent writes and syncs (deltas may then hold part of a training write): rows stay whole.
  std::atomic<bool> stop2{false};
  std::thread w2([&] {
    for (int64_t k = 100; !stop2; ++k) t.assign(ids.data() + (k % 3) * 1000, 1000, checksum_rows(std::vector<uint64_t>(ids.begin() + (k % 3) * 1000, ids.begin() + (k % 3) * 1000 + 1000), k).data());
  });
  std::thread s2([&] {
    for (int i = 0; i < 30; ++i) online.sync_now();
    stop2 = true;
  });
  std::vector<float> out(ids.size() * 8);
  while (!stop2) {
    online.store().lookup("c", ids.data(), static_cast<int64_t>(ids.size()), out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      float sum = 0;
      for (int j = 0; j < 7; ++j) sum += out[i * 8 + static_cast<size_t>(j)];
      ASSERT_EQ(sum, out[i * 8 + 7]) << "torn row " << ids[i];
    }
  }
  w2.join();
  s2.join();
  online.sync_now();
  for (uint64_t id : {1ull, 1500ull, 3000ull}) EXPECT_EQ(online_row(online.store(), "c", id), training_row(t, id));
}

std::unique_ptr<wire::OnlineParameterServer::Stub> online_stub(const std::string& endpoint) {
  return wire::OnlineParameterServer::NewStub(grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
}

wire::OnlineStatsResponse online_stats(wire::OnlineParameterServer::Stub& stub) {
  grpc::ClientContext c;
  wire::OnlineStatsResponse r;
  EXPECT_TRUE(stub.Stats(&c, wire::StatsRequest(), &r).ok());
  return r;
}

TEST(PsOnline, KillNineMidDeltaThenRestartResumesWithoutAFullCopy) {
  TempDir dir("ps-online-kill");
  const std::string state = (dir.path / "state").string();
  testing::ServerProcess training;
  training.start({"--listen", "127.0.0.1:0", "--shard", "0/1"});
  ps::ClientOptions co;
  co.endpoints = {training.endpoint()};
  ps::PsClient client(co);
  client.declare_tables({table_opts("user", 4)});
  std::vector<uint64_t> ids(500);
  std::iota(ids.begin(), ids.end(), 1);
  std::vector<float> g(ids.size() * 4, 0.25f);
  client.push("user", ids.data(), 500, g.data(), 4, 1);
  // First server: the initial full copy completes; the second delta is killed while being applied.
  {
    testing::ServerProcess online;
    online.start({"--online", "--follow", training.endpoint(), "--listen", "127.0.0.1:0", "--state-dir", state,
                  "--sync-interval-s", "0", "--apply-delay-ms", "1500"});
    auto stub = online_stub(online.endpoint());
    {
      grpc::ClientContext c;
      wire::SyncResponse r;
      ASSERT_TRUE(stub->Sync(&c, wire::SyncRequest(), &r).ok());
      EXPECT_EQ(r.stats().full_resyncs(), 1);
    }
    std::vector<float> g2(100 * 4, -0.5f);
    client.push("user", ids.data(), 100, g2.data(), 4, 2);
    std::thread sync([&] {
      grpc::ClientContext c;
      wire::SyncResponse r;
      stub->Sync(&c, wire::SyncRequest(), &r);  // fails: the server dies
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(online.stop(SIGKILL), 128 + SIGKILL);
    sync.join();
  }
  // Restart without the delay: it holds the version of the first sync and catches up by a delta.
  testing::ServerProcess online;
  online.start({"--online", "--follow", training.endpoint(), "--listen", "127.0.0.1:0", "--state-dir", state,
                "--sync-interval-s", "0"});
  auto stub = online_stub(online.endpoint());
  wire::OnlineStatsResponse before = online_stats(*stub);
  ASSERT_EQ(before.tables_size(), 1);
  EXPECT_EQ(before.tables(0).rows(), 500);
  EXPECT_GT(before.tables(0).version(), 0);
  EXPECT_EQ(before.versions_behind(), 1);  // the killed delta was not applied
  {
    grpc::ClientContext c;
    wire::SyncResponse r;
    ASSERT_TRUE(stub->Sync(&c, wire::SyncRequest(), &r).ok());
    EXPECT_EQ(r.stats().full_resyncs(), 0);  // no full copy after the restart
    EXPECT_EQ(r.stats().delta_rows(), 100);
    EXPECT_EQ(r.stats().versions_behind(), 0);
  }
  // Every row equals the training side's.
  grpc::ClientContext c;
  wire::LookupRequest q;
  q.set_table("user");
  for (uint64_t id : ids) q.add_ids(id);
  wire::LookupResponse lr;
  ASSERT_TRUE(stub->Lookup(&c, q, &lr).ok());
  const ps::PulledRows want = client.pull("user", reinterpret_cast<const int64_t*>(ids.data()), 500, ps::MissingRow::ReadDefault);
  ASSERT_EQ(lr.values().size(), 500u * 4 * 4);
  EXPECT_EQ(std::memcmp(lr.values().data(), want.rows.contiguous().data_ptr<float>(), lr.values().size()), 0);
}

std::string ctr_config(const std::string& ckpt_dir, const std::string& endpoint) {
  return "[model]\ntype='ctr'\nembedding_dim=8\nbottom=[16]\ntop=[16]\nbag_mode='mean'\n"
         "[data]\nkind='synthetic_ctr'\ncardinalities=[5000, 500, 50]\nbag_min=[1, 1, 1]\nbag_max=[1, 3, 2]\n"
         "num_dense=3\ntrain_samples=8000\neval_samples=1000\nclick_rate=0.3\nweight_scale=1.5\ndrift=0.3\n"
         "[ps]\nlr=0.1\nendpoints='" + endpoint + "'\n"
         "[optim]\nname='adamw'\nlr=0.01\nweight_decay=0.0\nschedule='constant'\n"
         "[train]\nbatch_size=128\nsteps=40\neval_every=40\nlog_every=1000\nthreads=1\ncheckpoint_every=20\n"
         "keep_checkpoints=3\ncheckpoint_dir='" + ckpt_dir + "'\n";
}

TEST(PsOnline, PredictMatchesTheTrainersEvaluationAfterASync) {
  TempDir dir("ps-online-predict");
  testing::ServerProcess training;
  training.start({"--listen", "127.0.0.1:0", "--shard", "0/1", "--snapshot-dir", (dir.path / "snap").string(), "--evict", "importance", "--keep-fraction", "0.8",
                  "--evict-every", "20"});
  const std::string run = (dir.path / "run").string();
  const std::string cfg = dir.write("ctr.toml", ctr_config(run, training.endpoint()));
  train::TrainOptions to;
  to.config_path = cfg;
  to.json = true;
  train::run_training(to);
  // The trainer's own evaluation: its model from the latest checkpoint, rows from the training shard.
  train::Setup setup = train::build_setup(train::load_config(cfg, {}));
  train::restore_weights(train::load_checkpoint(run), setup.model->named_parameters(), setup.model->named_buffers());
  std::vector<int64_t> idx(256);
  std::iota(idx.begin(), idx.end(), 0);
  const data::Batch batch = setup.eval_set->get(idx);
  const models::EvalStats ev = setup.model->evaluate(batch);
  // The online server follows the training shard, loads the same checkpoint, syncs, predicts.
  ps::OnlineOptions o;
  o.follow = {training.endpoint()};
  o.sync_interval_s = 0;
  o.model_config = cfg;
  o.checkpoint_dir = run;
  OnlineServer online(o);
  online.sync_now();
  wire::PredictRequest q;
  q.set_rows(256);
  const at::Tensor dense = batch.input.tensor().to(at::kFloat).contiguous();
  q.set_dense(std::string(reinterpret_cast<const char*>(dense.data_ptr<float>()), static_cast<size_t>(dense.numel()) * 4));
  for (const data::SparseBag& bag : batch.sparse) {
    wire::FieldBag* f = q.add_fields();
    const at::Tensor ids = bag.ids.contiguous(), off = bag.offsets.contiguous();
    for (int64_t i = 0; i < ids.numel(); ++i) f->add_ids(static_cast<uint64_t>(ids.data_ptr<int64_t>()[i]));
    for (int64_t i = 0; i < off.numel(); ++i) f->add_offsets(off.data_ptr<int64_t>()[i]);
  }
  wire::PredictResponse r;
  ASSERT_TRUE(online.predict(q, &r).ok());
  EXPECT_EQ(r.checkpoint_step(), 40);
  ASSERT_EQ(r.probabilities_size(), 256);
  ASSERT_EQ(ev.scores.size(), 256u);
  double max_diff = 0;
  for (int i = 0; i < 256; ++i) max_diff = std::max(max_diff, std::fabs(static_cast<double>(r.probabilities(i)) - ev.scores[static_cast<size_t>(i)]));
  EXPECT_LT(max_diff, 1e-6);
  // Eviction ran on the training shard (rounds at steps 20 and 40) and its tombstones reached the mirror.
  wire::OnlineStatsResponse st;
  ASSERT_TRUE(online.stats(&st).ok());
  int64_t disabled = 0;
  for (const auto& t : st.tables()) disabled += t.disabled();
  EXPECT_GT(disabled, 0);
}

// Deltas read the change log, not every slot: after the first GetDelta turns the log on, a delta from a
// settled version holds exactly the rows pushed since (values as the table holds them), however many
// times they were pushed (the log compacts, its bytes stay bounded), and a paged walk whose log is
// compacted between pages still delivers every changed row.
TEST(PsOnline, DeltasReadOnlyTheChangedRowsFromTheChangeLog) {
  ps::ShardCore core({0, 1}, "");
  ps::Table& t = core.store().ensure_table(table_opts("user", 4));
  std::vector<uint64_t> ids(20000);
  std::iota(ids.begin(), ids.end(), 1);
  push_some(t, ids, 1);
  EXPECT_FALSE(t.change_log_enabled());
  EXPECT_EQ(t.bytes().log_bytes, 0);
  ps::OnlineOptions o;
  o.sync_interval_s = 0;
  OnlineServer online(o, sources_of(core));
  EXPECT_TRUE(online.sync_now().full);
  EXPECT_TRUE(t.change_log_enabled());
  const int64_t v0 = t.settled_version();
  std::vector<uint64_t> changed;
  for (uint64_t id = 7; id <= 20000; id += 400) changed.push_back(id);  // 50 rows
  for (int64_t step = 2; step < 200; ++step) push_some(t, changed, step, 0.01f * static_cast<float>(step % 5 + 1));
  EXPECT_GT(t.bytes().log_bytes, 0);
  ps::ExportCursor cur;
  ps::ExportedRows rows;
  while (!cur.done) t.export_changed(v0, cur, 1 << 20, rows);
  std::vector<uint64_t> got = rows.ids;
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, changed);
  for (int64_t i = 0; i < rows.size(); ++i) {
    const std::vector<float> want = training_row(t, rows.ids[static_cast<size_t>(i)]);
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(rows.values[static_cast<size_t>(i * 4 + k)], want[static_cast<size_t>(k)]);
    EXPECT_GT(rows.infos[static_cast<size_t>(i)].version, v0);
  }
  EXPECT_FALSE(online.sync_now().full);
  // Paged, 3 rows a page up to a pinned version, with pushes of every other row between the pages (the
  // log compacts under the walk): every row changed up to the pinned version arrives, and the walk ends.
  const int64_t v1 = t.settled_version();
  std::vector<uint64_t> more(changed.begin(), changed.begin() + 20);
  push_some(t, more, 300);
  const int64_t v_to = t.settled_version();
  std::vector<uint64_t> others;
  for (uint64_t id : ids)
    if (!std::binary_search(changed.begin(), changed.end(), id)) others.push_back(id);
  ps::ExportCursor pc;
  std::set<uint64_t> seen;
  int64_t pages = 0;
  while (!pc.done && pages < 1000) {
    ps::ExportedRows page;
    t.export_changed(v1, pc, 3, page, v_to);
    seen.insert(page.ids.begin(), page.ids.end());
    push_some(t, others, 301 + pages);
    ++pages;
  }
  EXPECT_TRUE(pc.done);
  EXPECT_GE(pages, 7);
  EXPECT_EQ(seen, std::set<uint64_t>(more.begin(), more.end()));
  // ~20 pages * 20 000 row changes went into the log; it holds about one entry per row (compacted).
  EXPECT_LE(t.bytes().log_bytes, 16 * (2 * 20000 + 16 * 257) * 2);
  // The mirror follows: its next sync is incremental and equal to the table afterwards.
  const ps::SyncReport r = online.sync_now();
  EXPECT_FALSE(r.full);
  for (uint64_t id : changed) ASSERT_EQ(online_row(online.store(), "user", id), training_row(t, id)) << id;
  for (uint64_t id = 1000; id < 3000; id += 97) ASSERT_EQ(online_row(online.store(), "user", id), training_row(t, id)) << id;
}

// The online server follows the training server's who-may-call rules (the same code, ps/server.h):
// loopback by default; elsewhere a token and/or TLS; a missing or wrong token is refused and counted.
TEST(PsOnline, NonLoopbackNeedsTokenOrTlsAndWrongTokensAreRefusedAndCounted) {
  ps::ShardCore core({0, 1}, "");
  core.store().ensure_table(table_opts("user", 4));
  TempDir dir("online-auth");
  ps::OnlineOptions o;
  o.sync_interval_s = 0;
  o.listen = "0.0.0.0:0";
  EXPECT_NE(testing::error_of([&] { OnlineServer s(o, sources_of(core)); }).find("is not a loopback address"),
            std::string::npos);
  o.auth_token_file = dir.write_secret("short", "abc\n");
  EXPECT_NE(testing::error_of([&] { OnlineServer s(o, sources_of(core)); }).find("at least 16 characters"),
            std::string::npos);
  o.auth_token_file.clear();
  o.tls_cert = "cert.pem";  // without its key
  EXPECT_NE(testing::error_of([&] { OnlineServer s(o, sources_of(core)); }).find("--tls-cert and --tls-key must be given together"),
            std::string::npos);
  o.tls_cert.clear();
  o.auth_token_file = dir.write_secret("token", "online-token-0123456789\n");
  OnlineServer online(o, sources_of(core));
  online.sync_now();
  auto stub = online_stub("127.0.0.1:" + std::to_string(online.port()));
  wire::LookupRequest q;
  q.set_table("user");
  q.add_ids(5);
  for (const std::string& token : {std::string(), std::string("online-token-0123456780")}) {
    grpc::ClientContext c;
    if (!token.empty()) c.AddMetadata("authorization", "Bearer " + token);
    wire::LookupResponse r;
    EXPECT_EQ(stub->Lookup(&c, q, &r).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext c;
  c.AddMetadata("authorization", "Bearer online-token-0123456789");
  wire::LookupResponse r;
  ASSERT_TRUE(stub->Lookup(&c, q, &r).ok());
  EXPECT_EQ(r.dim(), 4);
  EXPECT_EQ(online.auth_failures(), 2);
  wire::OnlineStatsResponse st;
  ASSERT_TRUE(online.stats(&st).ok());
  EXPECT_EQ(st.auth_failures(), 2);
}

TEST(PsOnline, TlsLookupNeedsTheRightCa) {
  ps::ShardCore core({0, 1}, "");
  ps::Table& t = core.store().ensure_table(table_opts("user", 4));
  std::vector<uint64_t> ids = {5, 6};
  push_some(t, ids, 1);
  TempDir dir("online-tls");
  testing::make_certificates(dir.path.string());
  ps::OnlineOptions o;
  o.sync_interval_s = 0;
  o.listen = "0.0.0.0:0";  // all interfaces: allowed because it serves mutual TLS
  o.tls_cert = (dir.path / "server.pem").string();
  o.tls_key = (dir.path / "server.key").string();
  // Server-only TLS is refused off loopback (issue 42, item 1): it would let in anyone trusting the CA.
  EXPECT_NE(testing::error_of([&] { OnlineServer s(o, sources_of(core)); }).find("do not authenticate clients"),
            std::string::npos);
  o.tls_ca = (dir.path / "ca.pem").string();
  OnlineServer online(o, sources_of(core));
  online.sync_now();
  const std::string ep = "127.0.0.1:" + std::to_string(online.port());
  wire::LookupRequest q;
  q.set_table("user");
  q.add_ids(5);
  auto lookup = [&](std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto stub = wire::OnlineParameterServer::NewStub(grpc::CreateChannel(ep, creds));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
    wire::LookupResponse r;
    const grpc::Status s = stub->Lookup(&c, q, &r);
    return std::make_pair(s.ok(), r);
  };
  EXPECT_FALSE(lookup(grpc::InsecureChannelCredentials()).first);
  auto tls = [&](const std::string& ca, const std::string& client) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = testing::read_file(dir.path / ca);
    if (!client.empty()) {
      ssl.pem_cert_chain = testing::read_file(dir.path / (client + ".pem"));
      ssl.pem_private_key = testing::read_file(dir.path / (client + ".key"));
    }
    return grpc::SslCredentials(ssl);
  };
  EXPECT_FALSE(lookup(tls("other-ca.pem", "client")).first);
  EXPECT_FALSE(lookup(tls("ca.pem", "")).first);       // no client certificate
  EXPECT_FALSE(lookup(tls("ca.pem", "rogue")).first);  // one another CA signed
  const auto [ok, r] = lookup(tls("ca.pem", "client"));
  ASSERT_TRUE(ok);
  std::vector<float> got(4);
  std::memcpy(got.data(), r.values().data(), 16);
  EXPECT_EQ(got, training_row(t, 5));
}

// Item 3 (issue 42): the follower reaches a TLS training shard with TLS — here one that also requires a
// client certificate and a token — and copies its rows; without --follow-tls-ca it cannot (the shard
// speaks only TLS). The token goes only over TLS or to loopback: a non-loopback shard without TLS is
// refused before any connection.
TEST(PsOnline, FollowsATlsTrainingShardAndSendsTheTokenOnlyOverTlsOrLoopback) {
  TempDir dir("online-follow-tls");
  testing::make_certificates(dir.path.string());
  const auto pem = [&](const char* name) { return (dir.path / name).string(); };
  ps::ServeOptions so;
  so.listen = "127.0.0.1:0";
  so.tls_cert = pem("server.pem");
  so.tls_key = pem("server.key");
  so.tls_ca = pem("ca.pem");
  so.auth_token_file = dir.write_secret("token", "follow-token-0123456789\n");
  ps::PsServer training(so);
  ps::Table& t = training.core().store().ensure_table(table_opts("user", 4));
  const std::vector<uint64_t> ids = {5, 6, 7};
  push_some(t, ids, 1);
  ps::OnlineOptions o;
  o.sync_interval_s = 0;
  o.follow = {"127.0.0.1:" + std::to_string(training.port())};
  o.auth_token_file = so.auth_token_file;
  {
    OnlineServer plain(o);  // plaintext to a TLS shard: the sync fails, nothing copied
    EXPECT_THROW(plain.sync_now(), Error);
  }
  o.follow_tls_ca = pem("ca.pem");
  o.follow_tls_cert = pem("client.pem");
  o.follow_tls_key = pem("client.key");
  OnlineServer online(o);
  online.sync_now();
  for (uint64_t id : ids) EXPECT_EQ(online_row(online.store(), "user", id), training_row(t, id)) << id;
  EXPECT_EQ(training.core().auth_failures(), 0);
  // The token never goes in clear off loopback; a client certificate needs the CA.
  ps::OnlineOptions far = o;
  far.follow = {"10.0.0.1:7070"};
  far.follow_tls_ca.clear();
  far.follow_tls_cert.clear();
  far.follow_tls_key.clear();
  std::string msg = testing::error_of([&] { far.validate(); });
  EXPECT_NE(msg.find("--follow 10.0.0.1:7070 is not a loopback address and --follow-tls-ca is not given"),
            std::string::npos) << msg;
  far.follow_tls_cert = pem("client.pem");
  far.follow_tls_key = pem("client.key");
  msg = testing::error_of([&] { far.validate(); });
  EXPECT_NE(msg.find("need --follow-tls-ca"), std::string::npos) << msg;
  far.follow_tls_ca = pem("ca.pem");
  far.validate();  // TLS: the token may go to another machine
}

TEST(PsOnline, BadFlagsNameTheFlag) {
  ps::OnlineOptions o;
  o.sync_interval_s = -1;
  EXPECT_NE(testing::error_of([&] { o.validate(); }).find("--sync-interval-s must be >= 0"), std::string::npos);
  o.sync_interval_s = 1;
  o.model_config = "x.toml";
  EXPECT_NE(testing::error_of([&] { o.validate(); }).find("--model-config and --checkpoint-dir go together"),
            std::string::npos);
  o.model_config.clear();
  EXPECT_NE(testing::error_of([&] { OnlineServer s(o); }).find("needs --follow"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { ps::OnlineStore s(0, ""); }).find("at least one training shard"), std::string::npos);
}

}  // namespace
}  // namespace ration
