// bench_peer.cpp — ration vs the model a PyTorch user would write, per model family, in one run.
// Owns: the orchestration (repetitions interleaved ration / PyTorch, alternating which side goes first;
//       identical thread settings: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and the intra-op count given to
//       both processes; the peer gets OPENBLAS_CORETYPE = the OpenBLAS core ration's library runs), the
//       ration worker (one family's training steps through train::StepRuntime on a fixed batch: forward +
//       backward + clip + optimiser + zero), the table and the JSON.
// Does not own: the PyTorch models (bench/peer_models.py, run by Debian's /usr/bin/python3), the
//       planner, the model code.
//
// Each side runs in its own process (so each has its own counting allocator, thread pools and warm-up):
//   bench_peer --worker ration --family F ...  (this binary again)
//   /usr/bin/python3 bench/peer_models.py --family F ...
// Medians over --steps steps after --warmup; the verdict per family is the ratio of the medians over the
// repetitions (wall; CPU shown too); peaks above the pre-step baseline measured by the same counting
// allocator (libration_memprobe.so in the peer). The engine's step without the trainer's loop around it:
// `ration train` itself against a PyTorch training loop, and budgets against torch.utils.checkpoint, are
// bench_train_peer's (bench/train_peer.cpp).
//
// usage: bench_peer [--reps 3] [--steps 20] [--warmup 3] [--threads N] [--families mlp,cnn,gpt,lstm_lm]
//                   [--json FILE] [--set k=v ...]
//                   [--device cpu|cuda]   (cuda: both sides on the GPU, each step synchronised, peaks from
//                   each side's CUDA caching allocator; the peer's interpreter is $RATION_PEER_PYTHON)
//        bench_peer --variants 'train.threads=1|train.threads=2' [--reps 3] [--families ...] [--json FILE]
//          ration only: each family's step under each variant (config overrides, ',' within a variant,
//          '|' between variants), interleaved per repetition (the order rotates), OMP_NUM_THREADS =
//          OPENBLAS_NUM_THREADS = the variant's train.threads (else the family's); the table names the
//          fastest variant per family by median wall and by median CPU time (how the per-family
//          train.threads defaults were chosen; also train.malloc_keep_freed=0 against the default).
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/base/blas.h"
#include "ration/base/check.h"
#include "ration/core/compute_threads.h"
#include "ration/base/allocator.h"
#include "ration/optim/adamw.h"
#include "ration/optim/sgd.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

using namespace ration;
using nlohmann::json;

