// train_peer.cpp — `ration train` against the PyTorch training loop a user writes (bench/peer_train.py), per
// model family and under a memory budget, interleaved, in one run.
// Owns: the orchestration (repetitions interleaved, the order reversed every other repetition), the same
//       settings on both sides (the config's train.threads as ATen's intra-op count and, through
//       OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, both thread pools; the OpenBLAS core ration ran, given to
//       the peer as OPENBLAS_CORETYPE; ration's OpenMP spin-wait, given as GOMP_SPINCOUNT; ration's freed host
//       memory setting, through the probe; denormals as the CPU leaves them on both sides), the gpt budgets
//       (ration's whole-device budget set so that its activations get at most what each PyTorch
//       checkpointing mode's step peak is), the table and the JSON.
// Does not own: the trainer (`ration train`, run as a user runs it: progress lines on, to /dev/null), the
//       PyTorch loop (bench/peer_train.py under Debian's /usr/bin/python3).
//
// What is timed, on both sides: one iteration of the training loop (next batch, learning rate, forward,
// backward, clip, optimiser step, zero gradients, loss read back, a progress line every train.log_every
// steps): ration's report `time.loop_ms_median`, the peer's `loop_ms_median`; each the median over the run's
// iterations after its first. Start-up, the final evaluation and checkpoint are outside the loop on both
// sides. Peaks: bytes above each step's pre-step baseline, from ration's counting ATen allocator on both
// sides (the peer loads it as libration_memprobe.so).
//
// Sides per family: `ration`; `pytorch` (ration's process settings: OPENBLAS_CORETYPE = ration's core, the
// freed host memory ration keeps and, with more than one thread, GOMP_SPINCOUNT = the bounded OpenMP spin-wait
// ration sets for itself); `pytorch-installed` (none of them: what Debian's python3-torch does on its own).
// gpt also: `pytorch-per-block` (torch.utils.checkpoint per block), `pytorch-attention` (attention only) and `ration-budget-per-block` /
// `ration-budget-attention` (`ration train --memory-budget B`, B = ration's pre-step bytes + that mode's
// measured peak above its baseline, calibrated once before the repetitions).
//
// usage: bench_train_peer [--reps 3] [--steps 40] [--families mlp,cnn,gpt,lstm_lm,tcn_lm] [--no-budgets]
//                         [--no-installed] [--json bench/results/train_peer.json]
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/base/openmp.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {
using ration::bench::median;

struct Args {
  int reps = 3, steps = 40;
  std::vector<std::string> families = {"mlp", "cnn", "gpt", "lstm_lm", "tcn_lm"};
  bool budgets = true, installed = true;
  std::string json_path = "bench/results/train_peer.json";
};

std::string config_path(const std::string& family) { return std::string(RATION_SOURCE_DIR) + "/configs/" + family + ".toml"; }

// train.threads of a config (the trainer's default 2 when absent), read as the peer reads it.
int config_threads(const std::string& family) {
  std::ifstream in(config_path(family));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("threads", 0) == 0 && line.find('=') != std::string::npos) return std::stoi(line.substr(line.find('=') + 1));
  return 2;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// One `ration train` run as a user runs it; its report, with "side" and the load average at its start.
json run_ration(const std::string& family, int steps, int64_t budget_bytes) {
  const fs::path report = fs::temp_directory_path() / ("ration-train-peer-" + std::to_string(::getpid()) + ".json");
  std::string cmd = ration::bench::thread_env(config_threads(family)) + std::string(RATION_BINARY_DIR) + "/ration train " +
                    config_path(family) + " --steps " + std::to_string(steps) +
                    " --set train.checkpoint_dir= --report " + report.string();
  if (budget_bytes > 0) cmd += " --memory-budget " + std::to_string(budget_bytes);
  cmd += " > /dev/null 2>&1";
  const std::string load = load_average();
  int status = 0;
  ration::bench::run_command(cmd, &status);
  json r;
  std::ifstream in(report);
  if (in.good()) in >> r;
  fs::remove(report);
  if (status != 0 || r.is_null()) throw std::runtime_error("bench_train_peer: failed: " + cmd);
  return {{"loop_ms_median", r["time"]["loop_ms_median"]},
          {"step_ms_median", r["time"]["step_ms_median"]},
          {"peak_above_baseline_bytes", r["memory"]["step_peak_above_baseline_bytes"]},
          {"peak_bytes", r["memory"]["peak_bytes"]},
          {"budget_bytes", budget_bytes > 0 ? json(budget_bytes) : json(nullptr)},
          {"blas", r["blas"]},
          {"openmp", r["openmp"]},
          {"load", load}};
}

// train.malloc_keep_freed's default, which no config of the families here changes (base/host_malloc.h).
constexpr int64_t kRationKeepFreed = int64_t{1} << 30;

// One peer run: `checkpoint` none / per-block / attention, `coretype` "" (as installed) or ration's core. With
// ration's core the peer also gets the other process settings `ration train` makes for itself: the OpenMP
// spin-wait where it runs more than one thread (base/openmp.h) and the freed host memory glibc keeps
// (base/host_malloc.h, through the memory probe), so that both sides run with the same process settings.
json run_peer(const std::string& family, int steps, const std::string& checkpoint, const std::string& coretype) {
  const int threads = config_threads(family);
  std::string cmd = ration::bench::thread_env(threads);
  if (!coretype.empty()) cmd += "OPENBLAS_CORETYPE=" + coretype + " ";
  if (!coretype.empty() && threads > 1) cmd += std::string("GOMP_SPINCOUNT=") + ration::openmp::kBoundedSpinCount + " ";
  cmd += ration::bench::python_peer(RATION_SOURCE_DIR, "peer_train.py") + " --family " + family + " --steps " +
         std::to_string(steps - 1) + " --warmup 1 --checkpoint " + checkpoint + " --probe " + RATION_PROBE_PATH;
  if (!coretype.empty()) cmd += " --keep-freed " + std::to_string(kRationKeepFreed);
  const std::string load = load_average();
  const std::vector<json> lines = ration::bench::json_lines(ration::bench::run_command(cmd + " 2>&1"));
  if (lines.empty() || !lines.back().contains("loop_ms_median")) throw std::runtime_error("bench_train_peer: failed: " + cmd);
  json r = lines.back();
  r.erase("loop_ms");
  r["load"] = load;
  return r;
}

// The budget that gives ration's step at most `peak_above` bytes above its pre-step baseline: ration's
// pre-step bytes (its unconstrained peak minus its peak above baseline) plus `peak_above`.
int64_t budget_for(const json& ration_plain, int64_t peak_above) {
  return ration_plain["peak_bytes"].get<int64_t>() - ration_plain["peak_above_baseline_bytes"].get<int64_t>() + peak_above;
}

using Run = ration::bench::PeerRun;  // row: the family

// The gpt budgets: one short run of each side they depend on.
std::map<std::string, int64_t> calibrate_budgets(const std::string& core) {
  const json plain = run_ration("gpt", 6, 0);
  std::map<std::string, int64_t> b;
  for (const char* mode : {"per-block", "attention"}) {
    const json peer = run_peer("gpt", 6, mode, core);
    b[mode] = budget_for(plain, peer["peak_above_baseline_bytes"].get<int64_t>());
    std::fprintf(stderr, "budget for %s: %lld bytes (peer peak above base %lld)\n", mode, static_cast<long long>(b[mode]),
                 static_cast<long long>(peer["peak_above_baseline_bytes"].get<int64_t>()));
  }
  return b;
}

// One repetition of one family: every side once, in `forward` order or reversed.
void run_family(const Args& a, const std::string& fam, const std::string& core, const std::map<std::string, int64_t>& budgets,
                int rep, std::vector<Run>& runs) {
  std::vector<std::pair<std::string, std::function<json()>>> sides = {
      {"ration", [&] { return run_ration(fam, a.steps, 0); }},
      {"pytorch", [&] { return run_peer(fam, a.steps, "none", core); }}};
  if (a.installed) sides.push_back({"pytorch-installed", [&] { return run_peer(fam, a.steps, "none", ""); }});
  if (fam == "gpt" && a.budgets)
    for (const char* mode : {"per-block", "attention"}) {
      const std::string m = mode;
      sides.push_back({"pytorch-" + m, [&, m] { return run_peer(fam, a.steps, m, core); }});
      sides.push_back({"ration-budget-" + m, [&, m] { return run_ration(fam, a.steps, budgets.at(m)); }});
    }
  if (rep % 2 == 1) std::reverse(sides.begin(), sides.end());
  for (auto& [side, fn] : sides) {
    json r = fn();
    r["rep"] = rep + 1;
    std::fprintf(stderr, "[rep %d] %-8s %-24s loop %8.1f ms  step %8.1f ms  peak above %6.2f MiB  (load %s)\n", rep + 1,
                 fam.c_str(), side.c_str(), r["loop_ms_median"].get<double>(), r["step_ms_median"].get<double>(),
                 r.value("peak_above_baseline_bytes", int64_t{0}) / 1048576.0, r["load"].get<std::string>().c_str());
    runs.push_back({fam, side, r});
  }
}

// Per family and side: the median over repetitions of each run's median loop time, and every rep's.
json summarise(const Args& a, const std::vector<Run>& runs) {
  using ration::bench::loop_ratio;
  json summary = json::object();
  for (const std::string& fam : a.families) {
    json fs = ration::bench::summarise_sides(runs, fam);
    fs["ratio"] = loop_ratio(fs, "ration", "pytorch");
    fs["ratio_installed"] = loop_ratio(fs, "ration", "pytorch-installed");
    fs["ratio_budget_per_block"] = loop_ratio(fs, "ration-budget-per-block", "pytorch-per-block");
    fs["ratio_budget_attention"] = loop_ratio(fs, "ration-budget-attention", "pytorch-attention");
    summary[fam] = fs;
  }
  return summary;
}

void print_table(const json& summary) {
  std::printf("\n%-8s %-26s %10s %24s %14s %8s\n", "family", "side", "loop ms", "reps", "peak above", "ratio");
  for (const auto& [fam, fs] : summary.items()) {
    for (const auto& [side, s] : fs.items()) {
      if (!s.is_object()) continue;
      const std::string reps = ration::bench::reps_text(s);
      std::string r = "";
      const char* key = side == "pytorch" ? "ratio" : side == "pytorch-installed" ? "ratio_installed"
                        : side == "pytorch-per-block" ? "ratio_budget_per_block"
                        : side == "pytorch-attention" ? "ratio_budget_attention" : nullptr;
      if (key && fs[key].is_number()) r = std::to_string(fs[key].get<double>()).substr(0, 5) + "x";
      std::printf("%-8s %-26s %10.1f %24s %11.2f MiB %8s\n", fam.c_str(), side.c_str(), s["loop_ms_median"].get<double>(),
                  reps.c_str(), s["peak_above_baseline_bytes"].get<int64_t>() / 1048576.0, r.c_str());
    }
  }
  std::printf("(ratio: ration's loop time / the PyTorch side's on that row; ration-budget-M against pytorch-M)\n");
}

int orchestrate(const Args& a) {
  // ration's core: what `ration train` reports it ran (it selects one itself on a CPU OpenBLAS falls back on).
  const std::string core = run_ration("mlp", 3, 0)["blas"]["core"].get<std::string>();
  std::fprintf(stderr, "OpenBLAS core of ration: %s (given to the peer as OPENBLAS_CORETYPE)\n", core.c_str());
  const bool gpt = std::find(a.families.begin(), a.families.end(), "gpt") != a.families.end();
  const std::map<std::string, int64_t> budgets = gpt && a.budgets ? calibrate_budgets(core) : std::map<std::string, int64_t>{};
  std::vector<Run> runs;
  for (int rep = 0; rep < a.reps; ++rep)
    for (const std::string& fam : a.families) run_family(a, fam, core, budgets, rep, runs);
  const json summary = summarise(a, runs);
  print_table(summary);
  const json all = ration::bench::runs_json(runs, "family");
  json threads = json::object();
  for (const std::string& fam : a.families) threads[fam] = config_threads(fam);
  ration::bench::write_json(a.json_path, {{"benchmark", "bench_train_peer"}, {"machine", ration::bench::machine()},
                                          {"reps", a.reps}, {"steps", a.steps}, {"blas_core", core},
                                          {"threads", threads}, {"flush_denormal", false},
                                          {"budgets", budgets}, {"summary", summary}, {"runs", all}});
  std::printf("wrote %s\n", a.json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string s = argv[i];
      auto next = [&] { return ration::bench::flag_value(argc, argv, i, "bench_train_peer"); };
      if (s == "--reps") a.reps = std::stoi(next());
      else if (s == "--steps") a.steps = std::stoi(next());
      else if (s == "--families") a.families = ration::bench::split(next(), ',');
      else if (s == "--no-budgets") a.budgets = false;
      else if (s == "--no-installed") a.installed = false;
      else if (s == "--json") a.json_path = next();
      else
        throw std::runtime_error("bench_train_peer: unknown argument " + s +
                                 " (expected --reps N --steps N --families a,b --no-budgets --no-installed --json FILE)");
    }
    if (a.steps < 3) throw std::runtime_error("bench_train_peer: --steps must be at least 3");
    return orchestrate(a);
  } catch (const std::exception& e) {
    return ration::bench::report_error(e);
  }
}
