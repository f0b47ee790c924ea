// dp_convergence.cpp — bench_dp_convergence: samples and wall time to a target test accuracy for every
// data-parallel topology and mode (all-reduce with each compression, model averaging, the parameter server
// synchronous / with a backup worker / bounded-asynchronous, on rank 0 or on 2 dedicated server processes,
// gossip on the ring and the exponential graph and asynchronous, ensembles, K-FAC, evolution strategies)
// at N = 2, 3, 4 ranks, each without and with one straggler (the last rank sleeps every step as long as
// the plain all-reduce step at that N takes: +100 % of that step).
// Owns: running `ration launch -n N -- train configs/mlp.toml` per cell, reading rank 0's timed
//       evaluation lines and the report, and the table + JSON. Does not own: anything measured (the
//       reports and the times the evaluation lines were printed at are the data).
//
//   bench_dp_convergence [--n 2,3,4] [--filter 'LABEL|LABEL'] [--max-steps 600] [--target 85]
//                        [--batch 32] [--eval-every 20] [--eval-images 1920] [--delay-ms D] [--no-straggler]
//                        [--bin DIR] [--out bench/results/dp_convergence.json]
// --target: test accuracy in percent; --delay-ms: the straggler's sleep instead of the measured step;
// --bin: the folder whose `ration` runs (default the build's; a copy keeps every cell on one binary while
// the build folder is being rebuilt).
//
// Per cell: one run (one repetition), batch --batch per rank, one thread per rank, the cosine schedule over
// --max-steps (the same learning rate at a step in every cell), an evaluation every --eval-every steps on
// the first --eval-images test images (the same images in every cell: the sharded evaluation takes
// images / (N * batch) global batches; rank 0 alone, with a parameter server that aggregates partially
// or asynchronously, images / batch). Steps to target: rank 0's step at the first evaluation at or above
// --target (with backup workers a late rank 0 takes the server's version as its step; asynchronous ranks
// count their own pushes, at most dist.max_staleness apart); samples: steps * N * batch, the global data
// order's position at that step (with backup workers the dropped pushes included: the server applied
// steps * (N - 1) * batch of them). Wall to target: from rank 0's
// "step 1" line to the start of that evaluation, less the earlier evaluations' seconds (from the report)
// where every rank waits for them; with backup workers the server's model advances while rank 0
// evaluates, so they are counted (the subtracted figure is in the JSON too). Cells run N by N; at each N
// the plain all-reduce runs first without the straggler (its median step is the delay), then each mode
// without and with it. PyTorch 1.13 has no parameter-server or gossip trainer to compare with (DDP
// all-reduce is in bench_dp_scaling).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
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
  // Partial / asynchronous parameter server (docs/DISTRIBUTED.md): rank 0 evaluates the whole set alone,
  // the others go on training; with backup workers the server's version advances meanwhile (the N - 1
  // other ranks still make rounds), with bounded staleness they soon wait for rank 0.
  bool rank0_evaluates_alone = false;
  bool trains_during_evaluation = false;
  std::string launch_flags;  // e.g. "--servers 2" (dedicated parameter servers beside the N workers)
};

// One evaluation of a run: rank 0's step, accuracy and the line's arrival time.
struct Eval {
  int64_t step = 0;
  double accuracy = 0, seconds = 0, at = 0;
};

struct Cell {
  std::string label;
  int n = 0;
  int64_t delay_ms = 0;
  json report;
  std::vector<Eval> evals;
  double start = -1;  // when rank 0's "step 1" line arrived
  bool trains_during_evaluation = false;
  std::string error;
};

const char* const kRank0 = "[rank 0] ";

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Rank 0's evaluations from the report, each with the time its "eval @S:" line arrived, and the arrival of
// its "step 1/" line.
void read_timeline(const ration::bench::TimedReport& run, Cell& c) {
  std::vector<std::pair<int64_t, double>> lines;  // (step, arrival)
  for (const auto& l : run.lines) {
    const std::string text = starts_with(l.text, kRank0) ? l.text.substr(std::string(kRank0).size()) : "";
    if (c.start < 0 && starts_with(text, "step 1/")) c.start = l.seconds;
    if (starts_with(text, "eval @")) lines.emplace_back(std::stoll(text.substr(6)), l.seconds);
  }
  const json& evals = c.report["eval"];
  for (size_t i = 0; i < evals.size(); ++i) {
    Eval e;
    e.step = evals[i]["step"].get<int64_t>();
    e.accuracy = evals[i]["accuracy"].get<double>();
    e.seconds = evals[i]["seconds"].get<double>();
    e.at = i < lines.size() && lines[i].first == e.step ? lines[i].second : NAN;
    c.evals.push_back(e);
  }
}

