// torchscript_peer.cpp — imported TorchScript models (docs/TORCHSCRIPT.md): `ration train` of the exported
// module against PyTorch eager training the SAME nn.Module (bench/peer_torchscript.py), unconstrained and,
// where blocks are natural (resnet18's residual blocks at 224x224 inputs, the BERT encoder's layers), ration under a budget at
// the memory of PyTorch with torch.utils.checkpoint per block against that PyTorch run; interleaved, in one run.
// Owns: the rows (module, export arguments, batch), exporting each once (scripts/export_model.py with
//       --data), the orchestration (repetitions interleaved, the order reversed every other repetition), the
//       same settings on both sides (--threads as ration's train.threads and the peer's torch threads, both
//       thread pools through OMP_NUM_THREADS / OPENBLAS_NUM_THREADS; the OpenBLAS core ration ran, given to
//       the peer as OPENBLAS_CORETYPE; ration's bounded OpenMP spin-wait, given as GOMP_SPINCOUNT; denormals as the CPU leaves them on both sides), the budgets
//       (ration's pre-step bytes + the per-block peer's measured peak above its baseline, calibrated once
//       before the repetitions), the table and the JSON.
// Does not own: the trainer (`ration train`, run as a user runs it, progress lines to /dev/null), the PyTorch
//       loop (bench/peer_torchscript.py under Debian's /usr/bin/python3).
//
// What is timed, on both sides: one iteration of the training loop (next batch, learning rate, forward,
// backward, AdamW step, zero gradients, loss read back): ration's report `time.loop_ms_median`, the peer's
// `loop_ms_median`, each the median over the run's iterations after its first. Peaks: bytes above each
// step's pre-step baseline, by ration's counting ATen allocator on both sides (libration_memprobe.so in the
// peer).
//
// usage: bench_torchscript_peer [--reps 2] [--steps 5] [--threads 2] [--models resnet18,bert,...]
//                               [--json bench/results/torchscript_peer.json]
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
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

// One imported model: how scripts/export_model.py exports it (the peer builds the same module from the same
// arguments), its batch, and whether it has natural blocks for torch.utils.checkpoint per block.
struct Row {
  std::string name;
  std::string source;  // --file ... --name ... [--kwargs ...] or --torchvision NAME (export and peer alike)
  std::string shape;   // --input-shape ... [--input-dtype ...] [--vocab ...] (export only)
  int batch = 8;
  bool per_block = false;
};

const std::string kModels = std::string(RATION_SOURCE_DIR) + "/tests/torchscript/models.py";

std::vector<Row> all_rows() {
  return {
      {"resnet18", "--torchvision resnet18", "--input-shape 3,32,32", 8, false},
      // ImageNet-sized inputs, where activations, not AdamW's first-step moments, set the peak: the row under
      // a budget (at 32x32 or 128x128 both sides peak in the first optimiser step, checkpointing or not)
      {"resnet18_224", "--torchvision resnet18", "--input-shape 3,224,224", 8, true},
      {"mobilenet_v2", "--torchvision mobilenet_v2", "--input-shape 3,32,32", 8, false},
      {"vgg11_bn", "--torchvision vgg11_bn", "--input-shape 3,32,32", 8, false},
      {"bert", "--file " + kModels + " --name BertEncoder --kwargs \"{'dim': 128, 'heads': 4, 'layers': 4, 'vocab': 1000}\"",
       "--input-shape 16 --input-dtype long --vocab 1000", 32, true},
      {"unet", "--file " + kModels + " --name UNetSmall --kwargs \"{'c': 16}\"", "--input-shape 1,32,32", 16, false},
      {"lstm", "--file " + kModels + " --name LSTMClassifier --kwargs \"{'features': 16, 'hidden': 128}\"",
       "--input-shape 32,16", 32, false},
  };
}

