// step_trace.h — which steps of a training run are traced, and what was measured in them.
// Owns: StepRange (the `--trace-steps A:B` range and its parsing), StepTracer (a StepHook that installs a
//       Trace for the steps of the range only — from before their forward to after their optimiser
//       update, nothing in between steps such as evaluation or checkpoints — draws each traced step and its
//       forward and backward phases on the "step" track, samples memory at each step's begin and end, and
//       keeps every traced step's measured memory curve: TracedStep).
// Does not own: the trace itself and the spans inside a step (core/trace.h and the trace points of the
//       layers), the step (runtime/step_runtime.h), the command-line flags and the files (cli/main.cpp).
//
// The memory counter's maximum over a traced step is that step's measured peak (StepStats::peak_bytes,
// what the report's memory.step_peak_bytes lists): the interval peak restarts when the step's trace is
// installed, right before the step resets its own peak, and the last sample is taken after the update.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ration/core/trace.h"
#include "ration/runtime/step_runtime.h"

namespace ration::train {

// Steps [first, end) counted from 0 as the report counts them (report "first_step"; a resumed run starts
// at its checkpoint's step).
struct StepRange {
  int64_t first = 0, end = 0;
  bool contains(int64_t step) const { return step >= first && step < end; }
};
// "A:B" (steps A to B-1). Errors name `flag` and the expected form.
StepRange parse_step_range(const std::string& text, const std::string& flag);
// The default range: the first two steps after the first (which allocates optimiser state and warms
// caches), within a run of steps [first_step, total_steps).
StepRange default_trace_steps(int64_t first_step, int64_t total_steps);

// One traced step as numbers: device memory per node slot (the high-water mark since the previous
// sample, taken at each forward node's end and each backward node's end, in order) and the step's peak.
struct TracedStep {
  int64_t step = 0;
  std::vector<int64_t> forward_peaks, backward_peaks;
  int64_t begin_bytes = 0;   // device bytes when the step began
  int64_t update_peak = 0;   // high-water mark from the last backward node to the end of the update
  int64_t peak_bytes = 0;    // StepStats::peak_bytes of the step
  double begin_us = 0, end_us = 0;
};

class StepTracer : public StepHook {
 public:
  // Traces the steps of `range` into `trace` (which must outlive the tracer and its run).
  StepTracer(Trace& trace, StepRange range);
  ~StepTracer() override;

  void before_forward(int64_t step, data::Batch& batch) override;
  void after_forward(int64_t step, const Value& loss) override;
  void after_backward(int64_t step) override;
  void after_step(int64_t step, const StepStats& stats) override;

  const StepRange& range() const { return range_; }
  const std::vector<TracedStep>& steps() const { return steps_; }
  // The traced step with the highest peak (null when none ran).
  const TracedStep* highest_peak() const;

 private:
  Trace& trace_;
  StepRange range_;
  std::unique_ptr<TraceScope> scope_;  // installed while a traced step runs
  double begin_us_ = 0, backward_us_ = 0;
  size_t first_sample_ = 0;  // index in trace_.memory_samples() of this step's begin sample
  std::vector<TracedStep> steps_;
};

}  // namespace ration::train
