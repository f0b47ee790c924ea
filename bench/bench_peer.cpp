// bench_peer.cpp — ration vs the model a PyTorch user would write, per model family, in one run.
// Owns: the orchestration (repetitions interleaved ration / PyTorch, alternating which side goes first;
//       identical thread settings: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and the intra-op count given to
//       both processes), the ration worker (one family's training steps through train::StepRuntime on a
//       fixed batch: forward + backward + clip + optimiser, or forward + backward under a memory plan for
//       the gpt budget curve), the table and the JSON.
// Does not own: the PyTorch models (bench/peer_models.py, run by Debian's /usr/bin/python3), the
//       planner, the model code.
//
// Each side runs in its own process (so each has its own counting allocator, thread pools and warm-up):
//   bench_peer --worker ration --family F ...  (this binary again)
//   /usr/bin/python3 bench/peer_models.py --family F ...
// Medians over --steps steps after --warmup; the verdict per family is the ratio of the medians over the
// repetitions (wall; CPU shown too). gpt budgets: ration's plan (knapsack) at fractions of the way from
// the feasible minimum to the unconstrained peak, forward + backward only, against PyTorch plain and
// per-block torch.utils.checkpoint (bench/peer_models.py --mode fwd-bwd / per-block), peaks above the
// pre-step baseline measured by the same counting allocator (libration_memprobe.so in the peer).
//
// usage: bench_peer [--reps 3] [--steps 20] [--warmup 3] [--threads N] [--families mlp,cnn,gpt,lstm_lm]
//                   [--no-budgets] [--fractions 0.75,0.5,0.25,0] [--json FILE] [--set k=v ...]
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
#include "ration/base/check.h"
#include "ration/core/compute_threads.h"
#include "ration/base/allocator.h"
#include "ration/plan/planner.h"
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
  bool budgets = true;
  std::string json_path = "bench/results/bench_peer.json";
  // worker
  std::string worker, family, mode = "plain";
  std::string device = "cpu";  // cuda: both sides on the GPU (peaks from the caching allocators)
  bool counting_allocator = true;  // worker: false measures the counting allocator's own cost
  std::vector<double> fractions;
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