struct Args {
  int reps = 2, steps = 5, threads = 2;
  std::vector<std::string> models = {"resnet18", "mobilenet_v2", "vgg11_bn", "bert", "unet", "lstm", "resnet18_224"};
  std::string json_path = "bench/results/torchscript_peer.json";
};

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// Exports `row` into `dir` (model.pt, config.toml, train.pt with enough items for every step).
void export_row(const Row& row, const fs::path& dir, int steps) {
  const int items = row.batch * (steps + 2);
  const std::string cmd = "/usr/bin/python3 " + std::string(RATION_SOURCE_DIR) + "/scripts/export_model.py " + row.source +
                          " " + row.shape + " --out " + dir.string() + " --data " + std::to_string(items) + ",8 > " +
                          (dir.string() + ".log") + " 2>&1";
  fs::create_directories(dir);
  int status = 0;
  ration::bench::run_command(cmd, &status);
  if (status != 0) throw std::runtime_error("bench_torchscript_peer: export failed: " + cmd);
}

// One `ration train` run as a user runs it; its loop time and peaks, with the load average at its start.
json run_ration(const Args& a, const Row& row, const fs::path& dir, int steps, int64_t budget_bytes) {
  const fs::path report = dir / "report.json";
  std::string cmd = ration::bench::thread_env(a.threads) + std::string(RATION_BINARY_DIR) + "/ration train " +
                    (dir / "config.toml").string() + " --steps " + std::to_string(steps) +
                    " --set train.checkpoint_dir= --set train.threads=" + std::to_string(a.threads) +
                    " --set train.batch_size=" + std::to_string(row.batch) + " --report " + report.string();
  if (budget_bytes > 0) cmd += " --memory-budget " + std::to_string(budget_bytes);
  cmd += " > /dev/null 2>&1";
  const std::string load = load_average();
  int status = 0;
  ration::bench::run_command(cmd, &status);
  json r;
  std::ifstream in(report);
  if (in.good()) in >> r;
  fs::remove(report);
  if (status != 0 || r.is_null()) throw std::runtime_error("bench_torchscript_peer: failed: " + cmd);
  return {{"loop_ms_median", r["time"]["loop_ms_median"]},
          {"step_ms_median", r["time"]["step_ms_median"]},
          {"peak_above_baseline_bytes", r["memory"]["step_peak_above_baseline_bytes"]},
          {"peak_bytes", r["memory"]["peak_bytes"]},
          {"budget_bytes", budget_bytes > 0 ? json(budget_bytes) : json(nullptr)},
          {"imported_ops", r.value("imported_ops", json(nullptr))},
          {"blas", r["blas"]},
          {"openmp", r.value("openmp", json(nullptr))},
          {"load", load}};
}

// What `ration train` sets for its OpenMP threads when it runs more than one (base/openmp.h): the peer gets
// the same, so both sides run with the same process settings.
std::string spin_env(int threads) {
  return threads > 1 ? std::string("GOMP_SPINCOUNT=") + ration::openmp::kBoundedSpinCount + " " : std::string();
}

// One peer run: `checkpoint` none / per-block, with ration's OpenBLAS core and OpenMP spin-wait.
json run_peer(const Args& a, const Row& row, const fs::path& dir, int steps, const std::string& checkpoint,
              const std::string& core) {
  std::string cmd = ration::bench::thread_env(a.threads) + "OPENBLAS_CORETYPE=" + core + " " + spin_env(a.threads) +
                    ration::bench::python_peer(RATION_SOURCE_DIR, "peer_torchscript.py") + " " + row.source + " --data " +
                    (dir / "train.pt").string() + " --batch " + std::to_string(row.batch) + " --steps " +
                    std::to_string(steps - 1) + " --warmup 1 --threads " + std::to_string(a.threads) + " --checkpoint " +
                    checkpoint + " --probe " + RATION_PROBE_PATH;
  const std::string load = load_average();
  const std::vector<json> lines = ration::bench::json_lines(ration::bench::run_command(cmd + " 2>&1"));
  if (lines.empty() || !lines.back().contains("loop_ms_median"))
    throw std::runtime_error("bench_torchscript_peer: failed: " + cmd);
  json r = lines.back();
  r["load"] = load;
  return r;
}

using Run = ration::bench::PeerRun;  // row: the model

