// train_views.cpp — see train_views.h.
#include "train_views.h"

#include <algorithm>

#include "ration/base/check.h"
#include "ration/cli/validators.h"
#include "ration/base/allocator.h"
#include "ration/runtime/step_runtime.h"

namespace ration::cli {

void TrainViewFlags::add_to(CLI::App* train) {
  train->add_option("--trace", trace_path, "write a timeline of the traced steps to FILE.json (Chrome Trace Event "
                                           "format: open in ui.perfetto.dev or chrome://tracing)");
  train->add_option("--trace-steps", trace_steps, "steps to trace, A:B = steps A to B-1 counted from 0 (default: the "
                                                  "two steps after the first)");
  train->add_option("--trace-max-mb", trace_max_mb, "bound on the trace in MiB (default 256): tracing stops there "
                                                    "and the command fails naming this flag")
      ->check(trace_megabytes());
  train->add_option("--html", html_path, "at the end, write the memory picture with a measured training step to "
                                         "FILE.html (needs --memory-budget)");
}

TrainViews::TrainViews(TrainViewFlags flags, std::string config_path)
    : flags_(std::move(flags)), config_path_(std::move(config_path)) {}

void TrainViews::before_steps(train::StepRuntime& runtime, int64_t first_step, int64_t total_steps) {
  RATION_CHECK(flags_.html_path.empty() || runtime.current_plan() != nullptr, "--html '", flags_.html_path,
               "': the memory picture draws a plan next to the measured step; give --memory-budget SIZE (or "
               "memory.budget)");
  const train::StepRange range = flags_.trace_steps.empty()
                                     ? train::default_trace_steps(first_step, total_steps)
                                     : train::parse_step_range(flags_.trace_steps, "--trace-steps");
  RATION_CHECK(range.first >= first_step && range.end <= total_steps, "--trace-steps ", range.first, ":", range.end,
               ": this run has steps ", first_step, " to ", total_steps - 1, " (expected A:B with ", first_step,
               " <= A < B <= ", total_steps, ")");
  trace_ = std::make_unique<Trace>(static_cast<int64_t>(flags_.trace_max_mb * 1024 * 1024));
  if (runtime.settings().budget.has_budget()) trace_->set_budget(runtime.settings().budget.budget_bytes());
  tracer_ = std::make_unique<train::StepTracer>(*trace_, range);
  runtime.add_hook(tracer_.get());
}

void TrainViews::after_run(train::StepRuntime& runtime, nlohmann::json& report) {
  if (!tracer_) return;
  nlohmann::json steps = nlohmann::json::array();
  int64_t peak = 0;
  for (const train::TracedStep& s : tracer_->steps()) {
    steps.push_back({{"step", s.step}, {"peak_bytes", s.peak_bytes}});
    peak = std::max(peak, s.peak_bytes);
  }
  // peak_bytes: the highest of the traced steps' measured peaks (each as memory.peak_bytes counts a step),
  // equal to the trace's "device memory peak (bytes)" counter's maximum.
  report["trace"] = {{"file", flags_.trace_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(flags_.trace_path)},
                     {"steps", {tracer_->range().first, tracer_->range().end}},
                     {"traced", steps},
                     {"peak_bytes", peak},
                     {"events", trace_->events()},
                     {"dropped_events", trace_->dropped_events()}};
  if (!flags_.html_path.empty() && runtime.current_plan() != nullptr) {
    profile_ = runtime.step_profile();
    plan_ = *runtime.current_plan();
  }
}

void TrainViews::finish(const nlohmann::json& report) {
  if (!tracer_) return;
  const int rank = report.contains("dist") ? report["dist"].value("rank", 0) : 0;
  if (!flags_.html_path.empty() && rank == 0 && profile_ && plan_) {
    const train::TracedStep* step = tracer_->highest_peak();
    RATION_CHECK(step != nullptr, "--html '", flags_.html_path, "': no step of --trace-steps ", tracer_->range().first,
                 ":", tracer_->range().end, " ran (the run stopped early?)");
    memory::MeasuredCurve curve;
    curve.step = step->step;
    curve.bytes = step->forward_peaks;
    curve.bytes.insert(curve.bytes.end(), step->backward_peaks.begin(), step->backward_peaks.end());
    curve.peak_bytes = step->peak_bytes;
    curve.update_peak = step->update_peak;
    memory::write_plan_html(flags_.html_path, "--html", *profile_, *plan_,
                            config_path_ + ", budget " + memory::format_bytes(plan_->budget_bytes) + ", trained",
                            &curve);
  }
  if (!flags_.trace_path.empty()) {
    std::string path = flags_.trace_path;
    if (rank > 0) {
      const size_t dot = path.rfind('.');
      const size_t slash = path.rfind('/');
      const std::string suffix = ".rank" + std::to_string(rank);
      if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) path.insert(dot, suffix);
      else path += suffix;
    }
    trace_->write(path, "--trace", "--trace-max-mb");
  }
}

}  // namespace ration::cli
