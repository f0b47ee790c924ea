// bench_ps_online — the online mirror's sync (in process: training ShardCore -> OnlineServer, no network):
//   full copy rows/s; delta size and time vs changed rows; end-to-end staleness at a 1 s sync interval
//   under training load (a probe row stamped with its write time, polled on the mirror); Lookup latency
//   p50/p99 of 256 ids with and without syncs and training running.
// Usage: bench_ps_online [--quick] [--json OUT]
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "ration/base/check.h"
#include "ration/serving/online_server.h"

using Clock = std::chrono::steady_clock;
using namespace ration;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

ps::TableOptions table_opts(const std::string& name, int64_t dim) {
  ps::TableOptions o;
  o.name = name;
  o.dim = dim;
  o.optimizer.kind = ps::OptimizerKind::Adagrad;
  return o;
}

std::unique_ptr<ps::OnlineServer> follow(ps::ShardCore& core, double interval) {
  ps::OnlineOptions o;
  o.sync_interval_s = interval;
  std::vector<std::unique_ptr<ps::DeltaSource>> s;
  s.push_back(ps::embedded_delta_source(core));
  return std::make_unique<ps::OnlineServer>(o, std::move(s));
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path = "bench/results/ps_online.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else RATION_CHECK(false, "bench_ps_online: unknown argument '", a, "'; valid: --quick --json OUT");
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when the output is a file
  std::printf("bench_ps_online (in process, no network; machine shared with other jobs: timings are noisy)\n");
  nlohmann::json out;
  const int64_t rows = quick ? 100000 : 500000, dim = 16;
  ps::ShardCore core({0, 1}, "");
  ps::Table& t = core.store().ensure_table(table_opts("emb", dim));
  std::vector<uint64_t> ids(static_cast<size_t>(rows));
  std::iota(ids.begin(), ids.end(), 1);
  std::vector<float> g(static_cast<size_t>(rows * dim), 0.01f);
  t.push(ids.data(), rows, g.data(), 1);
  auto online = follow(core, 0);

  // Full copy.
  double t0 = now_s();
  ps::SyncReport full = online->sync_now();
  const double full_s = now_s() - t0;
  std::printf("\n== full copy ==\n%lld rows of dim %lld: %.3f s, %.0f rows/s, %.1f MiB moved\n",
              static_cast<long long>(rows), static_cast<long long>(dim), full_s, rows / full_s, full.bytes / 1048576.0);
  out["full"] = {{"rows", rows}, {"dim", dim}, {"seconds", full_s}, {"rows_per_s", rows / full_s}, {"bytes", full.bytes}};

  // Deltas vs changed rows. "emb" logs its changes (the first GetDelta turned its change log on); "scan"
  // (a table outside the shard) holds the same rows and pushes but never served a delta, so its export_changed walks every slot (the
  // method before the change log). Finding the changed rows is timed directly on both (median of 3),
  // and the mirror's whole incremental sync (GetDelta pages + apply) on "emb".
  ps::Table scan(table_opts("scan", dim));  // outside the shard: no mirror asks it for deltas
  scan.push(ids.data(), rows, g.data(), 1);
  std::printf("\n== delta vs changed rows (of %lld) ==\n%10s %10s %10s %14s %14s %12s %12s\n", static_cast<long long>(rows),
              "changed", "delta rows", "delta MiB", "find: log ms", "find: scan ms", "sync s", "rows/s");
  std::mt19937_64 rng(5);
  int64_t step = 2;
  for (int64_t changed : {int64_t{10}, int64_t{100}, int64_t{1000}, int64_t{10000}, int64_t{100000}}) {
    std::vector<uint64_t> c(static_cast<size_t>(changed));
    for (auto& x : c) x = 1 + rng() % static_cast<uint64_t>(rows);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    const int64_t from_emb = online->store().version(0, "emb");
    const int64_t from_scan = scan.settled_version();
    t.push(c.data(), static_cast<int64_t>(c.size()), g.data(), step);
    scan.push(c.data(), static_cast<int64_t>(c.size()), g.data(), step);
    ++step;
    auto find_ms = [&](ps::Table& table, int64_t from, int64_t* found) {
      std::vector<double> ms;
      for (int rep = 0; rep < 3; ++rep) {
        ps::ExportCursor cur;
        ps::ExportedRows out;
        const double a = now_s();
        while (!cur.done) table.export_changed(from, cur, 65536, out);
        ms.push_back((now_s() - a) * 1e3);
        *found = out.size();
      }
      return bench::median(ms);
    };
    int64_t n_log = 0, n_scan = 0;
    const double log_ms = find_ms(t, from_emb, &n_log), scan_ms = find_ms(scan, from_scan, &n_scan);
    RATION_CHECK(n_log == n_scan && n_log == static_cast<int64_t>(c.size()), "bench_ps_online: the log found ", n_log,
                 " rows, the scan ", n_scan, ", pushed ", c.size());
    t0 = now_s();
    const ps::SyncReport r = online->sync_now();
    const double s = now_s() - t0;
    std::printf("%10zu %10lld %10.3f %14.3f %14.3f %12.4f %12.0f\n", c.size(), static_cast<long long>(r.rows),
                r.bytes / 1048576.0, log_ms, scan_ms, s, r.rows / s);
    out["deltas"].push_back({{"changed", c.size()}, {"delta_rows", r.rows}, {"bytes", r.bytes}, {"find_log_ms", log_ms},
                             {"find_scan_ms", scan_ms}, {"sync_seconds", s}, {"rows_per_s", r.rows / s}});
  }

  // Lookup latency, quiet.
  auto lookup_lat = [&](double seconds) {
    std::vector<double> lat;
    std::vector<uint64_t> q(256);
    std::vector<float> buf(256 * static_cast<size_t>(dim));
    std::mt19937_64 r(9);
    const double end = now_s() + seconds;
    while (now_s() < end) {
      for (auto& x : q) x = 1 + r() % static_cast<uint64_t>(rows);
      const double a = now_s();
      online->store().lookup("emb", q.data(), 256, buf.data());
      lat.push_back((now_s() - a) * 1e6);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return lat;
  };
  const std::vector<double> quiet = lookup_lat(quick ? 1.0 : 3.0);

  // Under training load with a 1 s sync loop: staleness of a probe row, Lookup latency.
  online.reset();
  online = follow(core, 1.0);
  online->sync_now();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> pushed{0};
  std::thread trainer([&] {
    std::mt19937_64 r(11);
    std::vector<uint64_t> b(4096);
    std::vector<float> gg(4096 * static_cast<size_t>(dim), 0.001f);
    int64_t step = 3;
    while (!stop) {
      for (auto& x : b) x = 1 + r() % static_cast<uint64_t>(rows);
      t.push(b.data(), 4096, gg.data(), step++);
      pushed += 4096;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const uint64_t probe = static_cast<uint64_t>(rows) + 7;
  std::thread prober([&] {
    std::vector<float> v(static_cast<size_t>(dim));
    while (!stop) {
      v[0] = static_cast<float>(now_s());
      t.assign(&probe, 1, v.data());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<double> staleness;
  std::thread watcher([&] {
    std::vector<float> v(static_cast<size_t>(dim));
    float last = 0;
    while (!stop) {
      online->store().lookup("emb", &probe, 1, v.data());
      if (v[0] != last && v[0] > 0) {
        last = v[0];
        staleness.push_back(now_s() - static_cast<double>(v[0]));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  online->start_sync_loop();
  const double load_s = quick ? 4.0 : 12.0;
  const double l0 = now_s();
  const std::vector<double> busy = lookup_lat(load_s);
  const double elapsed = now_s() - l0;
  ps::wire::OnlineStatsResponse st;
  online->stats(&st);
  stop = true;
  trainer.join();
  prober.join();
  watcher.join();
  online->stop_sync_loop();
  // The probe is rewritten every 100 ms, so a value is first seen between 0 and 1 s + apply after it was
  // written; staleness_s in Stats is the age of the last completed sync's start.
  std::printf("\n== under training load (%.0f pushed rows/s), sync every 1 s ==\n", pushed.load() / elapsed);
  std::printf("end-to-end staleness of a probe row: p50 %.3f s, p99 %.3f s, max %.3f s (%zu samples)\n",
              pct(staleness, 0.5), pct(staleness, 0.99), pct(staleness, 1.0), staleness.size());
  std::printf("Stats at the end: staleness_s %.3f, versions_behind %lld, syncs %lld, full %lld\n", st.staleness_s(),
              static_cast<long long>(st.versions_behind()), static_cast<long long>(st.syncs()),
              static_cast<long long>(st.full_resyncs()));
  std::printf("\n== Lookup of 256 ids (us) ==\n%-28s %10s %10s %10s\n", "", "p50", "p99", "n");
  std::printf("%-28s %10.1f %10.1f %10zu\n", "quiet", pct(quiet, 0.5), pct(quiet, 0.99), quiet.size());
  std::printf("%-28s %10.1f %10.1f %10zu\n", "training + sync every 1 s", pct(busy, 0.5), pct(busy, 0.99), busy.size());
  out["load"] = {{"pushed_rows_per_s", pushed.load() / elapsed},
                 {"staleness_p50_s", pct(staleness, 0.5)},
                 {"staleness_p99_s", pct(staleness, 0.99)},
                 {"staleness_max_s", pct(staleness, 1.0)},
                 {"stats_staleness_s", st.staleness_s()},
                 {"stats_versions_behind", st.versions_behind()},
                 {"syncs", st.syncs()}};
  out["lookup_us"] = {{"quiet_p50", pct(quiet, 0.5)}, {"quiet_p99", pct(quiet, 0.99)},
                      {"busy_p50", pct(busy, 0.5)}, {"busy_p99", pct(busy, 0.99)}};
  bench::write_json(json_path, out);
  std::printf("json: %s\n", json_path.c_str());
  return 0;
}