// ration's feasible minimum for the row (`ration plan`'s minimum_peak_bytes).
int64_t ration_minimum(const Args& a, const Row& row, const fs::path& dir) {
  const std::string cmd = ration::bench::thread_env(a.threads) + std::string(RATION_BINARY_DIR) + "/ration plan " +
                          (dir / "config.toml").string() + " --set train.threads=" + std::to_string(a.threads) +
                          " --set train.batch_size=" + std::to_string(row.batch) + " --memory-budget 1TiB --json 2>/dev/null";
  int status = 0;
  const json plan = json::parse(ration::bench::run_command(cmd, &status), nullptr, false);
  if (status != 0 || plan.is_discarded()) throw std::runtime_error("bench_torchscript_peer: failed: " + cmd);
  return plan["minimum_peak_bytes"].get<int64_t>();
}

// The budget that gives ration's step at most the per-block peer's peak above its baseline: ration's
// pre-step bytes (its unconstrained peak minus its peak above baseline) plus that peak; ration's feasible
// minimum where that is below it (the row then compares ration at its floor, which the table says).
int64_t calibrate_budget(const Args& a, const Row& row, const fs::path& dir, const std::string& core,
                         json& calibration) {
  const json plain = run_ration(a, row, dir, 3, 0);
  const json peer = run_peer(a, row, dir, 3, "per-block", core);
  const int64_t equal_memory = plain["peak_bytes"].get<int64_t>() - plain["peak_above_baseline_bytes"].get<int64_t>() +
                               peer["peak_above_baseline_bytes"].get<int64_t>();
  const int64_t minimum = ration_minimum(a, row, dir);
  const int64_t budget = std::max(equal_memory, minimum);
  calibration[row.name] = {{"per_block_equal_memory_budget", equal_memory}, {"ration_minimum", minimum},
                           {"budget", budget}, {"raised_to_ration_minimum", budget > equal_memory}};
  if (budget > equal_memory)
    std::fprintf(stderr, "%s: per-block memory (budget %lld bytes) is below ration's feasible minimum %lld: ration runs "
                 "at its minimum\n", row.name.c_str(), static_cast<long long>(equal_memory),
                 static_cast<long long>(minimum));
  std::fprintf(stderr, "%s: budget %lld bytes (per-block peer's peak above baseline %lld, ration unconstrained %lld)\n",
               row.name.c_str(), static_cast<long long>(budget),
               static_cast<long long>(peer["peak_above_baseline_bytes"].get<int64_t>()),
               static_cast<long long>(plain["peak_above_baseline_bytes"].get<int64_t>()));
  return budget;
}

// One repetition of one model: every side once, in order or reversed.
void run_row(const Args& a, const Row& row, const fs::path& dir, const std::string& core, int64_t budget, int rep,
             std::vector<Run>& runs) {
  std::vector<std::pair<std::string, std::function<json()>>> sides = {
      {"ration", [&] { return run_ration(a, row, dir, a.steps, 0); }},
      {"pytorch", [&] { return run_peer(a, row, dir, a.steps, "none", core); }}};
  if (budget > 0) {
    sides.push_back({"pytorch-per-block", [&] { return run_peer(a, row, dir, a.steps, "per-block", core); }});
    sides.push_back({"ration-budget-per-block", [&] { return run_ration(a, row, dir, a.steps, budget); }});
  }
  if (rep % 2 == 1) std::reverse(sides.begin(), sides.end());
  for (auto& [side, fn] : sides) {
    json r = fn();
    r["rep"] = rep + 1;
    std::fprintf(stderr, "[rep %d] %-12s %-24s loop %8.1f ms  peak above %7.2f MiB  (load %s)\n", rep + 1,
                 row.name.c_str(), side.c_str(), r["loop_ms_median"].get<double>(),
                 r.value("peak_above_baseline_bytes", int64_t{0}) / 1048576.0, r["load"].get<std::string>().c_str());
    runs.push_back({row.name, side, r});
  }
}

// Per model and side: the median over repetitions of each run's median loop time; the ratios.
json summarise(const Args& a, const std::vector<Run>& runs) {
  json summary = json::object();
  for (const std::string& model : a.models) {
    json ms = ration::bench::summarise_sides(runs, model);
    ms["ratio"] = ration::bench::loop_ratio(ms, "ration", "pytorch");
    ms["ratio_budget_per_block"] = ration::bench::loop_ratio(ms, "ration-budget-per-block", "pytorch-per-block");
    summary[model] = ms;
  }
  return summary;
}