namespace {
using bench::median;
using bench::split;

struct Args {
  int reps = 3, steps = 20, warmup = 3, threads = 0;  // threads 0: each family's train.threads
  std::vector<std::string> families = {"mlp", "cnn", "gpt", "lstm_lm"};
  std::string json_path = "bench/results/bench_peer.json";
  // worker
  std::string worker, family, mode = "plain";
  std::string device = "cpu";  // cuda: both sides on the GPU (peaks from the caching allocators)
  bool counting_allocator = true;  // worker: false measures the counting allocator's own cost
  std::vector<std::string> sets;      // worker: config overrides (--set k=v)
  std::vector<std::string> variants;  // orchestrator: ration-only comparison of override sets (--variants)
};

std::string config_path(const std::string& family) { return std::string(RATION_SOURCE_DIR) + "/configs/" + family + ".toml"; }

// The sizes bench/peer_models.py must use, read from the same config ration builds from.
json peer_config(const std::string& family, int64_t batch, Config& cfg, const train::RunSettings& r) {
  json c = {{"batch", batch}, {"optim", r.optimizer}, {"lr", r.lr}, {"weight_decay", r.weight_decay},
            {"clip", r.clip_grad_norm}, {"dropout", cfg.get_double("model.dropout", 0.0)}};
  if (r.optimizer == "sgd") {
    c["momentum"] = r.momentum;
    c["nesterov"] = r.nesterov;
  }
  if (family == "mlp") c["hidden"] = cfg.get_int_list("model.hidden", {});
  if (family == "cnn") {
    c["channels"] = cfg.get_int_list("model.channels", {});
    c["fc_hidden"] = cfg.get_int("model.fc_hidden", 128);
    c["kernel_size"] = cfg.get_int("model.kernel_size", 3);
  }
  if (family == "gpt") {
    for (const char* k : {"n_layer", "n_head", "n_embd", "block_size"}) c[k] = cfg.get_int(std::string("model.") + k, 0);
  }
  if (family == "lstm_lm") {
    for (const char* k : {"n_embd", "hidden_size", "n_layer"}) c[k] = cfg.get_int(std::string("model.") + k, 0);
    c["seq_len"] = cfg.get_int("data.seq_len", 64);
  }
  return c;
}

json threads_json() {
  const ComputeThreads t = compute_threads();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  return {{"aten", t.aten}, {"blas", t.blas}, {"blas_library", t.blas_library}, {"OMP_NUM_THREADS", omp ? omp : ""},
          {"OPENBLAS_NUM_THREADS", blas ? blas : ""}};
}

struct Series {
  std::vector<double> ms, cpu;
  int64_t peak_above = 0;
};

Series run_steps(train::StepRuntime& rt, models::Model& model, const data::Batch& batch, train::StepOptions o, int warmup,
                 int steps) {
  Series s;
  for (int i = 0; i < warmup + steps; ++i) {
    o.seed = 100 + static_cast<uint64_t>(i);
    const train::StepStats st = rt.measure_step(model, batch, o);
    if (i < warmup) continue;
    s.ms.push_back(st.ms);
    s.cpu.push_back(st.cpu_ms);
    s.peak_above = std::max(s.peak_above, st.peak_above_baseline());
  }
  return s;
}

// One ration process: full training steps on a fixed batch.
int worker(const Args& a) {
  if (a.counting_allocator) memory::install_counting_allocator();
  std::vector<std::string> overrides;
  if (a.threads > 0) overrides.push_back("train.threads=" + std::to_string(a.threads));
  for (const auto& o : a.sets) overrides.push_back(o);
  if (a.device != "cpu") overrides.push_back("train.device=" + a.device);
  const bench::ModelBench mb = bench::load_model_bench(config_path(a.family), overrides);
  const train::RunSettings& r = mb.run;
  models::Model& model = mb.model();
  const data::Batch& batch = mb.batch;
  json out = {{"side", "ration"}, {"family", a.family}, {"mode", a.mode}, {"steps", a.steps}, {"warmup", a.warmup},
              {"threads", threads_json()},
              {"allocator", a.counting_allocator ? "counting" : "default"}, {"overrides", overrides}};
  std::unique_ptr<optim::Optimizer> opt = train::build_optimizer(r, model.named_parameters());
  train::StepRuntime rt;
  train::StepOptions o;
  o.optimizer = opt.get();
  o.clip_grad_norm = r.clip_grad_norm;
  const Series s = run_steps(rt, model, batch, o, a.warmup, a.steps);
  out["step_ms_median"] = median(s.ms);
  out["step_cpu_ms_median"] = median(s.cpu);
  out["step_ms"] = s.ms;
  out["peak_above_baseline_bytes"] = s.peak_above;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The last JSON line a side printed (its result); throws with the output when there is none.
json last_json_line(const std::string& cmd) {
  const std::string text = bench::run_command(cmd);
  const std::vector<json> lines = bench::json_lines(text);
  if (lines.empty()) throw Error("bench_peer: no JSON result from: " + cmd + "\noutput:\n" + text);
  return lines.back();
}

// One run of repetition `rep` (from 0): its result tagged with "rep" and `key` = `label`, progress on stderr.
json run_tagged(const std::string& cmd, int rep, const std::string& fam, const char* key, const std::string& label) {
  std::fprintf(stderr, "[rep %d] %s %s ...\n", rep + 1, fam.c_str(), label.c_str());
  json r = last_json_line(cmd);
  r["rep"] = rep + 1;
  r[key] = label;
  if (r.contains("step_ms_median"))
    std::fprintf(stderr, "         wall %.1f ms, cpu %.1f ms\n", r["step_ms_median"].get<double>(),
                 r["step_cpu_ms_median"].get<double>());
  return r;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  RATION_CHECK(n > 0, "bench_peer: cannot read /proc/self/exe");
  buf[n] = 0;
  return buf;
}

int family_threads(const std::string& family, int forced) {
  if (forced > 0) return forced;
  Config cfg = Config::from_file(config_path(family));
  return static_cast<int>(cfg.get_int("train.threads", 2));
}

int orchestrate(const Args& a) {
  const std::string exe = self_exe();
  // The peer's interpreter: Debian's /usr/bin/python3 (python3-torch), or RATION_PEER_PYTHON (a GPU
  // machine's CUDA PyTorch).
  const char* peer_python = std::getenv("RATION_PEER_PYTHON");
  const std::string peer = std::string(peer_python ? peer_python : "/usr/bin/python3") + " " +
                           std::string(RATION_SOURCE_DIR) + "/bench/peer_models.py";
  // On a GPU both sides read their caching allocator's peak; on CPU the peer counts with our allocator.
  const std::string probe = a.device == "cpu" ? std::string(" --probe ") + RATION_PROBE_PATH : std::string();
  // The peer runs the OpenBLAS core ration's process runs (the library's choice here, or ration's: base/blas.h).
  const std::string core = blas::core();
  const std::string peer_core = core.empty() ? std::string() : "OPENBLAS_CORETYPE=" + core + " ";

  json runs = json::array();
  for (int rep = 0; rep < a.reps; ++rep) {
    for (const std::string& fam : a.families) {
      const int t = family_threads(fam, a.threads);
      const std::string env = bench::thread_env(t);
      const std::string common = " --family " + fam + " --steps " + std::to_string(a.steps) + " --warmup " +
                                 std::to_string(a.warmup) + " --threads " + std::to_string(t) + " --device " + a.device;
      std::string sets;
      for (const auto& o : a.sets) sets += " --set " + o;
      // The peer's sizes come from the same config (read here, passed as JSON).
      train::Setup probe_setup;
      json pc;
      {
        Config cfg = train::load_config(config_path(fam), a.sets);
        const train::RunSettings r = train::read_run_settings(cfg);
        pc = peer_config(fam, cfg.get_int("train.batch_size", 64), cfg, r);
      }
      const std::string pconf = " --config '" + pc.dump() + "'";
      std::vector<std::pair<std::string, std::string>> cmds = {
          {"ration", env + exe + " --worker ration" + common + sets},
          {"pytorch", env + peer_core + peer + common + pconf + probe}};
      if (rep % 2 == 1) std::reverse(cmds.begin(), cmds.end());  // alternate who goes first
      for (const auto& [side, cmd] : cmds) runs.push_back(run_tagged(cmd, rep, fam, "run", side));
    }
  }

  // Summary: per family, medians over repetitions of each side's median.
  json summary = json::object();
  std::printf("\n%-8s %-28s %8s %8s %12s %12s   (threads: ATen = OpenBLAS = OMP)\n", "family", "side", "wall ms",
              "cpu ms", "reps wall", "peak above");
  auto pick = [&](const std::string& fam, const std::string& run) {
    std::vector<const json*> v;
    for (const auto& r : runs)
      if (r["family"] == fam && r["run"] == run) v.push_back(&r);
    return v;
  };
  bool all_ok = true;
  for (const std::string& fam : a.families) {
    json fs;
    for (const char* run : {"ration", "pytorch"}) {
      std::vector<double> w, c;
      std::string reps;
      int64_t peak = 0;
      for (const json* r : pick(fam, run)) {
        w.push_back((*r)["step_ms_median"].get<double>());
        c.push_back((*r)["step_cpu_ms_median"].get<double>());
        peak = std::max<int64_t>(peak, r->value("peak_above_baseline_bytes", int64_t{0}));
        char b[16];
        std::snprintf(b, sizeof b, "%s%.0f", reps.empty() ? "" : "/", w.back());
        reps += b;
      }
      fs[run] = {{"wall_ms_median", median(w)}, {"cpu_ms_median", median(c)}, {"wall_ms_reps", w}, {"cpu_ms_reps", c},
                 {"peak_above_baseline_bytes", peak}};
      std::printf("%-8s %-28s %8.1f %8.1f %12s %12s\n", fam.c_str(), run, median(w), median(c), reps.c_str(),
                  memory::format_bytes(peak).c_str());
    }
    const double ratio = fs["ration"]["wall_ms_median"].get<double>() / fs["pytorch"]["wall_ms_median"].get<double>();
    const double cratio = fs["ration"]["cpu_ms_median"].get<double>() / fs["pytorch"]["cpu_ms_median"].get<double>();
    fs["ratio_wall"] = ratio;
    fs["ratio_cpu"] = cratio;
    fs["threads"] = family_threads(fam, a.threads);
    fs["met"] = ratio <= 1.0;
    all_ok = all_ok && ratio <= 1.0;
    std::printf("%-8s ration / pytorch: wall %.3fx, cpu %.3fx  (threads %d)  %s\n", fam.c_str(), ratio, cratio,
                family_threads(fam, a.threads), ratio <= 1.0 ? "ok" : "SLOWER");
    summary[fam] = fs;
  }

  std::printf("\nall targets met: %s\n", all_ok ? "yes" : "no");
  summary["all_met"] = all_ok;

  bench::write_json(a.json_path, {{"benchmark", "bench_peer"}, {"device", a.device}, {"overrides", a.sets},
                                  {"blas_core", core}, {"flush_denormal", false},
                                  {"reps", a.reps}, {"steps", a.steps}, {"warmup", a.warmup}, {"summary", summary},
                                  {"runs", runs}});
  std::printf("wrote %s\n", a.json_path.c_str());
  return 0;
}

// ration only: every family under every variant (a list of config overrides), interleaved.
int compare_variants(const Args& a) {
  const std::string exe = self_exe();
  json runs = json::array();
  const size_t nv = a.variants.size();
  auto variant_threads = [&](const std::string& fam, const std::string& variant) {
    int t = family_threads(fam, a.threads);
    for (const auto& o : split(variant, ','))
      if (o.rfind("train.threads=", 0) == 0) t = std::stoi(o.substr(std::string("train.threads=").size()));
    return t;
  };
  for (int rep = 0; rep < a.reps; ++rep) {
    for (const std::string& fam : a.families) {
      for (size_t k = 0; k < nv; ++k) {
        const std::string& variant = a.variants[(k + static_cast<size_t>(rep)) % nv];  // rotate who goes first
        const int t = variant_threads(fam, variant);
        std::string cmd = bench::thread_env(t) + exe + " --worker ration --family " + fam + " --steps " +
                          std::to_string(a.steps) + " --warmup " + std::to_string(a.warmup) + " --threads " +
                          std::to_string(t);
        for (const auto& o : split(variant, ',')) cmd += " --set " + o;
        runs.push_back(run_tagged(cmd, rep, fam, "variant", variant));
      }
    }
  }
  json summary = json::object();
  std::printf("\n%-8s %-40s %9s %9s %20s\n", "family", "variant (ration)", "wall ms", "cpu ms", "reps wall");
  for (const std::string& fam : a.families) {
    json fs = json::object();
    std::string best_wall, best_cpu;
    double bw = 0, bc = 0;
    for (const std::string& variant : a.variants) {
      std::vector<double> w, c;
      std::string reps;
      for (const auto& r : runs) {
        if (r["family"] != fam || r["variant"] != variant) continue;
        w.push_back(r["step_ms_median"].get<double>());
        c.push_back(r["step_cpu_ms_median"].get<double>());
        char b[24];
        std::snprintf(b, sizeof b, "%s%.1f", reps.empty() ? "" : "/", w.back());
        reps += b;
      }
      const double mw = median(w), mc = median(c);
      fs[variant] = {{"wall_ms_median", mw}, {"cpu_ms_median", mc}, {"wall_ms_reps", w}, {"cpu_ms_reps", c}};
      if (best_wall.empty() || mw < bw) best_wall = variant, bw = mw;
      if (best_cpu.empty() || mc < bc) best_cpu = variant, bc = mc;
      std::printf("%-8s %-40s %9.1f %9.1f %20s\n", fam.c_str(), variant.c_str(), mw, mc, reps.c_str());
    }
    fs["fastest_wall"] = best_wall;
    fs["fastest_cpu"] = best_cpu;
    std::printf("%-8s fastest: wall %s, cpu %s\n", fam.c_str(), best_wall.c_str(), best_cpu.c_str());
    summary[fam] = fs;
  }
  bench::write_json(a.json_path, {{"benchmark", "bench_peer --variants"}, {"reps", a.reps}, {"steps", a.steps},
                                  {"warmup", a.warmup}, {"variants", a.variants}, {"summary", summary},
                                  {"runs", runs}});
  std::printf("wrote %s\n", a.json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string s = argv[i];
      auto next = [&] { return ration::bench::flag_value(argc, argv, i, "bench_peer"); };
      if (s == "--reps") a.reps = std::stoi(next());
      else if (s == "--steps") a.steps = std::stoi(next());
      else if (s == "--warmup") a.warmup = std::stoi(next());
      else if (s == "--threads") a.threads = std::stoi(next());
      else if (s == "--families") a.families = split(next(), ',');
      else if (s == "--default-allocator") a.counting_allocator = false;
      else if (s == "--json") a.json_path = next();
      else if (s == "--worker") a.worker = next();
      else if (s == "--device") a.device = next();
      else if (s == "--family") a.family = next();
      else if (s == "--mode") a.mode = next();
      else if (s == "--set") a.sets.push_back(next());
      else if (s == "--variants") a.variants = split(next(), '|');
      else
        throw Error("bench_peer: unknown argument " + s +
                    " (expected --reps N --steps N --warmup N --threads N --families a,b "
                    "--json FILE --variants 'k=v,k=v|k=v' --set k=v --device cpu|cuda)");
    }
    if (a.device != "cpu" && a.device != "cuda")
      throw Error("bench_peer: --device '" + a.device + "' is not valid; expected cpu or cuda");
    if (!a.worker.empty()) return worker(a);
    return a.variants.empty() ? orchestrate(a) : compare_variants(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
