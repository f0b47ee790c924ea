// trace_overhead.cpp — what tracing costs a training step: off (compiled in, nothing installed: the path
// every untraced run takes), on (a Trace installed for the step, as `ration train --trace` does for the
// steps it traces), and what the trace points cost while off, per call and per step.
//
// 1. Step time, off vs on: full training steps (forward, backward, AdamW update) of a model from a config
//    (default configs/cnn.toml, its batch size and threads) on one fixed batch, the two modes alternating
//    and swapping order every repetition, after warm-up steps. On: a fresh Trace per step, installed with
//    TraceScope around StepRuntime::measure_step (node spans, memory samples, the optimiser span). Wall
//    and process-CPU ms, medians; overhead is the median over repetitions of on/off of the adjacent pair.
//    Also the time to render and write one traced step's JSON (done once per run, after the steps).
// 2. Off cost per trace point: a million TraceSpan (the compute track's node span) and TraceRegion (the
//    layers' one-line span with a name built by a callable) constructions with no trace installed, ns per
//    point; times the trace points one step executes (the spans and marks of a traced step) gives the
//    off cost per step, next to the step's time. There is no build without the trace points to compare
//    with: this per-point cost is the whole difference (one atomic load and a branch per point).
// 3. The peer, in the same run (default config only): bench/trace_peer_torch.py, the same model and step
//    in PyTorch 1.13 (/usr/bin/python3) with the same threads and batch, torch.profiler off vs on
//    (profile_memory=True), alternating the same way.
//
// usage: bench_trace_overhead [--reps R] [--warmup W] [--out FILE.json] [--no-peer] [CONFIG.toml] [--set k=v ...]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "bench_setup.h"
#include "ration/base/check.h"
#include "ration/core/trace.h"
#include "ration/base/allocator.h"
#include "ration/optim/adamw.h"
#include "ration/runtime/budget.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

using namespace ration;
using Clock = std::chrono::steady_clock;