void print_table(const json& summary) {
  std::printf("\n%-12s %-24s %10s %20s %14s %8s\n", "model", "side", "loop ms", "reps", "peak above", "ratio");
  for (const auto& [model, ms] : summary.items()) {
    for (const auto& [side, s] : ms.items()) {
      if (!s.is_object()) continue;
      const std::string reps = ration::bench::reps_text(s);
      const char* key = side == "pytorch" ? "ratio" : side == "pytorch-per-block" ? "ratio_budget_per_block" : nullptr;
      std::string r;
      if (key && ms[key].is_number()) r = std::to_string(ms[key].get<double>()).substr(0, 5) + "x";
      std::printf("%-12s %-24s %10.1f %20s %11.2f MiB %8s\n", model.c_str(), side.c_str(), s["loop_ms_median"].get<double>(),
                  reps.c_str(), s["peak_above_baseline_bytes"].get<int64_t>() / 1048576.0, r.c_str());
    }
  }
  std::printf("(ratio: ration's loop time / PyTorch's on that row; ration-budget-per-block against pytorch-per-block)\n");
}

int orchestrate(const Args& a) {
  std::vector<Row> rows;
  for (const std::string& name : a.models) {
    const std::vector<Row> all = all_rows();
    const auto it = std::find_if(all.begin(), all.end(), [&](const Row& r) { return r.name == name; });
    if (it == all.end()) throw std::runtime_error("bench_torchscript_peer: unknown model " + name);
    rows.push_back(*it);
  }
  const fs::path work = fs::temp_directory_path() / ("ration-torchscript-peer-" + std::to_string(::getpid()));
  for (const Row& row : rows) export_row(row, work / row.name, a.steps);
  // ration's core: what `ration train` reports it ran (it selects one itself where OpenBLAS falls back).
  const std::string core = run_ration(a, rows.front(), work / rows.front().name, 2, 0)["blas"]["core"].get<std::string>();
  std::fprintf(stderr, "OpenBLAS core of ration: %s (given to the peer as OPENBLAS_CORETYPE)\n", core.c_str());
  std::map<std::string, int64_t> budgets;
  json calibration = json::object();
  for (const Row& row : rows)
    if (row.per_block) budgets[row.name] = calibrate_budget(a, row, work / row.name, core, calibration);
  std::vector<Run> runs;
  for (int rep = 0; rep < a.reps; ++rep)
    for (const Row& row : rows)
      run_row(a, row, work / row.name, core, budgets.count(row.name) ? budgets.at(row.name) : 0, rep, runs);
  fs::remove_all(work);
  const json summary = summarise(a, runs);
  print_table(summary);
  const json all = ration::bench::runs_json(runs, "model");
  json models = json::object();
  for (const Row& row : rows) models[row.name] = {{"source", row.source}, {"input", row.shape}, {"batch", row.batch}};
  ration::bench::write_json(a.json_path, {{"benchmark", "bench_torchscript_peer"}, {"machine", ration::bench::machine()},
                                          {"reps", a.reps}, {"steps", a.steps}, {"threads", a.threads},
                                          {"blas_core", core}, {"flush_denormal", false}, {"models", models},
                                          {"budgets", budgets}, {"calibration", calibration}, {"summary", summary}, {"runs", all}});
  std::printf("wrote %s\n", a.json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string s = argv[i];
      auto next = [&] { return ration::bench::flag_value(argc, argv, i, "bench_torchscript_peer"); };
      if (s == "--reps") a.reps = std::stoi(next());
      else if (s == "--steps") a.steps = std::stoi(next());
      else if (s == "--threads") a.threads = std::stoi(next());
      else if (s == "--models") a.models = ration::bench::split(next(), ',');
      else if (s == "--json") a.json_path = next();
      else
        throw std::runtime_error("bench_torchscript_peer: unknown argument " + s +
                                 " (expected --reps N --steps N --threads N --models a,b --json FILE)");
    }
    if (a.steps < 3) throw std::runtime_error("bench_torchscript_peer: --steps must be at least 3");
    return orchestrate(a);
  } catch (const std::exception& e) {
    return ration::bench::report_error(e);
  }
}
