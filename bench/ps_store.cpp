// bench_ps_store — the embedding store's batched pull/push (rows/s) against a raw hash map + memcpy in
// the same run, at dim 16/64/128 and 10^6-10^7 rows, with 1 and 2 threads (pushes on 2 threads: each
// thread its own half of the ids, on both sides, since the raw map has no lock); and the index choice:
// absl::flat_hash_map vs std::unordered_map (lookups/s and bytes per entry).
// Usage: bench_ps_store [--quick] [--case DIMxROWS]... [--reps N] [--batches N] [--json OUT]
//   --case 16x1000000 runs only that case (repeatable); the default runs all four.
#include <absl/container/flat_hash_map.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench_util.h"
#include "ration/ps/store.h"

using Clock = std::chrono::steady_clock;
using ration::ps::mix64;

namespace {

using ration::bench::seconds_since;

// The peer: ids -> slot in a flat_hash_map, rows in one contiguous array; pull = memcpy, push = w -= lr g.
struct RawTable {
  absl::flat_hash_map<uint64_t, uint32_t> index;
  std::vector<float> rows;
  int64_t dim;
  RawTable(const std::vector<uint64_t>& ids, int64_t d) : dim(d) {
    index.reserve(ids.size());
    rows.assign(ids.size() * static_cast<size_t>(d), 0.01f);
    for (size_t i = 0; i < ids.size(); ++i) index.emplace(ids[i], static_cast<uint32_t>(i));
  }
  // (Out of line only so a profiler can attribute its cost; one call per 4096-id batch.)
  __attribute__((noinline)) void pull(const uint64_t* ids, int64_t n, float* out) const {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out + i * dim, rows.data() + index.find(ids[i])->second * dim, static_cast<size_t>(dim) * 4);
  }
  __attribute__((noinline)) void push(const uint64_t* ids, int64_t n, const float* g, float lr) {
    for (int64_t i = 0; i < n; ++i) {
      float* w = rows.data() + index.find(ids[i])->second * dim;
      for (int64_t k = 0; k < dim; ++k) w[k] -= lr * g[i * dim + k];
    }
  }
};

// Which ids a thread draws from: any of them, or only its own part (positions i with i % threads == t,
// so no two threads ever touch one row: the raw map's push needs no lock then).
enum class Draw { Any, OwnPart };