namespace {
using bench::ms_since;

struct Timed {
  double wall_ms = 0, cpu_ms = 0;
};

// One training step; `trace` non-null: installed for the step.
Timed step(train::StepRuntime& runtime, models::Model& model, const data::Batch& batch, optim::Optimizer& opt,
           Trace* trace, uint64_t seed) {
  train::StepOptions o;
  o.seed = seed;
  o.optimizer = &opt;
  const double c0 = bench::cpu_ms_now();
  const auto t0 = Clock::now();
  if (trace) {
    TraceScope scope(*trace);
    runtime.measure_step(model, batch, o);
  } else {
    runtime.measure_step(model, batch, o);
  }
  return {ms_since(t0), bench::cpu_ms_now() - c0};
}

// ns per trace point constructed and destroyed with no trace installed.
double off_ns_per_point(bool region) {
  constexpr int kCalls = 1000000;
  const std::string scope = "features.0", op = "conv2d";
  volatile int64_t sink = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    if (region) {
      TraceRegion r("copy-out", "copy", [&] { return "write " + std::to_string(i); });
    } else {
      TraceSpan s(SpanKind::Forward, scope, op);
    }
    sink = sink + 1;
  }
  return ms_since(t0) * 1e6 / kCalls;
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int reps = 15, warmup = 3;
  std::string out_path = "bench/results/trace_overhead.json", config = "configs/cnn.toml";
  std::vector<std::string> overrides;
  bool peer = true;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&] {
        RATION_CHECK(i + 1 < argc, a, " needs a value");
        return std::string(argv[++i]);
      };
      if (a == "--reps") reps = std::stoi(value());
      else if (a == "--warmup") warmup = std::stoi(value());
      else if (a == "--out") out_path = value();
      else if (a == "--set") overrides.push_back(value());
      else if (a == "--no-peer") peer = false;
      else if (!a.empty() && a[0] != '-') config = a;
      else RATION_CHECK(false, "unknown argument '", a, "' (usage: bench_trace_overhead [--reps R] [--warmup W] "
                               "[--out FILE.json] [CONFIG.toml] [--set k=v ...])");
    }
    const bench::ModelBench mb = bench::load_model_bench(config, overrides);
    const train::Setup& setup = mb.setup;
    models::Model& model = mb.model();
    const data::Batch& batch = mb.batch;
    optim::AdamW opt(model.named_parameters(), optim::AdamWOptions{});
    train::StepRuntime runtime;

    for (int w = 0; w < warmup; ++w) step(runtime, model, batch, opt, nullptr, 1 + w);
    // One traced step to count the trace points a step runs and to time writing the JSON.
    Trace counted;
    step(runtime, model, batch, opt, &counted, 99);
    const nlohmann::json parsed = nlohmann::json::parse(counted.json());
    int64_t points = 0, counters = 0;
    for (const auto& e : parsed["traceEvents"]) {
      const std::string ph = e["ph"];
      points += ph == "X" || ph == "i";
      counters += ph == "C";
    }
    const std::string tmp = (std::filesystem::temp_directory_path() / "ration-trace-overhead.json").string();
    const auto w0 = Clock::now();
    counted.write(tmp, "bench", "--trace-max-mb");
    const double write_ms = ms_since(w0);
    const auto json_bytes = static_cast<int64_t>(std::filesystem::file_size(tmp));
    std::filesystem::remove(tmp);

    std::vector<double> off_ms, on_ms, off_cpu, on_cpu, ratio;
    for (int r = 0; r < reps; ++r) {
      const uint64_t seed = 1000 + static_cast<uint64_t>(r);
      Timed off, on;
      Trace trace;
      if (r % 2 == 0) {
        off = step(runtime, model, batch, opt, nullptr, seed);
        on = step(runtime, model, batch, opt, &trace, seed);
      } else {
        on = step(runtime, model, batch, opt, &trace, seed);
        off = step(runtime, model, batch, opt, nullptr, seed);
      }
      off_ms.push_back(off.wall_ms);
      on_ms.push_back(on.wall_ms);
      off_cpu.push_back(off.cpu_ms);
      on_cpu.push_back(on.cpu_ms);
      ratio.push_back(on.wall_ms / off.wall_ms);
    }
    const double span_ns = bench::median({off_ns_per_point(false), off_ns_per_point(false), off_ns_per_point(false)});
    const double region_ns = bench::median({off_ns_per_point(true), off_ns_per_point(true), off_ns_per_point(true)});
    const double off_step_us = static_cast<double>(points) * std::max(span_ns, region_ns) / 1000.0;
    const double step_ms = bench::median(off_ms);

    std::printf("%s, batch %lld, %d interleaved repetitions after %d warm-up steps (AdamW)\n", config.c_str(),
                static_cast<long long>(setup.batch_size), reps, warmup);
    std::printf("%-34s %12s %12s %10s\n", "training step", "wall ms", "cpu ms", "vs off");
    std::printf("%-34s %12.2f %12.2f %10s\n", "tracing off (compiled in)", step_ms, bench::median(off_cpu), "1.000");
    std::printf("%-34s %12.2f %12.2f %10.3f\n", "traced (--trace, this step)", bench::median(on_ms),
                bench::median(on_cpu), bench::median(ratio));
    std::printf("one traced step: %lld trace points (spans and marks), %lld counter samples, %.1f KiB of JSON written "
                "in %.2f ms\n",
                static_cast<long long>(points), static_cast<long long>(counters), static_cast<double>(json_bytes) / 1024,
                write_ms);
    std::printf("off cost per trace point: TraceSpan %.2f ns, TraceRegion %.2f ns -> %.2f us per step = %.5f%% of a "
                "%.1f ms step\n",
                span_ns, region_ns, off_step_us, 100.0 * off_step_us / 1000.0 / step_ms, step_ms);

    nlohmann::json peer_result;
    if (peer && config == "configs/cnn.toml" && overrides.empty()) {
      const std::string peer_out = (std::filesystem::temp_directory_path() / "ration-trace-peer.json").string();
      const std::string cmd = bench::python_peer(RATION_SOURCE_DIR, "trace_peer_torch.py") + " --reps " +
                              std::to_string(reps) + " --warmup " + std::to_string(warmup) + " --batch " +
                              std::to_string(setup.batch_size) + " --threads " + std::to_string(at::get_num_threads()) +
                              " --out " + peer_out + " > /dev/null";
      if (std::system(cmd.c_str()) == 0) {
        std::ifstream in(peer_out);
        peer_result = nlohmann::json::parse(in);
        std::filesystem::remove(peer_out);
        std::printf("%-34s %12.2f %12s %10s\n", "PyTorch 1.13, profiler off", peer_result["off_ms_median"].get<double>(),
                    "-", "1.000");
        std::printf("%-34s %12.2f %12s %10.3f\n", "PyTorch 1.13, torch.profiler on", peer_result["profiled_ms_median"].get<double>(),
                    "-", peer_result["profiled_over_off_median"].get<double>());
        std::printf("PyTorch: one profiled step exported as a Chrome trace: %.1f KiB in %.2f ms\n",
                    peer_result["trace_bytes"].get<double>() / 1024, peer_result["export_ms"].get<double>());
      } else {
        std::printf("(the PyTorch peer did not run: %s)\n", cmd.c_str());
      }
    }
    nlohmann::json j = {{"config", config},
                        {"overrides", overrides},
                        {"batch_size", setup.batch_size},
                        {"repetitions", reps},
                        {"warmup", warmup},
                        {"off", {{"wall_ms_median", step_ms}, {"cpu_ms_median", bench::median(off_cpu)}, {"wall_ms", off_ms}}},
                        {"traced", {{"wall_ms_median", bench::median(on_ms)}, {"cpu_ms_median", bench::median(on_cpu)}, {"wall_ms", on_ms}}},
                        {"traced_over_off_median", bench::median(ratio)},
                        {"trace_points_per_step", points},
                        {"counter_samples_per_step", counters},
                        {"json_bytes_per_step", json_bytes},
                        {"write_ms_per_step", write_ms},
                        {"off_ns_per_trace_span", span_ns},
                        {"off_ns_per_trace_region", region_ns},
                        {"off_us_per_step", off_step_us},
                        {"off_fraction_of_step", off_step_us / 1000.0 / step_ms},
                        {"threads", at::get_num_threads()},
                        {"peer_torch_profiler", peer_result}};
    bench::write_json(out_path, j);
    std::printf("wrote %s\n", out_path.c_str());
  } catch (const std::exception& e) {
    return bench::report_error(e);
  }
  return 0;
}