// Wall seconds from the end of step 1 to the start of evaluation `k` (its line's arrival less its own
// seconds), less the earlier evaluations' seconds when every rank waited for them (`subtract_all`; with
// backup workers the model advanced during them, so they stay in).
double wall_to(const Cell& c, size_t k, bool subtract_all) {
  double s = c.evals[k].at - c.start - c.evals[k].seconds;
  for (size_t i = 0; i < k; ++i) s -= subtract_all ? c.evals[i].seconds : 0.0;
  return s;
}
double wall_to(const Cell& c, size_t k) { return wall_to(c, k, !c.trains_during_evaluation); }

// The step the sleeping rank's delay is taken from: the plain all-reduce step at that N (its median; the
// all-reduce exchange happens inside the step).
double step_ms(const json& report) { return report["time"]["step_ms_median"].get<double>(); }

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string n_list = "2,3,4", filter, bin_dir = kBin, out_path = kSrc + "/bench/results/dp_convergence.json";
  int64_t max_steps = 600, batch = 32, eval_every = 20, eval_images = 1920, delay_override = -1;
  double target = 85;
  bool straggler = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--n") n_list = next();
    else if (a == "--filter") filter = next();
    else if (a == "--max-steps") max_steps = std::stoll(next());
    else if (a == "--target") target = std::stod(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--eval-every") eval_every = std::stoll(next());
    else if (a == "--eval-images") eval_images = std::stoll(next());
    else if (a == "--delay-ms") delay_override = std::stoll(next());
    else if (a == "--no-straggler") straggler = false;
    else if (a == "--bin") bin_dir = next();
    else if (a == "--out") out_path = next();
    else {
      std::cerr << "usage: bench_dp_convergence [--n 2,3,4] [--filter 'LABEL|LABEL'] [--max-steps 600] "
                   "[--target 85] [--batch 32] [--eval-every 20] [--eval-images 1920] [--delay-ms D] "
                   "[--no-straggler] [--bin DIR] [--out F]\n";
      return 2;
    }
  }
  const std::vector<Mode> modes = {
      {"allreduce none", {"dist.topology=allreduce", "dist.compress=none"}},
      {"allreduce fp16", {"dist.topology=allreduce", "dist.compress=fp16"}},
      // Error feedback and the fp32 warm-up (optim.warmup_steps = 50) as by default.
      {"allreduce onebit", {"dist.topology=allreduce", "dist.compress=onebit"}},
      {"model averaging K=4", {"dist.topology=allreduce", "dist.aggregate=parameters", "dist.sync_every=4"}},
      {"ps sync", {"dist.topology=ps"}},
      {"ps backup_workers=1", {"dist.topology=ps", "dist.backup_workers=1"}, true, true},
      {"ps async s=1", {"dist.topology=ps", "dist.sync=async", "dist.max_staleness=1"}, true},
      {"gossip ring", {"dist.topology=gossip", "dist.gossip_graph=ring"}},
      {"gossip exponential", {"dist.topology=gossip", "dist.gossip_graph=exponential"}},
      {"gossip async s=1", {"dist.topology=gossip", "dist.gossip_async=true", "dist.max_staleness=1"}},
      {"ps servers=2 sync", {"dist.topology=ps"}, true, false, "--servers 2"},
      {"ps servers=2 backup=1", {"dist.topology=ps", "dist.backup_workers=1"}, true, true, "--servers 2"},
      {"ps servers=2 async s=1", {"dist.topology=ps", "dist.sync=async", "dist.max_staleness=1"}, true, false,
       "--servers 2"},
      // Every member evaluates the same images (the ensemble's vote); each trains on its own bootstrap sample.
      {"ensemble (soft vote)", {"dist.aggregate=ensemble"}, true},
      {"K-FAC", {"optim.name=kfac", "optim.lr=0.1", "optim.kfac_damping=0.1"}},
      {"ES (population 32)", {"optim.name=es", "optim.lr=0.0005"}},  // the lr of the ES test; 0.05 diverges
  };
  const std::vector<int> ns = ration::bench::numbers<int>(n_list);
  for (int n : ns)
    if (n < 2 || eval_images % (batch * n) != 0) {
      std::cerr << "--n: each N must be >= 2 and divide --eval-images / --batch (" << eval_images << " / " << batch
                << ")\n";
      return 2;
    }

  const std::string base_load = ration::bench::run_command("uptime");
  const auto t_all = std::chrono::steady_clock::now();
  std::vector<Cell> cells;
  json delays = json::object();
  for (int n : ns) {
    auto run = [&](const Mode& m, int64_t delay_ms) {
      Cell c;
      c.label = m.label;
      c.n = n;
      c.delay_ms = delay_ms;
      c.trains_during_evaluation = m.trains_during_evaluation;
      const int64_t eval_batches = eval_images / (batch * (m.rank0_evaluates_alone ? 1 : n));
      std::vector<std::string> keys = m.keys;
      keys.push_back("train.eval_every=" + std::to_string(eval_every));
      keys.push_back("train.eval_batches=" + std::to_string(eval_batches));
      keys.push_back("train.log_every=1");  // rank 0's "step 1" line starts the clock
      keys.push_back("dist.debug_delay_ms=" + std::to_string(delay_ms));
      keys.push_back("dist.debug_delay_rank=" + std::to_string(n - 1));
      const ration::bench::TimedReport r = ration::bench::run_ration_timed(
          bin_dir, ration::bench::quiet_train_args(kSrc, "mlp", n, max_steps, batch, m.launch_flags), keys, "dpconv");
      c.report = r.report;
      if (r.status != 0 || r.report.is_null() || !r.report.contains("eval")) {
        // A refused combination or a failed run: its last lines say why.
        for (size_t i = r.lines.size() > 3 ? r.lines.size() - 3 : 0; i < r.lines.size(); ++i)
          c.error += (c.error.empty() ? "" : " | ") + r.lines[i].text;
        std::fprintf(stderr, "%s N=%d delay %lld: %s\n", m.label.c_str(), n, static_cast<long long>(delay_ms),
                     c.error.c_str());
      } else {
        read_timeline(r, c);
      }
      std::fprintf(stderr, "done: %-22s N=%d delay %3lld ms  (%.0f s so far)\n", m.label.c_str(), n,
                   static_cast<long long>(delay_ms), ration::bench::seconds_since(t_all));
      cells.push_back(c);
      return cells.back();
    };
    // The plain all-reduce run comes first: its median step is the straggler's delay at this N.
    const Cell plain = run(modes.front(), 0);
    int64_t delay = delay_override;
    if (delay < 0) delay = plain.error.empty() ? std::max<int64_t>(1, std::llround(step_ms(plain.report))) : 0;
    delays[std::to_string(n)] = {{"delay_ms", delay},
                                 {"allreduce_step_ms_median", plain.error.empty() ? step_ms(plain.report) : 0.0}};
    if (straggler && delay > 0 && ration::bench::selected(filter, modes.front().label)) run(modes.front(), delay);
    for (size_t i = 1; i < modes.size(); ++i) {
      if (!ration::bench::selected(filter, modes[i].label)) continue;
      run(modes[i], 0);
      if (straggler && delay > 0) run(modes[i], delay);
    }
  }
  const double total_s = ration::bench::seconds_since(t_all);
  const std::string end_load = ration::bench::run_command("uptime");

  std::printf("\nconvergence to %.1f %% test accuracy (first %lld test images): mlp, batch %lld per rank, one thread "
              "per rank, cap %lld steps, evaluation every %lld steps, 1 repetition; straggler: rank N-1 sleeps "
              "the plain all-reduce median step at that N, every step (%s); wall s in parentheses: the whole run, "
              "target not reached\n",
              target, static_cast<long long>(eval_images), static_cast<long long>(batch),
              static_cast<long long>(max_steps), static_cast<long long>(eval_every), delays.dump().c_str());
  std::printf("%-22s %2s %10s %8s %10s %10s %9s %14s\n", "configuration", "N", "straggler", "steps", "samples",
              "wall s", "final %", "bytes/step r0");
  json rows = json::array();
  for (const Cell& c : cells) {
    if (c.delay_ms == 0 && c.label == modes.front().label && !ration::bench::selected(filter, c.label)) continue;
    const std::string strag = c.delay_ms > 0 ? "+" + std::to_string(c.delay_ms) + " ms" : "none";
    json row = {{"configuration", c.label}, {"n", c.n}, {"straggler_delay_ms", c.delay_ms}};
    if (!c.error.empty()) {
      row["error"] = c.error;
      std::printf("%-22s %2d %10s  failed or refused: %s\n", c.label.c_str(), c.n, strag.c_str(), c.error.c_str());
      rows.push_back(row);
      continue;
    }
    size_t hit = c.evals.size();
    for (size_t k = 0; k < c.evals.size() && hit == c.evals.size(); ++k)
      if (100 * c.evals[k].accuracy >= target) hit = k;
    const bool reached = hit < c.evals.size();
    const json& dist = c.report["dist"];
    const double bytes = dist.value("bytes_sent_per_step", 0.0);
    const double final_acc = 100 * c.evals.back().accuracy;
    json curve = json::array();
    for (const Eval& e : c.evals) curve.push_back({e.step, 100 * e.accuracy});
    row.update({{"reached", reached},
                {"final_accuracy", final_acc},
                {"eval_images", c.report["eval"].back()["items"]},
                {"bytes_sent_per_step_rank0", bytes},
                {"train_wall_seconds", wall_to(c, c.evals.size() - 1)},  // to the last evaluation
                {"step_ms_median", step_ms(c.report)},
                {"parameter_exchange_ms", dist.value("parameter_exchange_ms", 0.0)},
                {"accuracy_curve", curve}});
    for (const char* k : {"versions", "dropped_contributions", "included_contributions", "staleness", "averages",
                          "max_ahead", "onebit"})
      if (dist.contains(k)) row[k] = dist[k];
    if (reached) {
      const int64_t steps = c.evals[hit].step;
      row.update({{"steps_to_target", steps},
                  {"samples_to_target", steps * c.n * batch},
                  {"wall_seconds_to_target", wall_to(c, hit)}});
      if (c.trains_during_evaluation) row["wall_seconds_to_target_evaluations_subtracted"] = wall_to(c, hit, true);
      if (dist.contains("backup_workers"))  // each round applied the first N - k pushes
        row["samples_applied_to_target"] = steps * (c.n - dist["backup_workers"].get<int64_t>()) * batch;
      std::printf("%-22s %2d %10s %8lld %10lld %10.2f %9.2f %14.0f\n", c.label.c_str(), c.n, strag.c_str(),
                  static_cast<long long>(steps), static_cast<long long>(steps * c.n * batch), wall_to(c, hit),
                  final_acc, bytes);
    } else {
      std::printf("%-22s %2d %10s %8s %10s %10s %9.2f %14.0f\n", c.label.c_str(), c.n, strag.c_str(),
                  ("> " + std::to_string(max_steps)).c_str(), "-", ("(" + fixed(wall_to(c, c.evals.size() - 1), 1) + ")").c_str(),
                  final_acc, bytes);
    }
    rows.push_back(row);
  }
  std::printf("whole benchmark: %.0f s; uptime at start: %s; at end: %s", total_s,
              base_load.substr(0, base_load.find('\n')).c_str(), end_load.c_str());

  json result = {{"machine", ration::bench::machine() + ", 1 thread per rank"},
                 {"model", "mlp"},
                 {"target_accuracy", target},
                 {"batch_per_rank", batch},
                 {"max_steps", max_steps},
                 {"eval_every", eval_every},
                 {"eval_images", eval_images},
                 {"repetitions", 1},
                 {"straggler", {{"rank", "N-1"}, {"delay_by_n", delays}}},
                 {"wall_seconds", total_s},
                 {"uptime_start", base_load.substr(0, base_load.find('\n'))},
                 {"uptime_end", end_load.substr(0, end_load.find('\n'))},
                 {"runs", rows}};
  ration::bench::write_json(out_path, result);
  std::printf("\nwrote %s\n", out_path.c_str());
  return 0;
} catch (const std::exception& e) {
  return ration::bench::report_error(e);
}
