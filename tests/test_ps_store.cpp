// Embedding store: deterministic first touch (also when threads race to create the same rows), the
// optimisers against libtorch's torch::optim on the same rows, thread safety (no lost updates), freed rows
// reused and memory returned by compact, accounted bytes, export/assign, and RocksDB snapshots (round
// trip, malformed snapshot refused, store untouched).
#include <gtest/gtest.h>
#include <torch/optim.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "ration/base/check.h"
#include "ration/ps/snapshot.h"
#include "ration/ps/store.h"
#include "test_util.h"

namespace ration::ps {
namespace {
using ration::testing::error_of;

TableOptions opts(const std::string& name, int64_t dim, OptimizerKind kind, float lr = 0.1f, uint64_t seed = 7) {
  TableOptions o;
  o.name = name;
  o.dim = dim;
  o.seed = seed;
  o.init_scale = 0.5f;
  o.optimizer.kind = kind;
  o.optimizer.lr = lr;
  return o;
}

std::vector<float> pull1(Table& t, uint64_t id, MissingRow m = MissingRow::Create) {
  std::vector<float> out(static_cast<size_t>(t.dim()));
  t.pull(&id, 1, out.data(), m);
  return out;
}

TEST(PsStore, FirstTouchIsDeterministicFromSeedAndId) {
  Table a(opts("a", 8, OptimizerKind::Sgd)), b(opts("b", 8, OptimizerKind::Adagrad));
  Table c(opts("c", 8, OptimizerKind::Sgd, 0.1f, /*seed=*/8));
  // Insertion order does not matter: b sees other ids first.
  for (uint64_t id : {5ULL, 99ULL, 1ULL << 60}) (void)pull1(b, id);
  EXPECT_EQ(pull1(a, 1ULL << 60), pull1(b, 1ULL << 60));
  EXPECT_NE(pull1(a, 3), pull1(c, 3));
  EXPECT_NE(pull1(a, 3), pull1(a, 4));
  for (float v : pull1(a, 12345)) EXPECT_TRUE(v >= -0.5f && v < 0.5f);
  // ReadDefault returns the same value without inserting.
  EXPECT_EQ(pull1(a, 777, MissingRow::ReadDefault), pull1(a, 777));
  EXPECT_FALSE(a.contains(778));
  (void)pull1(a, 778, MissingRow::ReadDefault);
  EXPECT_FALSE(a.contains(778));
}

// Runs `steps` pushes of fixed gradients through the store and through torch::optim on a (2, dim) tensor.
template <typename TorchOpt, typename Options>
void check_against_torch(OptimizerKind kind, Options torch_options, float lr, float tol) {
  const int64_t dim = 5;
  Table t(opts("t", dim, kind, lr));
  std::vector<uint64_t> ids = {11, 42};
  std::vector<float> start(2 * dim);
  t.pull(ids.data(), 2, start.data());
  at::Tensor w = at::tensor(start).view({2, dim}).clone().set_requires_grad(true);
  TorchOpt opt({w}, torch_options);
  for (int step = 0; step < 4; ++step) {
    at::Tensor g = at::randn({2, dim});
    t.push(ids.data(), 2, g.contiguous().data_ptr<float>(), step);
    w.mutable_grad() = g.clone();
    opt.step();
  }
  std::vector<float> got(2 * dim);
  t.pull(ids.data(), 2, got.data());
  const at::Tensor diff = (at::tensor(got).view({2, dim}) - w.detach()).abs().max();
  EXPECT_LE(diff.item<float>(), tol) << optimizer_kind_name(kind);
}

TEST(PsStore, OptimisersMatchTorchOptim) {
  check_against_torch<torch::optim::SGD>(OptimizerKind::Sgd, torch::optim::SGDOptions(0.1), 0.1f, 1e-7f);
  check_against_torch<torch::optim::Adagrad>(OptimizerKind::Adagrad,
                                             torch::optim::AdagradOptions(0.1).eps(1e-8), 0.1f, 1e-6f);
  check_against_torch<torch::optim::Adam>(OptimizerKind::Adam, torch::optim::AdamOptions(0.1).eps(1e-8), 0.1f, 1e-5f);
}

TEST(PsStore, FtrlFirstStepFollowsTheClosedForm) {
  // With l1 = l2 = 0 and z initialised from w0, one FTRL step from w0 with gradient g gives
  // w = -(z + g - sigma w0) / (beta + |g|) * alpha, sigma = |g| / alpha, z = -w0 beta / alpha.
  TableOptions o = opts("f", 3, OptimizerKind::Ftrl);
  Table t(o);
  const uint64_t id = 9;
  const std::vector<float> w0 = pull1(t, id);
  const std::vector<float> g = {0.5f, -2.0f, 0.0f};
  t.push(&id, 1, g.data(), 0);
  const std::vector<float> w = pull1(t, id);
  const float a = o.optimizer.ftrl_alpha, b = o.optimizer.ftrl_beta;
  for (int k = 0; k < 3; ++k) {
    const float z = -w0[k] * b / a + g[k] - std::fabs(g[k]) / a * w0[k];
    EXPECT_NEAR(w[k], -z / ((b + std::fabs(g[k])) / a), 1e-6f);
  }
  EXPECT_NEAR(w[2], w0[2], 1e-7f);  // a zero gradient leaves the weight where it was
}

TEST(PsStore, ConcurrentPushesLoseNoUpdate) {
  // SGD with lr 1 and gradient 1 on overlapping ids: each row ends exactly at w0 - (number of pushes).
  Table t(opts("t", 4, OptimizerKind::Sgd, 1.0f));
  std::vector<uint64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 7919;
  std::vector<float> w0(ids.size() * 4);
  t.pull(ids.data(), static_cast<int64_t>(ids.size()), w0.data());
  std::vector<float> ones(ids.size() * 4, 1.0f);
  auto worker = [&] {
    for (int r = 0; r < 50; ++r) t.push(ids.data(), static_cast<int64_t>(ids.size()), ones.data(), r);
  };
  std::thread a(worker), b(worker);
  std::vector<float> scratch(ids.size() * 4);
  for (int r = 0; r < 50; ++r) t.pull(ids.data(), static_cast<int64_t>(ids.size()), scratch.data());  // readers too
  a.join();
  b.join();
  std::vector<float> w(ids.size() * 4);
  t.pull(ids.data(), static_cast<int64_t>(ids.size()), w.data());
  for (size_t k = 0; k < w.size(); ++k) ASSERT_FLOAT_EQ(w[k], w0[k] - 100.0f) << k;
}

TEST(PsStore, ConcurrentFirstTouchOfTheSameIdsGivesIdenticalRows) {
  // Threads pull the same new ids at the same moment, each batch starting at a different id, so they race
  // to create the rows: every thread reads, for every id, exactly the initial value a table of its own
  // gives it, each id gets one row, and that row holds the same value. Rounds on fresh tables.
  const int64_t dim = 8, n = 2000;
  const int threads = 4;
  Table ref(opts("t", dim, OptimizerKind::Adagrad));
  for (int round = 0; round < 20; ++round) {
    Table t(opts("t", dim, OptimizerKind::Adagrad));
    std::vector<uint64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = mix64(static_cast<uint64_t>(round * n + i));
    std::vector<float> want(static_cast<size_t>(n * dim));
    for (int64_t i = 0; i < n; ++i) ref.initial_value(ids[static_cast<size_t>(i)], want.data() + i * dim);
    std::vector<std::vector<float>> got(threads, std::vector<float>(static_cast<size_t>(n * dim)));
    std::atomic<int> ready{0};
    auto worker = [&](int w) {
      const int64_t first = w * n / threads;
      std::vector<uint64_t> mine(ids.begin() + first, ids.end());
      mine.insert(mine.end(), ids.begin(), ids.begin() + first);
      std::vector<float> out(static_cast<size_t>(n * dim));
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      t.pull(mine.data(), n, out.data(), MissingRow::Create);
      for (int64_t k = 0; k < n; ++k)  // back to the order of `ids`
        std::copy_n(out.data() + k * dim, dim, got[static_cast<size_t>(w)].data() + ((first + k) % n) * dim);
    };
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w) pool.emplace_back(worker, w);
    for (auto& th : pool) th.join();
    for (int w = 0; w < threads; ++w)
      ASSERT_EQ(got[static_cast<size_t>(w)], want) << "round " << round << " thread " << w;
    EXPECT_EQ(t.size(), n) << "round " << round;
    std::vector<float> stored(static_cast<size_t>(n * dim));
    t.pull(ids.data(), n, stored.data(), MissingRow::ReadDefault);
    ASSERT_EQ(stored, want) << "round " << round;
  }
}

TEST(PsStore, FreedRowsAreReusedAndCompactReturnsMemory) {
  Table t(opts("t", 16, OptimizerKind::Adagrad));
  const int64_t n = 100000;
  std::vector<uint64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 1000003ULL;
  std::vector<float> buf(static_cast<size_t>(n) * 16);
  t.pull(ids.data(), n, buf.data());
  const TableBytes full = t.bytes();
  EXPECT_EQ(full.rows, n);
  EXPECT_EQ(full.value_bytes, n * 16 * 4);
  EXPECT_EQ(full.state_bytes, n * 16 * 4);  // Adagrad: one accumulator per value
  EXPECT_GE(full.arena_bytes, n * 32 * 4);
  EXPECT_GT(full.index_bytes, n * 12);
  // Free every other row: the arena keeps its chunks; new ids reuse the freed slots (no growth).
  EXPECT_EQ(t.erase_if([&](const RowInfo& r) { return (r.id / 1000003ULL) % 2 == 0; }), n / 2);
  EXPECT_EQ(t.size(), n / 2);
  EXPECT_FALSE(t.contains(ids[0]));
  EXPECT_TRUE(t.contains(ids[1]));
  std::vector<uint64_t> fresh(static_cast<size_t>(n / 4));
  for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = 0xABCDEF0000000000ULL + i;
  t.pull(fresh.data(), static_cast<int64_t>(fresh.size()), buf.data());
  EXPECT_EQ(t.bytes().arena_bytes, full.arena_bytes) << "freed slots were not reused";
  // Survivors keep their values through compaction; the released chunks leave the accounting.
  std::vector<float> before(16), after(16);
  t.pull(&ids[1], 1, before.data());
  const int64_t released = t.compact();
  const TableBytes small = t.bytes();
  EXPECT_GT(released, 0);
  EXPECT_LT(small.arena_bytes, full.arena_bytes);
  EXPECT_GE(released, full.arena_bytes - small.arena_bytes);
  EXPECT_LT(small.total(), full.total() * 0.85);
  t.pull(&ids[1], 1, after.data());
  EXPECT_EQ(before, after);
  EXPECT_EQ(t.size(), n / 2 + n / 4);
}

// Every live row of a table, by id: (values, state, info) as an export carries them.
struct RowCopy {
  std::vector<float> values, state;
  RowInfo info;
};
std::map<uint64_t, RowCopy> all_rows(const Table& t) {
  std::map<uint64_t, RowCopy> out;
  ExportCursor cur;
  ExportedRows rows;
  while (!cur.done) t.export_batch(cur, 1000, rows);
  const size_t d = static_cast<size_t>(t.dim()), s = static_cast<size_t>(t.state_size());
  for (size_t i = 0; i < rows.ids.size(); ++i) {
    RowCopy c;
    c.values.assign(rows.values.begin() + static_cast<std::ptrdiff_t>(i * d),
                    rows.values.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    c.state.assign(rows.state.begin() + static_cast<std::ptrdiff_t>(i * s),
                   rows.state.begin() + static_cast<std::ptrdiff_t>((i + 1) * s));
    c.info = rows.infos[i];
    out[rows.ids[i]] = c;
  }
  return out;
}

TEST(PsStore, RowRecordKeepsMetadataBesideItsValuesThroughReuseAndCompaction) {
  // Adam at dim 5: 5 values + 11 state floats = 64 bytes after a 32-byte RowInfo: records of 96 bytes.
  // Odd strides are padded to 8: dim 4 gives 4 + 9 floats, 84 bytes, a record of 88.
  for (int64_t dim : {5, 4}) {
    Table t(opts("t", dim, OptimizerKind::Adam));
    const int64_t n = 3000;
    std::vector<uint64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 2654435761ULL + 1;
    std::vector<float> g(static_cast<size_t>(n * dim));
    for (size_t k = 0; k < g.size(); ++k) g[k] = 0.01f * static_cast<float>(k % 17) - 0.05f;
    t.push(ids.data(), n, g.data(), 3);
    t.push(ids.data(), n / 2, g.data(), 4);  // the first half twice
    // Accounting: arena = values + state of every slot; meta = the rest of each record plus a live flag.
    const TableBytes b = t.bytes();
    const int64_t row_bytes = (dim + t.state_size()) * 4;
    ASSERT_EQ(b.arena_bytes % row_bytes, 0);
    const int64_t slots = b.arena_bytes / row_bytes;
    const int64_t record = (32 + row_bytes + 7) / 8 * 8;
    EXPECT_EQ(b.meta_bytes, slots * (record - row_bytes + 1)) << "dim " << dim;
    // Free every third row, then create rows that reuse the freed slots: the new rows start with fresh
    // metadata and their initial values; no survivor's metadata or values change.
    auto before = all_rows(t);
    EXPECT_EQ(t.erase_if([](const RowInfo& r) { return r.id % 3 == 0; }), static_cast<int64_t>(
                  std::count_if(ids.begin(), ids.end(), [](uint64_t id) { return id % 3 == 0; })));
    std::vector<uint64_t> fresh;
    for (uint64_t k = 0; k < 500; ++k) fresh.push_back(0xF00D000000000000ULL + k);
    std::vector<float> buf(fresh.size() * static_cast<size_t>(dim));
    t.pull(fresh.data(), static_cast<int64_t>(fresh.size()), buf.data());
    EXPECT_EQ(t.bytes().arena_bytes, b.arena_bytes) << "freed slots were not reused";
    auto check = [&](const char* when) {
      const auto now = all_rows(t);
      for (const auto& [id, row] : before) {
        if (id % 3 == 0) {
          EXPECT_EQ(now.count(id), 0u) << when;
          continue;
        }
        ASSERT_EQ(now.count(id), 1u) << when << " id " << id;
        const RowCopy& c = now.at(id);
        EXPECT_EQ(c.values, row.values) << when << " id " << id;
        EXPECT_EQ(c.state, row.state) << when << " id " << id;
        EXPECT_EQ(c.info.id, id);
        EXPECT_EQ(c.info.pushes, row.info.pushes) << when;
        EXPECT_EQ(c.info.last_step, row.info.last_step) << when;
        EXPECT_EQ(c.info.first_step, 3) << when;
        EXPECT_EQ(c.info.version, row.info.version) << when;
      }
      std::vector<float> init(static_cast<size_t>(dim));
      for (uint64_t id : fresh) {
        const RowCopy& c = now.at(id);
        t.initial_value(id, init.data());
        EXPECT_EQ(c.values, init) << when;
        EXPECT_EQ(c.info.id, id);
        EXPECT_EQ(c.info.pushes, 0u) << when << ": a reused slot kept a freed row's metadata";
        EXPECT_EQ(c.info.last_step, -1) << when;
        EXPECT_EQ(c.info.first_step, -1) << when;
        EXPECT_EQ(c.info.score, 0.0f) << when;
      }
    };
    check("after reuse");
    // Free most rows and compact: live records move whole (metadata with them) into the kept chunks.
    t.erase_if([](const RowInfo& r) { return r.id % 5 != 1 && r.id < 0xF00D000000000000ULL; });
    for (auto it = before.begin(); it != before.end();)
      it = (it->first % 5 != 1) ? before.erase(it) : std::next(it);
    const int64_t released = t.compact();
    EXPECT_GT(released, 0);
    EXPECT_EQ(released, b.arena_bytes + b.meta_bytes - t.bytes().arena_bytes - t.bytes().meta_bytes)
        << "compact released what the accounting dropped";
    check("after compact");
    // A push after the move finds the moved record, its metadata included.
    const uint64_t moved = before.begin()->first;
    t.push(&moved, 1, g.data(), 9);
    EXPECT_EQ(all_rows(t).at(moved).info.pushes, before.begin()->second.info.pushes + 1);
    EXPECT_EQ(all_rows(t).at(moved).info.last_step, 9);
  }
}

TEST(PsStore, BatchedPushAndPullEqualOneIdAtATime) {
  // Batches larger than a stripe group part (256 ids per stripe), with repeated ids, a disabled id that
  // is re-admitted mid-batch, and ids read by default: the same as one call per id, bitwise.
  const int64_t dim = 6;
  Table batched(opts("t", dim, OptimizerKind::Adagrad)), single(opts("t", dim, OptimizerKind::Adagrad));
  std::vector<uint64_t> ids;
  for (uint64_t k = 0; k < 12000; ++k) ids.push_back(mix64(k % 9000) >> 8);  // 3000 ids twice
  const uint64_t off = 0xD15AB1EDULL;
  ids.push_back(off);
  ids.push_back(off);
  ids.push_back(off);
  for (Table* t : {&batched, &single}) {
    t->set_readmit_after(2);
    t->disable(&off, 1);
  }
  std::vector<float> g(ids.size() * static_cast<size_t>(dim));
  for (size_t k = 0; k < g.size(); ++k) g[k] = std::sin(static_cast<float>(k)) * 0.1f;
  batched.push(ids.data(), static_cast<int64_t>(ids.size()), g.data(), 1);
  for (size_t i = 0; i < ids.size(); ++i) single.push(&ids[i], 1, g.data() + i * static_cast<size_t>(dim), 1);
  EXPECT_EQ(batched.readmitted(), 1);
  EXPECT_EQ(batched.size(), single.size());
  std::vector<uint64_t> reads = ids;
  for (uint64_t k = 0; k < 700; ++k) reads.push_back(0xAB00000000000000ULL + k);  // never created
  std::vector<float> a(reads.size() * static_cast<size_t>(dim)), b(a.size());
  batched.pull(reads.data(), static_cast<int64_t>(reads.size()), a.data(), MissingRow::ReadDefault);
  for (size_t i = 0; i < reads.size(); ++i)
    single.pull(&reads[i], 1, b.data() + i * static_cast<size_t>(dim), MissingRow::ReadDefault);
  EXPECT_EQ(a, b);
  EXPECT_EQ(batched.size(), single.size()) << "ReadDefault created rows";
  const auto ra = all_rows(batched), rb = all_rows(single);
  ASSERT_EQ(ra.size(), rb.size());
  for (const auto& [id, row] : ra) {
    EXPECT_EQ(row.state, rb.at(id).state);
    EXPECT_EQ(row.info.pushes, rb.at(id).info.pushes);
  }
  EXPECT_EQ(ra.at(off).info.pushes, 2u) << "the re-admitting push and the one after it apply";
}

TEST(PsStore, TwoThreadsPushingSerialiseEachRow) {
  // Two threads push overlapping batches (every id in both, different integer gradients, SGD lr 1, so
  // the sums are exact in any order): each row ends at w0 - (sum of both threads' gradients), and its
  // push count and last step are exact — no update of one row ran beside another.
  Table t(opts("t", 8, OptimizerKind::Sgd, 1.0f));
  const int64_t n = 5000;
  std::vector<uint64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = mix64(static_cast<uint64_t>(i));
  std::vector<float> w0(static_cast<size_t>(n * 8));
  t.pull(ids.data(), n, w0.data());
  const int rounds = 40;
  auto worker = [&](float grad) {
    std::vector<float> g(static_cast<size_t>(n * 8), grad);
    for (int r = 0; r < rounds; ++r) t.push(ids.data(), n, g.data(), r);
  };
  std::thread a(worker, 1.0f), b(worker, 2.0f);
  a.join();
  b.join();
  std::vector<float> w(w0.size());
  t.pull(ids.data(), n, w.data());
  for (size_t k = 0; k < w.size(); ++k) ASSERT_FLOAT_EQ(w[k], w0[k] - 3.0f * rounds) << k;
  for (const auto& [id, row] : all_rows(t)) {
    ASSERT_EQ(row.info.pushes, 2u * rounds) << id;
    ASSERT_EQ(row.info.last_step, rounds - 1) << id;
  }
  EXPECT_EQ(t.version(), 2 * rounds);
}

TEST(PsStore, ExportAssignRoundTripAndObserver) {
  Table a(opts("t", 4, OptimizerKind::Adam));
  int observed = 0;
  a.set_push_observer([&](RowInfo& info, const float*, const float* g, int64_t dim) {
    info.score += std::fabs(g[0]);
    ++observed;
  });
  std::vector<uint64_t> ids = {1, 2, 3, 1000000007};
  std::vector<float> g(16, 0.25f);
  a.push(ids.data(), 4, g.data(), 5);
  EXPECT_EQ(observed, 4);
  ExportCursor cur;
  ExportedRows rows;
  while (!cur.done) a.export_batch(cur, 3, rows);
  ASSERT_EQ(rows.size(), 4);
  Table b(opts("t", 4, OptimizerKind::Adam));
  b.assign(rows.ids.data(), rows.size(), rows.values.data(), rows.state.data(), rows.infos.data());
  for (uint64_t id : ids) EXPECT_EQ(pull1(a, id), pull1(b, id));
  // Same state: one more identical push keeps them identical.
  a.push(ids.data(), 4, g.data(), 6);
  b.push(ids.data(), 4, g.data(), 6);
  for (uint64_t id : ids) EXPECT_EQ(pull1(a, id), pull1(b, id));
  for (const RowInfo& r : rows.infos) {
    EXPECT_EQ(r.pushes, 1u);
    EXPECT_EQ(r.last_step, 5);
    EXPECT_FLOAT_EQ(r.score, 0.25f);
  }
}

TEST(PsStore, StoreRejectsConflictingTablesAndUnknownNames) {
  EmbeddingStore s;
  s.ensure_table(opts("user", 8, OptimizerKind::Adagrad));
  EXPECT_NO_THROW(s.ensure_table(opts("user", 8, OptimizerKind::Adagrad)));
  EXPECT_THROW(s.ensure_table(opts("user", 16, OptimizerKind::Adagrad)), Error);
  try {
    s.table("movie");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown embedding table 'movie'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("user"), std::string::npos);
  }
}

TEST(PsStore, SnapshotRoundTripAndMalformedSnapshotIsRefused) {
  const std::string dir = ::testing::TempDir() + "ration_ps_snap_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  EmbeddingStore s;
  Table& t = s.ensure_table(opts("user", 4, OptimizerKind::Adagrad));
  std::vector<uint64_t> ids = {1, 5, 9, 1ULL << 63};
  std::vector<float> g(16, 0.5f), vals(16);
  t.push(ids.data(), 4, g.data(), 3);
  t.pull(ids.data(), 4, vals.data());
  const SnapshotInfo info = write_snapshot(s, dir, 10);
  EXPECT_EQ(info.rows, 4);
  EXPECT_EQ(latest_snapshot_version(dir), 10);
  EmbeddingStore r;
  read_snapshot(r, dir, 10);
  std::vector<float> got(16);
  r.table("user").pull(ids.data(), 4, got.data());
  EXPECT_EQ(got, vals);
  // Optimiser state came back too: the next identical push agrees.
  t.push(ids.data(), 4, g.data(), 4);
  r.table("user").push(ids.data(), 4, g.data(), 4);
  t.pull(ids.data(), 4, vals.data());
  r.table("user").pull(ids.data(), 4, got.data());
  EXPECT_EQ(got, vals);
  // Missing version, then a corrupted one: clear errors, the store keeps what it had.
  EXPECT_THROW(read_snapshot(r, dir, 11), Error);
  for (const auto& e : std::filesystem::directory_iterator(dir + "/v10")) {
    if (e.path().extension() == ".sst") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(20);
      f.write("garbage-garbage-garbage", 23);
    }
  }
  try {
    read_snapshot(r, dir, 10);
    FAIL() << "a corrupted snapshot was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/v10"), std::string::npos) << e.what();
  }
  r.table("user").pull(ids.data(), 4, got.data());
  EXPECT_EQ(got, vals);
  // Versions on disk without LATEST: refused naming them (starting empty would overwrite v10 with nothing).
  write_snapshot(s, dir, 11);
  std::filesystem::remove(dir + "/LATEST");
  const std::string msg = error_of([&] { latest_snapshot_version(dir); });
  EXPECT_NE(msg.find("holds v10, v11 but no LATEST file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("echo 11 > " + dir + "/LATEST"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
  EXPECT_EQ(latest_snapshot_version(dir), -1);  // no directory yet: a fresh start
  // A killed writer's leftover is removed by the next snapshot; a live writer's is left alone.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string leftover = dir + "/v3.tmp-" + std::to_string(dead), live = dir + "/v4.tmp-1";
  std::filesystem::create_directories(leftover);
  std::filesystem::create_directories(live);
  write_snapshot(s, dir, 12);
  EXPECT_FALSE(std::filesystem::exists(leftover));
  EXPECT_TRUE(std::filesystem::exists(live));  // pid 1 runs
  std::filesystem::remove_all(dir);
  // A snapshot directory that is a file is named as such, before anything is read or written.
  std::ofstream(dir) << "not a directory";
  EXPECT_NE(error_of([&] { latest_snapshot_version(dir); }).find("is a file; expected a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { write_snapshot(s, dir, 13); }).find("is a file; expected a directory"), std::string::npos);
  std::filesystem::remove(dir);
}

}  // namespace
}  // namespace ration::ps
