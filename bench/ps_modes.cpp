// ps_modes.cpp — bench_ps_modes: partial and asynchronous aggregation on the parameter server against
// the synchronous modes, with and without one slowed rank (dist.debug_delay_ms on the last rank): steps/s,
// final train loss and test accuracy after the same steps, dropped pushes and staleness (rank 0's report).
// Owns: running `ration launch -n N -- train` per mode, interleaved over repetitions, and the table + JSON.
// Does not own: anything measured (the reports are the data).
//
//   bench_ps_modes [--model cnn] [--n 2] [--steps 300] [--batch 64] [--delay-ms 60] [--reps 1]
//                  [--out bench/results/ps_modes.json]
// No PyTorch peer: PyTorch 1.13 has no built-in parameter-server trainer with backup workers or bounded
// staleness (DDP is synchronous all-reduce, compared in bench_dp_scaling).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "bench_util.h"
#include "ration_run.h"

namespace {

using nlohmann::json;

const std::string kBin = RATION_BINARY_DIR;
const std::string kSrc = RATION_SOURCE_DIR;

struct Mode {
  std::string label;
  std::vector<std::string> keys;
};

json ration_run(const std::string& model, int n, int64_t steps, int64_t batch, const std::vector<std::string>& extra) {
  const std::string args = ration::bench::quiet_train_args(kSrc, model, n, steps, batch) +
                           " --set train.eval_every=0 --set train.eval_batches=0";
  return ration::bench::run_ration_report(kBin, args, extra, "psmodes");
}

using ration::bench::median;

// Seconds of training on rank 0: the run's wall time less its evaluations (data loading is the same
// for every mode).
double train_seconds(const json& r) {
  double s = r["time"]["wall_seconds"].get<double>();
  for (const auto& e : r["eval"]) s -= e["seconds"].get<double>();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "cnn", out_path = "bench/results/ps_modes.json";
  int64_t n = 2, steps = 300, batch = 64, delay_ms = 60, reps = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--n") n = std::stoll(next());
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--delay-ms") delay_ms = std::stoll(next());
    else if (a == "--reps") reps = std::stoll(next());
    else if (a == "--out") out_path = next();
    else {
      std::cerr << "usage: bench_ps_modes [--model cnn] [--n 2] [--steps 300] [--batch 64] [--delay-ms 60] "
                   "[--reps 1] [--out F]\n";
      return 2;
    }
  }
  const std::string slow_rank = "dist.debug_delay_rank=" + std::to_string(n - 1);
  const std::vector<Mode> modes = {
      {"allreduce", {"dist.topology=allreduce"}},
      {"ps sync", {"dist.topology=ps"}},
      {"ps backup_workers=1", {"dist.topology=ps", "dist.backup_workers=1"}},
      {"ps async s=1", {"dist.topology=ps", "dist.sync=async", "dist.max_staleness=1"}},
      {"ps async s=4", {"dist.topology=ps", "dist.sync=async", "dist.max_staleness=4"}},
  };
  const std::vector<int64_t> delays = {0, delay_ms};
  std::map<std::string, std::vector<double>> secs;
  std::map<std::string, json> last;
  for (int64_t rep = 0; rep < reps; ++rep) {
    for (int64_t d : delays) {
      for (const Mode& m : modes) {
        std::vector<std::string> keys = m.keys;
        keys.push_back("dist.debug_delay_ms=" + std::to_string(d));
        keys.push_back(slow_rank);
        const std::string id = m.label + "|" + std::to_string(d);
        const json r = ration_run(model, static_cast<int>(n), steps, batch, keys);
        if (r.is_null()) continue;
        secs[id].push_back(train_seconds(r));
        last[id] = r;
      }
    }
  }
  std::printf("ps modes: %s, N=%lld (1 thread each), batch %lld per rank, %lld steps, %lld rep(s); slowed: rank %lld "
              "sleeps the given ms per step\n",
              model.c_str(), static_cast<long long>(n), static_cast<long long>(batch), static_cast<long long>(steps),
              static_cast<long long>(reps), static_cast<long long>(n - 1));
  std::printf("%-22s %6s %9s %9s %10s %10s %9s %9s %10s\n", "mode", "delay", "train s", "steps/s", "final loss",
              "test acc %", "dropped", "versions", "stale max/mean");
  json rows = json::array();
  for (int64_t d : delays) {
    for (const Mode& m : modes) {
      const std::string id = m.label + "|" + std::to_string(d);
      if (!last.count(id)) continue;
      const json& r = last[id];
      const json& dist = r["dist"];
      const double s = median(secs[id]);
      const double acc = 100 * r["eval"].back()["accuracy"].get<double>();
      const int64_t dropped = dist.value("dropped_contributions", int64_t{0});
      const int64_t versions = dist.value("versions", steps);
      std::string stale = "-";
      if (dist.contains("staleness")) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%lld/%.2f", dist["staleness"]["max"].get<long long>(),
                      dist["staleness"]["mean"].get<double>());
        stale = buf;
      }
      std::printf("%-22s %6lld %9.2f %9.2f %10.4f %10.2f %9lld %9lld %10s\n", m.label.c_str(),
                  static_cast<long long>(d), s, static_cast<double>(steps) / s, r["loss"].back().get<double>(), acc,
                  static_cast<long long>(dropped), static_cast<long long>(versions), stale.c_str());
      rows.push_back({{"mode", m.label},
                      {"delay_ms", d},
                      {"train_seconds", s},
                      {"samples", secs[id]},
                      {"steps_per_second", static_cast<double>(steps) / s},
                      {"final_train_loss", r["loss"].back()},
                      {"test_accuracy", acc},
                      {"dist", dist}});
    }
  }
  json result = {{"model", model}, {"n", n}, {"steps", steps}, {"batch", batch}, {"reps", reps}, {"runs", rows}};
  ration::bench::write_json(out_path, result);
  std::printf("\nwrote %s\n", out_path.c_str());
  return 0;
}
