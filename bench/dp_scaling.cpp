// dp_scaling.cpp — bench_dp_scaling: data-parallel `ration train` (1 and 2 processes, one thread each)
// against PyTorch DDP (Gloo, with and without its fp16 hook) on the same CNN and GPT, plus bytes on the
// wire per compression, projected step times on slower links, a convergence table, and one row per
// dist.topology (allreduce / ps / gossip: step time, bytes sent per step, final loss and accuracy, mlp).
// Owns: running the commands (ration launch / ration train / bench/dp_peer_ddp.py) interleaved, reading
//       their reports, and the tables + JSON. Does not own: anything measured (the reports are the data).
//
//   bench_dp_scaling [--steps 30] [--reps 2] [--conv-steps 300] [--gpt-conv-steps 120] [--skip-convergence]
//                    [--skip-speed] [--conv-filter 'LABEL|LABEL'] [--conv-model cnn|gpt] [--conv-warmup N]
//                    [--skip-topologies] [--topo-steps 300] [--topo-n 2]
//                    [--out bench/results/dp_scaling.json]
// Only the topology table: bench_dp_scaling --skip-speed --skip-convergence
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "bench_util.h"
#include "ration_run.h"

namespace {

using nlohmann::json;

const std::string kBin = RATION_BINARY_DIR;
const std::string kSrc = RATION_SOURCE_DIR;

struct ModelCase {
  std::string name;
  int64_t batch;  // per rank
};

// One `ration train` (n = 1) or `ration launch -n n -- train`; returns its report.
json ration_run(const ModelCase& m, int n, const std::string& compress, int64_t steps, int64_t batch,
                const std::vector<std::string>& extra) {
  const std::string args = ration::bench::quiet_train_args(kSrc, m.name, n > 1 ? n : 0, steps, batch) +
                           " --set dist.compress=" + compress;
  return ration::bench::run_ration_report(kBin, args, extra, "dp");
}

double ddp_run(const ModelCase& m, int n, const std::string& hook, int64_t steps) {
  std::ostringstream cmd;
  cmd << ration::bench::python_peer(kSrc, "dp_peer_ddp.py") << " --model " << m.name << " --nproc " << n
      << " --batch " << m.batch << " --steps " << steps << " --hook " << hook << " 2>/dev/null";
  int status = 0;
  const std::string out = ration::bench::run_command(cmd.str(), &status);
  if (status != 0) std::cerr << "command failed: " << cmd.str() << "\n" << out << "\n";
  const std::vector<json> lines = ration::bench::json_lines(out);
  try {
    return lines.empty() ? -1 : lines.front()["step_ms_median"].get<double>();
  } catch (const std::exception&) {
    return -1;
  }
}

using ration::bench::median;

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 30, reps = 2, conv_steps = 300, gpt_conv_steps = 120;
  bool convergence = true, speed = true, topologies = true;
  int64_t topo_steps = 300, topo_n = 2;
  std::string out_path = kSrc + "/bench/results/dp_scaling.json";
  int64_t conv_warmup = -1;  // fp32 warm-up of the onebit warm-up rows (-1: the config's lr warm-up)
  std::string conv_filter, conv_model;  // convergence: only these runs ("label|label") / only this model
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--steps") steps = std::stoll(next());
    else if (a == "--reps") reps = std::stoll(next());
    else if (a == "--conv-steps") conv_steps = std::stoll(next());
    else if (a == "--gpt-conv-steps") gpt_conv_steps = std::stoll(next());
    else if (a == "--skip-convergence") convergence = false;
    else if (a == "--skip-speed") speed = false;
    else if (a == "--skip-topologies") topologies = false;
    else if (a == "--topo-steps") topo_steps = std::stoll(next());
    else if (a == "--topo-n") topo_n = std::stoll(next());
    else if (a == "--out") out_path = next();
    else if (a == "--conv-filter") conv_filter = next();
    else if (a == "--conv-model") conv_model = next();
    else if (a == "--conv-warmup") conv_warmup = std::stoll(next());
    else {
      std::cerr << "usage: bench_dp_scaling [--steps N] [--reps N] [--conv-steps N] [--gpt-conv-steps N] "
                   "[--skip-convergence] [--skip-speed] [--skip-topologies] [--topo-steps N] [--topo-n N] [--conv-filter 'LABEL|LABEL'] [--conv-model cnn|gpt] [--conv-warmup N] [--out F]\n";
      return 2;
    }
  }
  const std::vector<ModelCase> models = {{"cnn", 64}, {"gpt", 8}};
  const std::vector<std::string> compressions = {"none", "fp16", "onebit"};
  json result = {{"machine", ration::bench::machine() + ", 1 thread per process"},
                 {"steps", steps},
                 {"reps", reps}};

  // ---- speed: interleaved repetitions ----
  for (const auto& m : models) {
    if (!speed) break;
    std::map<std::string, std::vector<double>> ms, comm, overlap;
    std::map<std::string, json> last;
    for (int64_t rep = 0; rep < reps; ++rep) {
      json one = ration_run(m, 1, "none", steps, m.batch, {"train.eval_batches=1"});
      ms["ration N=1"].push_back(one["time"]["step_ms_median"].get<double>());
      for (const auto& c : compressions) {
        // onebit from the first step (its default fp32 warm-up would cover these few steps).
        json two = ration_run(m, 2, c, steps, m.batch, {"train.eval_batches=1", "dist.compress_warmup=0"});
        const std::string key = "ration N=2 " + c;
        ms[key].push_back(two["time"]["step_ms_median"].get<double>());
        comm[key].push_back(two["dist"]["comm_ms"].get<double>());
        overlap[key].push_back(two["dist"]["overlap"].get<double>());
        last[key] = two["dist"];
      }
      ms["DDP N=1"].push_back(ddp_run(m, 1, "none", steps));
      ms["DDP N=2 none"].push_back(ddp_run(m, 2, "none", steps));
      ms["DDP N=2 fp16"].push_back(ddp_run(m, 2, "fp16", steps));
    }
    std::printf("\n%s, batch %lld per process, %lld steps x %lld interleaved reps (median step ms)\n", m.name.c_str(),
                static_cast<long long>(m.batch), static_cast<long long>(steps), static_cast<long long>(reps));
    std::printf("%-20s %10s %10s %12s %10s %9s %14s %14s\n", "run", "step ms", "steps/s", "scaling eff", "comm ms",
                "overlap", "bytes/step", "wire B/step");
    json rows = json::array();
    const double base_ration = median(ms["ration N=1"]), base_ddp = median(ms["DDP N=1"]);
    for (const auto& [key, v] : ms) {
      const double step_ms = median(v);
      const bool two = key.find("N=2") != std::string::npos;
      const double base = key.rfind("DDP", 0) == 0 ? base_ddp : base_ration;
      const double eff = two ? base / step_ms : 1.0;  // (2 b / t2) / (2 * b / t1)
      json row = {{"run", key}, {"step_ms", step_ms}, {"steps_per_s", 1000 / step_ms}, {"scaling_efficiency", eff},
                  {"samples", v}};
      if (last.count(key)) {
        row["comm_ms"] = median(comm[key]);
        row["overlap"] = median(overlap[key]);
        row["bytes_sent_per_step"] = last[key]["bytes_sent_per_step"];
        row["wire_bytes_per_step"] = last[key]["wire_bytes_per_step"];
        std::printf("%-20s %10.1f %10.2f %12.2f %10.2f %9.2f %14.0f %14.0f\n", key.c_str(), step_ms, 1000 / step_ms,
                    eff, row["comm_ms"].get<double>(), row["overlap"].get<double>(),
                    row["bytes_sent_per_step"].get<double>(), row["wire_bytes_per_step"].get<double>());
      } else {
        std::printf("%-20s %10.1f %10.2f %12.2f %10s %9s %14s %14s\n", key.c_str(), step_ms, 1000 / step_ms, eff, "-",
                    "-", "-", "-");
      }
      rows.push_back(row);
    }
    // Projection: compute time (N=2 step minus its exposed communication) + ring time on a B Gb/s link.
    std::printf("projected N=2 step ms at link speed (compute %s + wire bytes x 8 / B):\n", m.name.c_str());
    std::printf("%-10s %14s %10s %10s %10s\n", "compress", "wire B/step", "1 Gb/s", "10 Gb/s", "100 Gb/s");
    json projections = json::array();
    const double compute_ms = base_ration;
    for (const auto& c : compressions) {
      const double wire = last["ration N=2 " + c]["wire_bytes_per_step"].get<double>();
      json p = {{"compress", c}, {"wire_bytes_per_step", wire}, {"compute_ms", compute_ms}};
      std::printf("%-10s %14.0f", c.c_str(), wire);
      for (double gbps : {1.0, 10.0, 100.0}) {
        const double t = compute_ms + wire * 8 / (gbps * 1e9) * 1e3;
        p["step_ms_at_" + std::to_string(static_cast<int>(gbps)) + "gbps"] = t;
        std::printf(" %10.2f", t);
      }
      std::printf("\n");
      projections.push_back(p);
    }
    result[m.name] = {{"batch_per_process", m.batch}, {"runs", rows}, {"projection", projections}};
  }

  // ---- convergence: same steps, same global batch ----
  if (convergence) {
    struct Conv {
      std::string label;
      int n;
      std::string compress;
      std::vector<std::string> extra;
    };
    const std::vector<Conv> all_runs = {
        {"N=1 (batch 2b)", 1, "none", {}},
        {"N=2 none", 2, "none", {}},
        {"N=2 fp16", 2, "fp16", {}},
        {"N=2 onebit + EF", 2, "onebit", {"dist.error_feedback=true", "dist.compress_warmup=0"}},
        {"N=2 onebit + EF, mean-|v| scale", 2, "onebit", {"dist.error_feedback=true", "dist.onebit_lambda=0", "dist.compress_warmup=0"}},
        {"N=2 onebit + EF, one scale per parameter", 2, "onebit", {"dist.error_feedback=true", "dist.onebit_block=0", "dist.compress_warmup=0"}},
        {"N=2 onebit + EF, fp32 warm-up", 2, "onebit", {"dist.error_feedback=true", "dist.compress_warmup=W"}},
        {"N=2 onebit + EF, fp32 warm-up, frozen v", 2, "onebit",
         {"dist.error_feedback=true", "dist.compress_warmup=W", "dist.onebit_second_moment=freeze"}},
        {"N=2 onebit + EF, fp32 warm-up, frozen v, update space", 2, "onebit",
         {"dist.error_feedback=true", "dist.compress_warmup=W", "dist.onebit_second_moment=freeze",
          "dist.onebit_space=update"}},
        {"N=2 onebit + EF, fp32 warm-up, update space", 2, "onebit",
         {"dist.error_feedback=true", "dist.compress_warmup=W", "dist.onebit_space=update"}},
        {"N=2 onebit, no EF", 2, "onebit", {"dist.error_feedback=false", "dist.compress_warmup=0"}}};
    std::vector<Conv> runs;
    for (const auto& r : all_runs)
      if (conv_filter.empty() || ("|" + conv_filter + "|").find("|" + r.label + "|") != std::string::npos)
        runs.push_back(r);
    for (const auto& m : models) {
      if (!conv_model.empty() && m.name != conv_model) continue;
      const int64_t b = m.name == "cnn" ? 32 : 8;
      const int64_t model_steps = m.name == "cnn" ? conv_steps : gpt_conv_steps;
      std::printf("\nconvergence: %s, %lld steps, global batch %lld\n", m.name.c_str(),
                  static_cast<long long>(model_steps), static_cast<long long>(2 * b));
      std::printf("%-56s %12s %12s %14s %14s\n", "run", m.name == "cnn" ? "test acc %" : "val loss", "final loss",
                  "B/step (run)", "B/coded step");
      json rows = json::array();
      // W: the fp32 warm-up of the onebit rows, by default the config's learning-rate warm-up.
      const int64_t warmup = conv_warmup >= 0 ? conv_warmup : (m.name == "cnn" ? 100 : 50);
      for (const auto& r : runs) {
        std::vector<std::string> extra = r.extra;
        for (auto& e : extra)
          if (e.size() > 2 && e.compare(e.size() - 2, 2, "=W") == 0) e = e.substr(0, e.size() - 1) + std::to_string(warmup);
        extra.push_back(m.name == "cnn" ? "train.eval_batches=0" : "train.eval_batches=16");
        extra.push_back("train.eval_every=0");
        json rep = ration_run(m, r.n, r.compress, model_steps, r.n == 1 ? 2 * b : b, extra);
        const json& e = rep["eval"].back();
        const double metric = m.name == "cnn" ? 100 * e["accuracy"].get<double>() : e["loss"].get<double>();
        // Bytes this rank handed to c10d: averaged over the whole run (fp32 warm-up included) and over the
        // compressed steps alone (onebit).
        const json& d = rep["dist"];
        const double run_bytes = d.contains("bytes_sent_per_step") ? d["bytes_sent_per_step"].get<double>() : 0.0;
        const double coded_bytes =
            d.contains("onebit") ? d["onebit"]["bytes_sent_per_compressed_step"].get<double>() : run_bytes;
        std::printf("%-56s %12.3f %12.4f %14.0f %14.0f\n", r.label.c_str(), metric, rep["loss"].back().get<double>(),
                    run_bytes, coded_bytes);
        rows.push_back({{"run", r.label}, {m.name == "cnn" ? "test_accuracy" : "val_loss", metric},
                        {"final_train_loss", rep["loss"].back()}, {"settings", extra},
                        {"bytes_sent_per_step", run_bytes}, {"bytes_sent_per_compressed_step", coded_bytes}});
      }
      result["convergence"][m.name] = {{"steps", model_steps}, {"global_batch", 2 * b}, {"runs", rows}};
    }
  }
  // ---- topologies: mlp, topo_n processes, same steps and global batch, interleaved repetitions ----
  if (topologies) {
    const ModelCase mlp{"mlp", 64};
    const std::vector<std::string> kinds = {"allreduce", "ps", "gossip"};
    std::map<std::string, std::vector<double>> ms;
    std::map<std::string, json> last;
    for (int64_t rep = 0; rep < reps; ++rep) {
      for (const auto& t : kinds) {
        json r = ration_run(mlp, static_cast<int>(topo_n), "none", topo_steps, mlp.batch,
                            {"dist.topology=" + t, "train.eval_batches=0", "train.eval_every=0"});
        // The step runtime times forward, backward and the optimiser; ps / gossip exchange parameters
        // after that (dist.parameter_exchange_ms), which belongs to the step.
        ms[t].push_back(r["time"]["step_ms_median"].get<double>() + r["dist"]["parameter_exchange_ms"].get<double>());
        last[t] = r;
      }
    }
    std::printf("\ntopologies: mlp, N=%lld, batch %lld per process, %lld steps x %lld interleaved reps "
                "(bytes: rank 0's report)\n",
                static_cast<long long>(topo_n), static_cast<long long>(mlp.batch), static_cast<long long>(topo_steps),
                static_cast<long long>(reps));
    std::printf("%-10s %10s %12s %14s %10s %12s %10s\n", "topology", "step ms", "exchange ms", "bytes/step",
                "comm ms", "final loss", "test acc %");
    json rows = json::array();
    for (const auto& t : kinds) {
      const json& r = last[t];
      const double acc = 100 * r["eval"].back()["accuracy"].get<double>();
      json row = {{"topology", t},
                  {"step_ms", median(ms[t])},
                  {"samples", ms[t]},
                  {"bytes_sent_per_step_rank0", r["dist"]["bytes_sent_per_step"]},
                  {"comm_ms", r["dist"]["comm_ms"]},
                  {"parameter_exchange_ms", r["dist"]["parameter_exchange_ms"]},
                  {"final_train_loss", r["loss"].back()},
                  {"test_accuracy", acc}};
      std::printf("%-10s %10.2f %12.2f %14.0f %10.2f %12.4f %10.2f\n", t.c_str(), median(ms[t]),
                  r["dist"]["parameter_exchange_ms"].get<double>(), r["dist"]["bytes_sent_per_step"].get<double>(),
                  r["dist"]["comm_ms"].get<double>(), r["loss"].back().get<double>(), acc);
      rows.push_back(row);
    }
    result["topologies"] = {{"model", "mlp"}, {"n", topo_n}, {"steps", topo_steps}, {"runs", rows}};
  }
  ration::bench::write_json(out_path, result);
  std::printf("\nwrote %s\n", out_path.c_str());
  return 0;
}