// One ration process: plain training steps, or (mode "budgets") the gpt budget points.
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
  if (a.mode == "plain") {
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
  // budgets: forward + backward (gradients cleared), as the peer's fwd-bwd / per-block modes
  train::StepRuntime planned;
  const memory::StepProfile& profile = planned.profile(model, batch, 100);
  memory::PlanOptions loose;
  loose.budget_bytes = int64_t{1} << 40;
  const memory::Plan full = memory::make_plan(profile, loose);
  const int64_t hi = full.unconstrained_peak_bytes, lo = full.minimum_peak_bytes;
  json points = json::array();
  train::StepOptions o;
  o.gradients = train::GradientsAfter::Cleared;
  {
    train::StepRuntime plain;
    const Series s = run_steps(plain, model, batch, o, a.warmup, a.steps);
    points.push_back({{"budget", "unconstrained"}, {"budget_bytes", hi}, {"predicted_peak_bytes", hi},
                      {"step_ms_median", median(s.ms)}, {"step_cpu_ms_median", median(s.cpu)},
                      {"peak_above_baseline_bytes", s.peak_above}});
  }
  for (double f : a.fractions) {
    memory::PlanOptions po;
    po.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
    const memory::Plan& plan = planned.use_plan(memory::make_plan(profile, po));
    const Series s = run_steps(planned, model, batch, o, a.warmup, a.steps);
    char label[32];
    std::snprintf(label, sizeof label, "%.2f", f);
    points.push_back({{"budget", label}, {"budget_bytes", po.budget_bytes}, {"predicted_peak_bytes", plan.prediction.peak_bytes},
                      {"step_ms_median", median(s.ms)}, {"step_cpu_ms_median", median(s.cpu)},
                      {"peak_above_baseline_bytes", s.peak_above}});
  }
  out["baseline_bytes"] = profile.baseline_bytes;
  out["points"] = points;
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
  const std::vector<double> fractions = a.fractions.empty() ? std::vector<double>{0.75, 0.5, 0.25, 0.0} : a.fractions;
  std::string fr;
  for (double f : fractions) fr += (fr.empty() ? "" : ",") + std::to_string(f);

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
          {"pytorch", env + peer + common + pconf + probe}};
      if (fam == "gpt" && a.budgets) {
        cmds.push_back({"ration-budgets", env + exe + " --worker ration --mode budgets --fractions " + fr + common + sets});
        cmds.push_back({"pytorch-fwd-bwd", env + peer + common + pconf + " --mode fwd-bwd" + probe});
        cmds.push_back({"pytorch-per-block", env + peer + common + pconf + " --mode per-block" + probe});
      }
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

  // gpt budgets: each ration point against the fastest PyTorch mode whose peak is at or below its own.
  json budget_rows = json::array();
  if (a.budgets && std::find(a.families.begin(), a.families.end(), "gpt") != a.families.end()) {
    std::map<std::string, std::vector<double>> w, c;
    std::map<std::string, int64_t> peak, predicted, budget;
    std::vector<std::string> order;
    for (const json* r : pick("gpt", "ration-budgets"))
      for (const auto& p : (*r)["points"]) {
        const std::string b = p["budget"];
        if (!w.count(b)) order.push_back(b);
        w[b].push_back(p["step_ms_median"]);
        c[b].push_back(p["step_cpu_ms_median"]);
        peak[b] = std::max<int64_t>(peak[b], p["peak_above_baseline_bytes"].get<int64_t>());
        predicted[b] = p["predicted_peak_bytes"];
        budget[b] = p["budget_bytes"];
      }
    struct PeerMode {
      std::string name;
      double wall, cpu;
      int64_t peak;
    };
    std::vector<PeerMode> modes;
    for (const char* m : {"pytorch-fwd-bwd", "pytorch-per-block"}) {
      std::vector<double> pw, pcpu;
      int64_t pk = 0;
      for (const json* r : pick("gpt", m)) {
        pw.push_back((*r)["step_ms_median"]);
        pcpu.push_back((*r)["step_cpu_ms_median"]);
        pk = std::max<int64_t>(pk, (*r)["peak_above_baseline_bytes"].get<int64_t>());
      }
      if (!pw.empty()) modes.push_back({m, median(pw), median(pcpu), pk});
    }
    std::printf("\ngpt forward+backward under a budget (knapsack plan; fraction of the way from the feasible minimum "
                "to the unconstrained peak)\n%-13s %11s %11s %12s %8s %8s   %-18s %12s %8s %8s %s\n",
                "budget", "bytes", "predicted", "peak above", "wall ms", "cpu ms", "pytorch peer", "peak above",
                "wall ms", "cpu ms", "verdict");
    for (const auto& pm : modes)
      std::printf("%-13s %11s %11s %12s %8s %8s   %-18s %12s %8.1f %8.1f\n", "", "", "", "", "", "", pm.name.c_str(),
                  memory::format_bytes(pm.peak).c_str(), pm.wall, pm.cpu);
    for (const std::string& b : order) {
      // The PyTorch option a user would pick at this memory: the fastest mode whose peak fits under ours.
      const PeerMode* best = nullptr;
      for (const auto& pm : modes)
        if (pm.peak <= peak[b] && (!best || pm.wall < best->wall)) best = &pm;
      const double rw = median(w[b]), rc = median(c[b]);
      std::string verdict = "PyTorch has no mode this small: ration only";
      bool ok = true;
      if (best) {
        ok = rw <= best->wall;
        char v[96];
        std::snprintf(v, sizeof v, "%.3fx wall %s", rw / best->wall, ok ? "ok" : "SLOWER");
        verdict = v;
      }
      all_ok = all_ok && ok;
      std::printf("%-13s %11s %11s %12s %8.1f %8.1f   %-18s %12s %8s %8s %s\n", b.c_str(),
                  memory::format_bytes(budget[b]).c_str(), memory::format_bytes(predicted[b]).c_str(),
                  memory::format_bytes(peak[b]).c_str(), rw, rc, best ? best->name.c_str() : "-",
                  best ? memory::format_bytes(best->peak).c_str() : "-", "", "", verdict.c_str());
      budget_rows.push_back({{"budget", b}, {"budget_bytes", budget[b]}, {"predicted_peak_bytes", predicted[b]},
                             {"peak_above_baseline_bytes", peak[b]}, {"wall_ms_median", rw}, {"cpu_ms_median", rc},
                             {"wall_ms_reps", w[b]}, {"peer", best ? json(best->name) : json(nullptr)},
                             {"peer_wall_ms_median", best ? json(best->wall) : json(nullptr)},
                             {"peer_peak_above_baseline_bytes", best ? json(best->peak) : json(nullptr)}, {"met", ok}});
    }
    json peer_modes = json::array();
    for (const auto& pm : modes)
      peer_modes.push_back({{"mode", pm.name}, {"wall_ms_median", pm.wall}, {"cpu_ms_median", pm.cpu},
                            {"peak_above_baseline_bytes", pm.peak}});
    summary["gpt_budgets"] = {{"points", budget_rows}, {"peer_modes", peer_modes}};
  }
  std::printf("\nall targets met: %s\n", all_ok ? "yes" : "no");
  summary["all_met"] = all_ok;

  bench::write_json(a.json_path, {{"benchmark", "bench_peer"}, {"device", a.device}, {"overrides", a.sets},
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
      auto next = [&]() -> std::string {
        RATION_CHECK(i + 1 < argc, "bench_peer: ", s, " needs a value");
        return argv[++i];
      };
      if (s == "--reps") a.reps = std::stoi(next());
      else if (s == "--steps") a.steps = std::stoi(next());
      else if (s == "--warmup") a.warmup = std::stoi(next());
      else if (s == "--threads") a.threads = std::stoi(next());
      else if (s == "--families") a.families = split(next(), ',');
      else if (s == "--no-budgets") a.budgets = false;
      else if (s == "--default-allocator") a.counting_allocator = false;
      else if (s == "--json") a.json_path = next();
      else if (s == "--worker") a.worker = next();
      else if (s == "--device") a.device = next();
      else if (s == "--family") a.family = next();
      else if (s == "--mode") a.mode = next();
      else if (s == "--set") a.sets.push_back(next());
      else if (s == "--variants") a.variants = split(next(), '|');
      else if (s == "--fractions") {
        for (double f : bench::numbers<double>(next())) a.fractions.push_back(f);
      } else
        throw Error("bench_peer: unknown argument " + s +
                    " (expected --reps N --steps N --warmup N --threads N --families a,b --no-budgets "
                    "--fractions f,g --json FILE --variants 'k=v,k=v|k=v' --set k=v --device cpu|cuda)");
    }
    if (a.device != "cpu" && a.device != "cuda")
      throw Error("bench_peer: --device '" + a.device + "' is not valid; expected cpu or cuda");
    if (a.device == "cuda") a.budgets = false;  // budgets are planned on the counting CPU allocator (trainer.cpp)
    if (!a.worker.empty()) return worker(a);
    return a.variants.empty() ? orchestrate(a) : compare_variants(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
