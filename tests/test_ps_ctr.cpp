// The ctr model with parameter-server embeddings: whole-model gradients (dense parameters and every
// field's pulled rows) vs libtorch autograd; synthetic click data (deterministic, click rate, Zipf skew,
// drift, AUC); training learns and reports ps.* and eval.auc; embedded and two real server processes
// give identical runs (and, after 50 steps, bitwise the same dense parameters and every row); the next
// batch's pull overlapped with the step (prefetch, re-pulling the rows the step pushed right after the
// push or when collected) gives bitwise the parameters of synchronous pulls, embedded and over two servers; kill -9
// of the trainer or of a server, then restart and resume, continues the uninterrupted run's loss curve
// exactly; a server restarted from an older snapshot inside the trainer's retry window stops the trainer.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "ration/base/check.h"
#include "ration/config/config.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/models/ctr.h"
#include "ration/optim/adamw.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"
#include "test_ps_util.h"
#include "test_util.h"
#include "train_util.h"

namespace ration {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

data::CtrSyntheticOptions small_data() {
  data::CtrSyntheticOptions o;
  o.cardinalities = {50, 20, 10};
  o.bag_min = {1, 0, 1};
  o.bag_max = {1, 3, 4};
  o.num_dense = 3;
  o.train_samples = 64;
  o.eval_samples = 16;
  return o;
}

// The trainer can match a server started with a small --max-ids: ps.max_ids_per_request reaches the client.
TEST(PsCtr, MaxIdsPerRequestKeyReachesTheClient) {
  Config cfg = Config::from_string("[ps]\nmax_ids_per_request = 64\n", "ctr.toml");
  EXPECT_EQ(models::CtrOptions::from_config(cfg).client.max_ids_per_request, 64);
  Config bad = Config::from_string("[ps]\nmax_ids_per_request = 0\n", "ctr.toml");
  try {
    (void)models::CtrOptions::from_config(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ctr.toml: ps.max_ids_per_request must be an integer >= 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(PsCtr, WholeModelGradientsMatchLibtorch) {
  models::CtrOptions o;
  o.num_dense = 3;
  o.num_fields = 3;
  o.embedding_dim = 4;
  o.bottom = {5};
  o.top = {6};
  o.bag_mode = ops::EmbeddingBagMode::Mean;
  o.table.init_scale = 0.5f;
  // The dense layers' initial values come from ATen's default generator, which libtorch seeds from system
  // entropy in every process (and a --gtest_repeat run carries on from the last draw): without a seed,
  // about 1 draw in 230 leaves every unit of top.0 inactive on all 8 samples, no gradient reaches the
  // rows (nor anything below top.1), and the comparison below is zeros against zeros.
  at::manual_seed(11);
  models::Ctr model(o);
  model.to(at::TensorOptions().dtype(at::kDouble));
  data::CtrSynthetic ds(small_data(), data::CtrSynthetic::Split::Train);
  const data::Batch batch = ds.get({0, 1, 2, 3, 4, 5, 6, 7});
  const Value dense(batch.input.tensor().to(at::kDouble));
  const Value labels = batch.target;

  std::vector<models::FieldRows> fields = model.lookup(batch, ps::MissingRow::Create);
  ASSERT_EQ(fields.size(), 3u);
  models::binary_cross_entropy_with_logits(model.logits(dense, fields), labels).backward();
  std::vector<at::Tensor> engine;
  for (auto& p : model.parameters()) engine.push_back(p.grad().clone());
  for (auto& f : fields) {
    ASSERT_TRUE(f.rows.grad().is_sparse());
    engine.push_back(f.rows.grad().to_dense());
  }
  for (auto& p : model.parameters()) p.grad() = at::Tensor();

  std::vector<models::FieldRows> again = fields;
  std::vector<Value> leaves = model.parameters();
  for (auto& f : again) {
    f.rows = Value(f.rows.tensor().clone(), true);
    leaves.push_back(f.rows);
  }
  {
    OracleScope oracle(leaves);
    models::binary_cross_entropy_with_logits(model.logits(dense, again), labels).backward();
  }
  ASSERT_EQ(engine.size(), leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    ASSERT_TRUE(leaves[i].grad().defined()) << i;
    const at::Tensor oracle = leaves[i].grad();
    const double scale = std::max(1.0, oracle.abs().max().item<double>());
    EXPECT_LE((engine[i] - oracle).abs().max().item<double>() / scale, 1e-10) << "leaf " << i;
  }
  // Every leaf's gradient is not zero: the comparison checked something (the bags really read several rows
  // per sample, multi-hot, and the sums of row gradients are not zero).
  for (size_t i = 0; i < engine.size(); ++i) EXPECT_GT(engine[i].abs().sum().item<double>(), 0) << "leaf " << i;
}

TEST(PsCtr, SyntheticClicksAreDeterministicSkewedAndLearnable) {
  data::CtrSyntheticOptions o;
  o.cardinalities = {10000000, 1000};
  o.bag_min = {1, 2};
  o.bag_max = {1, 5};
  o.num_dense = 2;
  o.train_samples = 20000;
  o.eval_samples = 4000;
  o.click_rate = 0.2;
  data::CtrSynthetic a(o, data::CtrSynthetic::Split::Train), b(o, data::CtrSynthetic::Split::Train);
  std::vector<int64_t> idx(4000);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i) * 5;
  const data::Batch x = a.get(idx), y = b.get(idx);
  EXPECT_TRUE(at::equal(x.sparse[0].ids, y.sparse[0].ids));
  EXPECT_TRUE(at::equal(x.target.tensor(), y.target.tensor()));
  // Click rate close to the request; ids within the cardinality; bag sizes within bounds.
  EXPECT_NEAR(x.target.tensor().to(at::kDouble).mean().item<double>(), 0.2, 0.025);
  EXPECT_LT(x.sparse[0].ids.max().item<int64_t>(), 10000000);
  EXPECT_GE(x.sparse[0].ids.min().item<int64_t>(), 0);
  const at::Tensor sizes = at::cat({x.sparse[1].offsets.slice(0, 1), at::full({1}, x.sparse[1].ids.size(0), at::kLong)}) -
                           x.sparse[1].offsets;
  EXPECT_GE(sizes.min().item<int64_t>(), 2);
  EXPECT_LE(sizes.max().item<int64_t>(), 5);
  // Zipf: the most frequent id of the 10^7 field takes a visible share; ids are scattered (not 0, 1, ...).
  auto [uniq, inv, counts] = at::_unique2(x.sparse[0].ids, true, false, true);
  EXPECT_GT(counts.max().item<int64_t>(), 4000 / 50);
  EXPECT_GT(uniq[0].item<int64_t>() + uniq[1].item<int64_t>(), 2);
  // The planted model separates clicks (its own AUC), and a higher weight scale separates them more.
  data::CtrSynthetic ev(o, data::CtrSynthetic::Split::Eval);
  std::vector<float> s, l;
  std::vector<int64_t> all(4000);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  const data::Batch e = ev.get(all);
  for (int64_t i = 0; i < 4000; ++i) {
    s.push_back(static_cast<float>(ev.planted_probability(i)));
    l.push_back(static_cast<float>(e.target.tensor()[i].item<int64_t>()));
  }
  EXPECT_GT(data::roc_auc(s, l), 0.7);
  EXPECT_DOUBLE_EQ(data::roc_auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  // Drift moves the hot set: late samples share fewer top ids with early ones.
  o.drift = 0.5;
  o.cardinalities = {1000, 1000};
  data::CtrSynthetic d(o, data::CtrSynthetic::Split::Train), nd([&] { auto p = o; p.drift = 0; return p; }(),
                                                                   data::CtrSynthetic::Split::Train);
  auto top_id = [](const data::CtrSynthetic& ds, int64_t from) {
    std::vector<int64_t> ix(2000);
    for (size_t i = 0; i < ix.size(); ++i) ix[i] = from + static_cast<int64_t>(i);
    auto [u, iv, c] = at::_unique2(ds.get(ix).sparse[0].ids, true, false, true);
    return u[c.argmax()].item<int64_t>();
  };
  EXPECT_NE(top_id(d, 0), top_id(d, 18000));
  EXPECT_EQ(top_id(nd, 0), top_id(nd, 18000));
}

// `steps` (50) steps of a ctr model over `client` options, through a StepRuntime (the model's own hook pushes),
// each next batch handed to prefetch() first when `prefetch`. Returns the model (parameters, client).
std::unique_ptr<models::Ctr> train_fifty(const ps::ClientOptions& client, bool prefetch,
                                         const data::CtrSynthetic& ds, int64_t steps = 50,
                                         models::RepullTiming repull = models::RepullTiming::AfterPush) {
  models::CtrOptions o;
  o.num_dense = 3;
  o.num_fields = 3;
  o.embedding_dim = 8;
  o.bottom = {16};
  o.top = {16};
  o.bag_mode = ops::EmbeddingBagMode::Mean;
  o.client = client;
  o.prefetch = prefetch;
  o.repull = repull;
  o.table.optimizer.kind = ps::OptimizerKind::Adagrad;
  o.table.optimizer.lr = 0.1f;
  o.table.seed = 7;
  at::manual_seed(11);  // the dense layers' initial values
  manual_seed(11);
  auto model = std::make_unique<models::Ctr>(o);
  optim::AdamWOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0;
  optim::AdamW opt(model->named_parameters(), ao);
  train::StepRuntime runtime;
  auto batch_of = [&](int64_t step) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < 32; ++i) idx.push_back((step * 32 + i) % ds.size());
    return ds.get(idx);
  };
  data::Batch batch = batch_of(0);
  for (int64_t step = 0; step < steps; ++step) {
    data::Batch next;
    if (step + 1 < steps) {
      next = batch_of(step + 1);
      model->prefetch(next);  // a no-op unless o.prefetch
    }
    train::StepOptions so;
    so.step = step;
    so.seed = 5;
    so.optimizer = &opt;
    runtime.run_step(*model, batch, so);
    batch = next;
  }
  return model;
}

TEST(PsCtr, PrefetchedPullsGiveBitwiseTheParametersOfSynchronousPulls) {
  // Small id spaces: consecutive batches share most ids, so every step re-pulls rows the step before
  // pushed while its pull was in flight.
  data::CtrSyntheticOptions d;
  d.cardinalities = {300, 40, 12};
  d.bag_min = {1, 1, 1};
  d.bag_max = {1, 3, 2};
  d.num_dense = 3;
  d.train_samples = 1600;
  d.eval_samples = 16;
  const data::CtrSynthetic ds(d, data::CtrSynthetic::Split::Train);
  ps::ClientOptions embedded;
  embedded.embedded_shards = 2;
  // Two fresh server processes per remote run (a run leaves its rows on the servers).
  std::vector<std::unique_ptr<testing::ServerProcess>> servers;
  auto fresh_pair = [&] {
    ps::ClientOptions remote;
    for (const char* shard : {"0/2", "1/2"}) {
      servers.push_back(std::make_unique<testing::ServerProcess>());
      servers.back()->start({"--listen", "127.0.0.1:0", "--shard", shard});
      remote.endpoints.push_back(servers.back()->endpoint());
    }
    return remote;
  };

  const auto sync = train_fifty(embedded, false, ds);
  const auto overlapped = train_fifty(embedded, true, ds);
  // Remote shards: synchronous pulls, and the prefetch with its re-pull of the pushed rows started on
  // the prefetch's thread right after the push (the default) or made when the step collects it.
  const auto sync_remote = train_fifty(fresh_pair(), false, ds);
  const auto overlapped_remote = train_fifty(fresh_pair(), true, ds);
  const auto collect_remote = train_fifty(fresh_pair(), true, ds, 50, models::RepullTiming::OnCollect);
  const auto untrained = train_fifty(embedded, false, ds, 0);
  // ps.repull = "auto": the re-pull moves off the step's path, embedded and remote (measured faster in both).
  EXPECT_TRUE(train_fifty(embedded, true, ds, 0, models::RepullTiming::Auto)->options.repull ==
              models::RepullTiming::AfterPush);
  EXPECT_TRUE(train_fifty(fresh_pair(), true, ds, 0, models::RepullTiming::Auto)->options.repull ==
              models::RepullTiming::AfterPush);
  EXPECT_EQ(sync->prefetch_counts().used, 0);
  EXPECT_EQ(sync_remote->prefetch_counts().used, 0);
  const std::vector<const models::Ctr*> prefetching = {overlapped.get(), overlapped_remote.get(), collect_remote.get()};
  for (const auto* m : prefetching) {
    EXPECT_EQ(m->prefetch_counts().started, 49);
    EXPECT_EQ(m->prefetch_counts().used, 49);
    EXPECT_EQ(m->prefetch_counts().discarded, 0);
    EXPECT_GT(m->prefetch_counts().rows_repulled, 49 * 10);  // the overlap was real, and handled
    EXPECT_GT(m->prefetch_counts().repull_ms, 0.0);
  }
  // Both timings re-pull exactly the rows that both batches touch: the same count.
  EXPECT_EQ(overlapped_remote->prefetch_counts().rows_repulled, collect_remote->prefetch_counts().rows_repulled);
  EXPECT_EQ(overlapped->prefetch_counts().rows_repulled, collect_remote->prefetch_counts().rows_repulled);
  // Dense parameters, bitwise.
  const auto ref = sync->named_parameters();
  for (auto* m : {sync_remote.get(), overlapped.get(), overlapped_remote.get(), collect_remote.get()}) {
    const auto got = m->named_parameters();
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_TRUE(at::equal(ref[i].second.tensor(), got[i].second.tensor()))
          << ref[i].first << (m->client().embedded() ? " embedded" : " remote") << " prefetch " << m->options.prefetch
          << " repull after push " << (m->options.repull == models::RepullTiming::AfterPush);
  }
  // Every row of every field, bitwise (read-only pulls of the whole id space).
  for (int64_t f = 0; f < 3; ++f) {
    std::vector<int64_t> all(static_cast<size_t>(d.cardinalities[static_cast<size_t>(f)]));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    const auto n = static_cast<int64_t>(all.size());
    const at::Tensor want = sync->client().pull(sync->table_name(f), all.data(), n, ps::MissingRow::ReadDefault).rows;
    for (auto* m : {sync_remote.get(), overlapped.get(), overlapped_remote.get(), collect_remote.get()})
      EXPECT_TRUE(at::equal(want, m->client().pull(m->table_name(f), all.data(), n, ps::MissingRow::ReadDefault).rows))
          << "field " << f << (m->client().embedded() ? " embedded" : " remote") << " prefetch "
          << m->options.prefetch << " repull after push " << (m->options.repull == models::RepullTiming::AfterPush);
    // The rows did train: they are not all their first-touch values.
    EXPECT_FALSE(at::equal(want, untrained->client().pull(untrained->table_name(f), all.data(), n,
                                                          ps::MissingRow::ReadDefault).rows));
  }
  for (auto& s : servers) EXPECT_EQ(s->stop(SIGTERM), 0);
}

std::string ctr_config(const std::string& ckpt_dir, const std::string& extra = "") {
  return "[model]\ntype='ctr'\nembedding_dim=8\nbottom=[16]\ntop=[16]\nbag_mode='mean'\n"
         "[data]\nkind='synthetic_ctr'\ncardinalities=[20000, 2000, 200]\nbag_min=[1, 1, 1]\nbag_max=[1, 3, 2]\n"
         "num_dense=3\ntrain_samples=20000\neval_samples=2000\nclick_rate=0.3\nweight_scale=1.5\n"
         "[ps]\nshards=2\nlr=0.1\n" + extra +
         "[optim]\nname='adamw'\nlr=0.01\nweight_decay=0.0\nschedule='constant'\n"
         "[train]\nbatch_size=128\nsteps=60\neval_every=30\nlog_every=1000\nthreads=1\ncheckpoint_every=10\n"
         "keep_checkpoints=10\ncheckpoint_dir='" + ckpt_dir + "'\n";
}

using testing::train_json;

TEST(PsCtr, TrainingLearnsAndReportsAucAndPsFigures) {
  TempDir dir("ps-ctr-train");
  const auto r = train_json(dir.write("ctr.toml", ctr_config((dir.path / "run").string())));
  ASSERT_EQ(r["eval"].size(), 2u);
  const auto& last = r["eval"].back();
  EXPECT_GT(last["auc"].get<double>(), 0.65);
  EXPECT_GT(last["planted_auc"].get<double>(), last["auc"].get<double>() - 0.01);
  EXPECT_LT(last["logloss"].get<double>(), r["eval"][0]["logloss"].get<double>() + 0.01);
  EXPECT_GT(r["ps"]["rows"].get<double>(), 1000);
  EXPECT_GT(r["ps"]["bytes"].get<double>(), r["ps"]["rows"].get<double>() * 8 * 4 * 2);
  EXPECT_GE(r["ps"]["pull_ms"].get<double>(), 0);
  EXPECT_GT(r["ps"]["rows_pushed"].get<double>(), 0);
  EXPECT_TRUE(fs::exists(dir.path / "run" / "ps" / "shard-0-of-2" / "v60"));
}

// One epoch over 40 000 synthetic samples whose ids recur often enough to be learned (fields of 500, 100
// and 20 ids): the model's eval AUC comes within 0.02 of the planted model's own (measured: 0.8277 vs
// 0.8346; BENCHMARKS.md, "ctr on synthetic clicks vs the planted model", for the full-size run and its data-limited ceiling).
TEST(PsCtr, SyntheticAucComesWithinTwoHundredthsOfThePlantedModel) {
  TempDir dir("ps-ctr-planted");
  const std::string cfg = dir.write(
      "ctr.toml",
      "[model]\ntype='ctr'\nembedding_dim=8\nbottom=[16]\ntop=[32, 16]\nbag_mode='mean'\n"
      "[data]\nkind='synthetic_ctr'\ncardinalities=[500, 100, 20]\nbag_min=[1, 1, 1]\nbag_max=[1, 3, 2]\n"
      "num_dense=3\ntrain_samples=40000\neval_samples=4000\nclick_rate=0.3\n"
      "[ps]\nshards=1\nlr=0.05\n"
      "[optim]\nname='adamw'\nlr=0.005\nweight_decay=0.0\nschedule='constant'\n"
      "[train]\nbatch_size=128\nepochs=1\neval_every=0\nthreads=1\nseed=0\ncheckpoint_dir=''\n");
  const auto r = train_json(cfg);
  const auto& last = r["eval"].back();
  const double auc = last["auc"].get<double>(), planted = last["planted_auc"].get<double>();
  EXPECT_GT(planted, 0.8);
  EXPECT_GE(auc, planted - 0.02) << "ctr AUC " << auc << " vs planted " << planted;
  EXPECT_LE(auc, planted + 0.005);  // a learned model cannot beat the truth by more than noise
}

TEST(PsCtr, EmbeddedAndTwoServerProcessesTrainIdentically) {
  TempDir dir("ps-ctr-remote");
  const std::string cfg = dir.write("ctr.toml", ctr_config(""));
  const std::vector<std::string> fifty = {"train.steps=50", "train.eval_every=50"};
  const auto embedded = train_json(cfg, fifty);
  testing::ServerProcess s0, s1;
  s0.start({"--listen", "127.0.0.1:0", "--shard", "0/2"});
  s1.start({"--listen", "127.0.0.1:0", "--shard", "1/2"});
  auto remote_over = fifty;
  remote_over.push_back("ps.endpoints=" + s0.endpoint() + "," + s1.endpoint());
  const auto remote = train_json(cfg, remote_over);
  ASSERT_EQ(embedded["loss"].size(), 50u);
  ASSERT_EQ(remote["loss"].size(), 50u);
  for (size_t i = 0; i < 50; ++i) ASSERT_EQ(embedded["loss"][i].get<double>(), remote["loss"][i].get<double>()) << i;
  EXPECT_EQ(embedded["eval"].back()["logloss"].get<double>(), remote["eval"].back()["logloss"].get<double>());
  EXPECT_EQ(embedded["eval"].back()["auc"].get<double>(), remote["eval"].back()["auc"].get<double>());
  EXPECT_EQ(embedded["ps"]["rows"].get<double>(), remote["ps"]["rows"].get<double>());
  EXPECT_EQ(remote["ps"]["embedded"].get<double>(), 0.0);
  EXPECT_EQ(s0.stop(SIGTERM), 0);
  EXPECT_EQ(s1.stop(SIGTERM), 0);
}

// Waits until `path` exists (or the timeout passes).
bool wait_for(const fs::path& path, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(PsCtr, KillNineTrainerThenResumeContinuesTheCurve) {
  TempDir dir("ps-ctr-kill-trainer");
  const std::string cfg = dir.write("ctr.toml", ctr_config((dir.path / "ref").string()));
  const auto reference = train_json(cfg);
  const std::string run = (dir.path / "run").string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string bin = testing::ration_binary();
    const std::string set = "train.checkpoint_dir=" + run;
    ::execl(bin.c_str(), bin.c_str(), "train", cfg.c_str(), "--set", set.c_str(), "--json",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_TRUE(wait_for(fs::path(run) / "ckpt-20", 120));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the trainer finished before it was killed";
  const auto resumed = train_json(cfg, {"train.checkpoint_dir=" + (dir.path / "run2").string()}, run);
  const int64_t first = resumed["first_step"].get<int64_t>();
  EXPECT_GE(first, 10);  // ckpt-20 may exist before `latest` names it: the resume takes the newest complete one
  ASSERT_EQ(resumed["loss"].size(), static_cast<size_t>(60 - first));
  for (int64_t i = first; i < 60; ++i)
    ASSERT_EQ(resumed["loss"][static_cast<size_t>(i - first)].get<double>(),
              reference["loss"][static_cast<size_t>(i)].get<double>())
        << "step " << i;
  EXPECT_EQ(resumed["eval"].back()["auc"].get<double>(), reference["eval"].back()["auc"].get<double>());
}

TEST(PsCtr, KillNineServerThenRestartAndResumeContinuesTheCurve) {
  TempDir dir("ps-ctr-kill-server");
  const std::string cfg = dir.write("ctr.toml", ctr_config((dir.path / "ref").string()));
  const auto reference = train_json(cfg, {"ps.shards=1"});
  const std::string snap = (dir.path / "snap").string();
  const std::string run = (dir.path / "run").string();
  testing::ServerProcess server;
  server.start({"--listen", "127.0.0.1:0", "--shard", "0/1", "--snapshot-dir", snap});
  const std::string endpoint = server.endpoint();
  std::thread killer([&] {
    if (wait_for(fs::path(run) / "ckpt-30", 120)) server.stop(SIGKILL);
  });
  const std::string msg = testing::error_of([&] {
    train_json(cfg, {"ps.shards=1", "ps.endpoints=" + endpoint, "ps.retries=2", "ps.timeout_ms=2000",
                     "train.checkpoint_dir=" + run});
  });
  killer.join();
  ASSERT_NE(msg.find("at " + endpoint), std::string::npos) << "training did not fail naming the server: " << msg;
  // Restart on a new port with the same snapshot directory; resume from the newest checkpoint.
  testing::ServerProcess again;
  again.start({"--listen", "127.0.0.1:0", "--shard", "0/1", "--snapshot-dir", snap});
  const auto resumed = train_json(cfg, {"ps.shards=1", "ps.endpoints=" + again.endpoint(),
                                        "train.checkpoint_dir=" + (dir.path / "run2").string()},
                                  run);
  const int64_t first = resumed["first_step"].get<int64_t>();
  EXPECT_GE(first, 30);
  for (int64_t i = first; i < 60; ++i)
    ASSERT_EQ(resumed["loss"][static_cast<size_t>(i - first)].get<double>(),
              reference["loss"][static_cast<size_t>(i)].get<double>())
        << "step " << i;
}

// Issue 42, item 8: a server killed and restarted from its last snapshot on the same address, inside the
// trainer's retry window (ps.retries=8: about 25 s of back-off), is not trained against. Before, the
// trainer went on with embeddings rolled back to the snapshot and exited 0; now it stops naming the shard
// and the restart.
TEST(PsCtr, ServerRestartedInsideTheRetryWindowStopsTheTrainer) {
  TempDir dir("ps-ctr-restart");
  const std::string cfg = dir.write("ctr.toml", ctr_config(""));
  const std::string snap = (dir.path / "snap").string();
  const std::string run = (dir.path / "run").string();
  testing::ServerProcess server;
  server.start({"--listen", "127.0.0.1:0", "--shard", "0/1", "--snapshot-dir", snap});
  const std::string endpoint = server.endpoint();
  testing::ServerProcess again;
  std::thread restarter([&] {
    if (!wait_for(fs::path(run) / "ckpt-20", 120)) return;
    server.stop(SIGKILL);
    again.start({"--listen", endpoint, "--shard", "0/1", "--snapshot-dir", snap});
  });
  const std::string msg = testing::error_of([&] {
    train_json(cfg, {"ps.shards=1", "ps.endpoints=" + endpoint, "ps.retries=8", "train.steps=150",
                     "train.eval_every=0", "train.checkpoint_dir=" + run});
  });
  restarter.join();
  ASSERT_GT(again.pid, 0) << "the server was not restarted (no ckpt-20?): " << msg;
  EXPECT_NE(msg.find("parameter server shard 0/1 at " + endpoint), std::string::npos) << msg;
  EXPECT_NE(msg.find("restarted while this client trained against it"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ration
