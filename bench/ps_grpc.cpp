// bench_ps_grpc — the parameter server over gRPC on loopback: rows/s and p50/p99 latency of 4096-id
// pulls and pushes (dim 16 and 64) against the embedded shard (same requests, no network) in the same
// run; then trainer steps/s of configs/ctr.toml embedded vs 1 and 2 remote shards, each without the next
// batch's pull overlapped with the step (ps.prefetch = false) and with it, re-pulling the rows the step
// pushed either when collected (ps.repull = "on_collect") or right after the push (ps.repull =
// "after_push", the default); 3 interleaved repetitions (or --reps N; servers in this process on
// 127.0.0.1, so they share its 2 cores with the trainer, as they would on one machine). --trainer-only
// skips the RPC table.
// Usage: bench_ps_grpc [--quick] [--trainer-only] [--reps N] [--steps N] [--json OUT] [--config configs/ctr.toml]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/ps/client.h"
#include "ration/ps/server.h"
#include "ration/train/trainer.h"

using Clock = std::chrono::steady_clock;

namespace {
using ration::bench::ms_since;

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Timing {
  double p50 = 0, p99 = 0, rows_per_s = 0;
};

Timing time_calls(int calls, const std::function<void(int)>& fn, int64_t rows_per_call) {
  std::vector<double> ms;
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) {
    const auto t = Clock::now();
    fn(i);
    ms.push_back(ms_since(t));
  }
  const double total = ms_since(t0);
  return {percentile(ms, 0.5), percentile(ms, 0.99), static_cast<double>(calls * rows_per_call) / (total / 1000.0)};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, trainer_only = false;
  int reps_flag = 0;
  int64_t steps_flag = 0;
  std::string out = "bench/results/ps_grpc.json";
  std::string config = "configs/ctr.toml";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    if (a == "--trainer-only") trainer_only = true;
    if (a == "--reps" && i + 1 < argc) reps_flag = std::stoi(argv[++i]);
    if (a == "--steps" && i + 1 < argc) steps_flag = std::stoll(argv[++i]);
    if (a == "--json" && i + 1 < argc) out = argv[++i];
    if (a == "--config" && i + 1 < argc) config = argv[++i];
  }
  nlohmann::json report = {{"bench", "ps_grpc"}};
  const int calls = quick ? 50 : 400;
  const int64_t n = 4096;
  std::printf("%-9s %-4s %-10s %10s %10s %14s\n", "transport", "dim", "call", "p50 ms", "p99 ms", "rows/s");
  nlohmann::json rpc = nlohmann::json::array();
  for (int64_t dim : {16, 64}) {
    if (trainer_only) break;
    ration::ps::ServeOptions so;
    so.listen = "127.0.0.1:0";
    ration::ps::PsServer server(so);
    ration::ps::ClientOptions remote;
    remote.endpoints = {"127.0.0.1:" + std::to_string(server.port())};
    ration::ps::ClientOptions embedded;
    for (auto* opts : {&embedded, &remote}) {
      ration::ps::PsClient c(*opts);
      ration::ps::TableOptions t;
      t.name = "t";
      t.dim = dim;
      c.declare_tables({t});
      std::vector<std::vector<int64_t>> batches(static_cast<size_t>(calls));
      std::mt19937_64 rng(3);
      for (auto& b : batches)
        for (int64_t i = 0; i < n; ++i) b.push_back(static_cast<int64_t>(rng() % 1000000));
      std::vector<ration::ps::PulledRows> pulled(static_cast<size_t>(calls));
      const Timing pull = time_calls(calls, [&](int i) {
        pulled[static_cast<size_t>(i)] = c.pull("t", batches[static_cast<size_t>(i)].data(), n);
      }, n);
      const Timing push = time_calls(calls, [&](int i) {
        auto& p = pulled[static_cast<size_t>(i)];
        c.push("t", p.unique_ids.data(), static_cast<int64_t>(p.unique_ids.size()), p.rows.data_ptr<float>(), dim, i);
      }, n);
      const char* name = c.embedded() ? "embedded" : "grpc";
      std::printf("%-9s %-4lld %-10s %10.3f %10.3f %14.3g\n", name, static_cast<long long>(dim), "pull", pull.p50,
                  pull.p99, pull.rows_per_s);
      std::printf("%-9s %-4lld %-10s %10.3f %10.3f %14.3g\n", name, static_cast<long long>(dim), "push", push.p50,
                  push.p99, push.rows_per_s);
      rpc.push_back({{"transport", name}, {"dim", dim}, {"ids", n}, {"pull_p50_ms", pull.p50},
                     {"pull_p99_ms", pull.p99}, {"pull_rows_per_s", pull.rows_per_s}, {"push_p50_ms", push.p50},
                     {"push_p99_ms", push.p99}, {"push_rows_per_s", push.rows_per_s}});
    }
  }
  report["rpc"] = rpc;

  // Trainer steps/s: embedded vs 1 and 2 remote shards, each with the next batch's pull overlapped with
  // the step (ps.prefetch, the default) and without; repetitions interleaved, medians reported.
  const int64_t steps = steps_flag > 0 ? steps_flag : quick ? 20 : 60;
  const int reps = reps_flag > 0 ? reps_flag : quick ? 1 : 3;
  // How each setup gets its rows: pulled by the step (off); prefetched, re-pulling the rows the step
  // before pushed when the step collects them (on_collect, the first design); prefetched, re-pulling
  // them on the prefetch's thread right after the push (after_push, the default).
  const std::vector<std::string> modes = {"off", "on_collect", "after_push"};
  struct Setup {
    int shards;
    std::string mode;
    std::vector<double> step_ms, samples_per_s, pull_ms, wait_ms, repull_ms;
    nlohmann::json last_ps;
  };
  std::vector<Setup> setups;
  for (int shards : {0, 1, 2})
    for (const std::string& mode : modes) setups.push_back({shards, mode, {}, {}, {}, {}, {}, {}});
  for (int rep = 0; rep < reps; ++rep) {
    for (Setup& su : setups) {
      std::vector<std::unique_ptr<ration::ps::PsServer>> servers;
      std::string endpoints;
      for (int s = 0; s < su.shards; ++s) {
        ration::ps::ServeOptions so;
        so.listen = "127.0.0.1:0";
        so.shard = {static_cast<uint32_t>(s), static_cast<uint32_t>(su.shards)};
        servers.push_back(std::make_unique<ration::ps::PsServer>(so));
        endpoints += (s ? "," : "") + std::string("127.0.0.1:") + std::to_string(servers.back()->port());
      }
      ration::train::TrainOptions t;
      t.config_path = config;
      t.json = true;
      t.steps = steps;
      t.overrides = {"train.checkpoint_dir=", "train.eval_every=0", "train.threads=1", "data.eval_samples=2000",
                     std::string("ps.prefetch=") + (su.mode == "off" ? "false" : "true")};
      if (su.mode != "off") t.overrides.push_back("ps.repull=" + su.mode);
      if (su.shards > 0) t.overrides.push_back("ps.endpoints=" + endpoints);
      const auto r = ration::train::run_training(t);
      su.step_ms.push_back(r["time"]["step_ms_median"].get<double>());
      su.samples_per_s.push_back(r["time"]["items_per_second"].get<double>());
      su.pull_ms.push_back(r["ps"]["pull_ms"].get<double>());
      su.wait_ms.push_back(r["ps"]["pull_wait_ms"].get<double>());
      su.repull_ms.push_back(r["ps"]["repull_ms"].get<double>());
      su.last_ps = r["ps"];
    }
  }
  nlohmann::json trainer = nlohmann::json::array();
  std::printf("\n%-22s %-11s %10s %10s %11s %10s %14s %11s\n", "trainer", "prefetch", "step ms", "steps/s",
              "samples/s", "pull ms", "pull wait ms", "repull ms");
  for (const Setup& su : setups) {
    const std::string name = su.shards == 0 ? "embedded (2 shards)" : std::to_string(su.shards) + " remote shard(s)";
    const double step_ms = percentile(su.step_ms, 0.5);
    std::printf("%-22s %-11s %10.2f %10.2f %11.0f %10.3f %14.3f %11.3f\n", name.c_str(), su.mode.c_str(), step_ms,
                1000.0 / step_ms, percentile(su.samples_per_s, 0.5), percentile(su.pull_ms, 0.5),
                su.mode != "off" ? percentile(su.wait_ms, 0.5) : percentile(su.pull_ms, 0.5),
                percentile(su.repull_ms, 0.5));
    trainer.push_back({{"setup", name}, {"shards", su.shards}, {"prefetch", su.mode}, {"step_ms_median", step_ms},
                       {"steps_per_s", 1000.0 / step_ms}, {"step_ms_reps", su.step_ms},
                       {"samples_per_s", percentile(su.samples_per_s, 0.5)}, {"pull_wait_ms_reps", su.wait_ms},
                       {"repull_ms_reps", su.repull_ms}, {"ps", su.last_ps}});
  }
  for (int shards : {0, 1, 2}) {
    const size_t base = static_cast<size_t>(shards) * modes.size();
    const double off = percentile(setups[base].step_ms, 0.5);
    const double collect = percentile(setups[base + 1].step_ms, 0.5);
    const double after = percentile(setups[base + 2].step_ms, 0.5);
    std::printf("%s: step ms off %.2f, re-pull on collect %.2f, re-pull after push %.2f (%.1f%% less than off)\n",
                shards == 0 ? "embedded" : (std::to_string(shards) + " remote").c_str(), off, collect, after,
                100.0 * (off - after) / off);
  }
  report["trainer"] = trainer;
  ration::bench::write_json(out, report);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
