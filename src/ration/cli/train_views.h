// train_views.h — `ration train --trace FILE.json --trace-steps A:B --trace-max-mb N --html FILE.html`.
// Owns: the flags, the run observer that attaches a StepTracer to the run (train/step_trace.h), the
//       report's "trace" entry, and writing the trace (rank > 0 of a data-parallel run: FILE.rankR.json)
//       and the memory picture (rank 0) once the run is over.
// Does not own: the trace format (core/trace.h), which steps are traced and what is measured in them
//       (train/step_trace.h), the page (plan/html.h), the run (train/trainer.h).
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "ration/core/trace.h"
#include "ration/plan/html.h"
#include "ration/train/step_trace.h"
#include "ration/train/trainer.h"

namespace ration::cli {

struct TrainViewFlags {
  std::string trace_path, trace_steps, html_path;
  double trace_max_mb = 256;
  void add_to(CLI::App* train);
};

class TrainViews : public train::RunObserver {
 public:
  TrainViews(TrainViewFlags flags, std::string config_path);
  // Whether any view was asked for (attach the observer only then).
  bool active() const { return !flags_.trace_path.empty() || !flags_.html_path.empty(); }

  void before_steps(train::StepRuntime& runtime, int64_t first_step, int64_t total_steps) override;
  void after_run(train::StepRuntime& runtime, nlohmann::json& report) override;
  // Writes the files the flags asked for; `report` is the run's (its dist.rank picks the trace's name).
  void finish(const nlohmann::json& report);

 private:
  TrainViewFlags flags_;
  std::string config_path_;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<train::StepTracer> tracer_;
  std::optional<memory::StepProfile> profile_;  // with --html, copied at the end of the run
  std::optional<memory::Plan> plan_;
};

}  // namespace ration::cli