// Each thread runs `batches` batches of 4096 ids drawn from `ids` (uniform, seeded per thread).
template <typename Fn>
double rows_per_sec(int threads, int batches, const std::vector<uint64_t>& ids, Draw draw, Fn fn) {
  const int64_t b = 4096;
  std::vector<std::vector<uint64_t>> draws(static_cast<size_t>(threads));
  const uint64_t part = draw == Draw::OwnPart ? static_cast<uint64_t>(threads) : 1;
  for (int t = 0; t < threads; ++t) {
    std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
    const uint64_t offset = draw == Draw::OwnPart ? static_cast<uint64_t>(t) : 0;
    const uint64_t span = (ids.size() - offset + part - 1) / part;  // positions offset, offset + part, ...
    for (int64_t i = 0; i < b * batches; ++i)
      draws[static_cast<size_t>(t)].push_back(ids[offset + (rng() % span) * part]);
  }
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int k = 0; k < batches; ++k) fn(t, draws[static_cast<size_t>(t)].data() + k * b, b);
    });
  for (auto& th : pool) th.join();
  return static_cast<double>(threads) * batches * b / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 3;
  int batches_arg = 0;  // 0: 100 (20 with --quick)
  std::string out = "bench/results/ps_store.json";
  struct Case {
    int64_t dim, rows;
  };
  std::vector<Case> only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json" && i + 1 < argc) out = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--batches" && i + 1 < argc) batches_arg = std::max(1, std::atoi(argv[++i]));
    else if (a == "--case" && i + 1 < argc) {
      const std::string c = argv[++i];
      const size_t x = c.find('x');
      if (x == std::string::npos) {
        std::fprintf(stderr, "bench_ps_store: --case expects DIMxROWS (e.g. 16x1000000); got '%s'\n", c.c_str());
        return 2;
      }
      only.push_back({std::atoll(c.substr(0, x).c_str()), std::atoll(c.substr(x + 1).c_str())});
    } else {
      std::fprintf(stderr, "bench_ps_store: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  nlohmann::json results = nlohmann::json::array();
  std::vector<Case> cases = {{16, 1000000}, {64, 1000000}, {128, 1000000}, {16, 10000000}};
  if (quick) cases = {{16, 200000}};
  if (!only.empty()) cases = only;
  const int batches = batches_arg > 0 ? batches_arg : quick ? 20 : 100;
  std::printf("%-5s %-9s %-3s %14s %14s %7s %14s %14s %7s\n", "dim", "rows", "thr", "store pull/s", "raw pull/s",
              "ratio", "store push/s", "raw push/s", "ratio");
  for (const Case& c : cases) {
    std::vector<uint64_t> ids(static_cast<size_t>(c.rows));
    for (int64_t i = 0; i < c.rows; ++i) ids[static_cast<size_t>(i)] = mix64(static_cast<uint64_t>(i) + 12345);
    ration::ps::TableOptions o;
    o.name = "t";
    o.dim = c.dim;
    o.optimizer.kind = ration::ps::OptimizerKind::Sgd;
    o.optimizer.lr = 0.01f;
    ration::ps::Table table(o);
    table.find_or_insert(ids.data(), c.rows);  // every row exists before timing (as the raw map's)
    RawTable raw(ids, c.dim);
    for (int threads : {1, 2}) {
      std::vector<std::vector<float>> buf(2, std::vector<float>(static_cast<size_t>(4096 * c.dim), 0.001f));
      // Interleaved repetitions (store, raw, store, raw, ...); the median of `reps` (3).
      std::vector<double> sp, rp, su, ru;
      const int64_t contended0 = table.contended_groups();
      for (int rep = 0; rep < reps; ++rep) {
        sp.push_back(rows_per_sec(threads, batches, ids, Draw::Any, [&](int t, const uint64_t* x, int64_t n) {
          table.pull(x, n, buf[static_cast<size_t>(t)].data());
        }));
        rp.push_back(rows_per_sec(threads, batches, ids, Draw::Any, [&](int t, const uint64_t* x, int64_t n) {
          raw.pull(x, n, buf[static_cast<size_t>(t)].data());
        }));
        // Pushes: the raw map has no locking, so each thread pushes only its own part of the ids (the
        // store gets the same draws; it locks anyway).
        su.push_back(rows_per_sec(threads, batches, ids, Draw::OwnPart, [&](int t, const uint64_t* x, int64_t n) {
          table.push(x, n, buf[static_cast<size_t>(t)].data(), 0);
        }));
        ru.push_back(rows_per_sec(threads, batches, ids, Draw::OwnPart, [&](int t, const uint64_t* x, int64_t n) {
          raw.push(x, n, buf[static_cast<size_t>(t)].data(), 0.01f);
        }));
      }
      // Stripe groups a batch found locked by the other thread (deferred, then waited for), per batch.
      const double contended = static_cast<double>(table.contended_groups() - contended0) /
                               (2.0 * reps * threads * batches);
      const double s_pull = ration::bench::median(sp), r_pull = ration::bench::median(rp);
      const double s_push = ration::bench::median(su), r_push = ration::bench::median(ru);
      std::printf("%-5lld %-9lld %-3d %14.3g %14.3g %7.2f %14.3g %14.3g %7.2f\n", static_cast<long long>(c.dim),
                  static_cast<long long>(c.rows), threads, s_pull, r_pull, s_pull / r_pull, s_push, r_push,
                  s_push / r_push);
      results.push_back({{"dim", c.dim}, {"rows", c.rows}, {"threads", threads}, {"store_pull_rows_per_s", s_pull},
                         {"raw_pull_rows_per_s", r_pull}, {"pull_ratio", s_pull / r_pull},
                         {"store_push_rows_per_s", s_push}, {"raw_push_rows_per_s", r_push},
                         {"push_ratio", s_push / r_push}, {"contended_groups_per_batch", contended}});
    }
    const auto b = table.bytes();
    std::printf("      accounted: %lld rows, values %.1f MiB, index %.1f MiB, arena %.1f MiB, meta %.1f MiB; "
                "contended stripe groups per batch (2 threads): %.3f\n",
                static_cast<long long>(b.rows), b.value_bytes / 1048576.0, b.index_bytes / 1048576.0,
                b.arena_bytes / 1048576.0, b.meta_bytes / 1048576.0, results.back()["contended_groups_per_batch"].get<double>());
  }

  // Index choice: lookups/s and bytes/entry of absl::flat_hash_map vs std::unordered_map at 10^6 ids.
  const int64_t n = quick ? 200000 : 1000000;
  std::vector<uint64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = mix64(static_cast<uint64_t>(i) + 777);
  std::vector<uint64_t> probe(4000000);
  std::mt19937_64 rng(5);
  for (auto& p : probe) p = ids[rng() % ids.size()];
  absl::flat_hash_map<uint64_t, uint32_t> absl_map;
  std::unordered_map<uint64_t, uint32_t> std_map;
  std::vector<double> absl_ins, std_ins, absl_get, std_get;
  for (int rep = 0; rep < 3; ++rep) {
    absl_map.clear();
    std_map.clear();
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) absl_map.emplace(ids[static_cast<size_t>(i)], static_cast<uint32_t>(i));
    absl_ins.push_back(static_cast<double>(n) / seconds_since(t0));
    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) std_map.emplace(ids[static_cast<size_t>(i)], static_cast<uint32_t>(i));
    std_ins.push_back(static_cast<double>(n) / seconds_since(t0));
    uint64_t sum = 0;
    t0 = Clock::now();
    for (uint64_t p : probe) sum += absl_map.find(p)->second;
    absl_get.push_back(static_cast<double>(probe.size()) / seconds_since(t0));
    t0 = Clock::now();
    for (uint64_t p : probe) sum += std_map.find(p)->second;
    std_get.push_back(static_cast<double>(probe.size()) / seconds_since(t0));
    if (sum == 42) std::printf(" ");
  }
  // Bytes: flat map = capacity * (slot + 1 control byte); node map = buckets * 8 + nodes * (next ptr + pair
  // + hash cached by libstdc++ for non-trivial hashes; for uint64 keys: next + pair) rounded to malloc's 32.
  const double absl_bytes = static_cast<double>(absl_map.capacity() * (sizeof(std::pair<uint64_t, uint32_t>) + 1));
  const double std_bytes = static_cast<double>(std_map.bucket_count() * sizeof(void*) + std_map.size() * 32);
  std::printf("\nindex at %lld ids   %16s %16s %14s\n", static_cast<long long>(n), "inserts/s", "lookups/s", "bytes/entry");
  std::printf("absl::flat_hash_map %16.3g %16.3g %14.1f\n", ration::bench::median(absl_ins),
              ration::bench::median(absl_get), absl_bytes / static_cast<double>(n));
  std::printf("std::unordered_map  %16.3g %16.3g %14.1f\n", ration::bench::median(std_ins),
              ration::bench::median(std_get), std_bytes / static_cast<double>(n));
  nlohmann::json report = {
      {"bench", "ps_store"},
      {"cases", results},
      {"index",
       {{"ids", n},
        {"absl_inserts_per_s", ration::bench::median(absl_ins)},
        {"absl_lookups_per_s", ration::bench::median(absl_get)},
        {"absl_bytes_per_entry", absl_bytes / static_cast<double>(n)},
        {"std_inserts_per_s", ration::bench::median(std_ins)},
        {"std_lookups_per_s", ration::bench::median(std_get)},
        {"std_bytes_per_entry", std_bytes / static_cast<double>(n)}}}};
  ration::bench::write_json(out, report);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
