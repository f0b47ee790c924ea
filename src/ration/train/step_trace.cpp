// step_trace.cpp — see step_trace.h.
#include "ration/train/step_trace.h"

#include <algorithm>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::train {

StepRange parse_step_range(const std::string& text, const std::string& flag) {
  const std::string expected = flag + ": expected A:B, the steps A to B-1 counted from 0 with A < B (e.g. 1:3), got '" +
                               text + "'";
  const size_t colon = text.find(':');
  RATION_CHECK(colon != std::string::npos, expected);
  auto number = [&](const std::string& part) {
    size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(part, &pos);
    } catch (const std::exception&) {
      pos = std::string::npos;
    }
    RATION_CHECK(pos == part.size() && v >= 0, expected);
    return static_cast<int64_t>(v);
  };
  const StepRange r{number(text.substr(0, colon)), number(text.substr(colon + 1))};
  RATION_CHECK(r.first < r.end, expected);
  return r;
}

StepRange default_trace_steps(int64_t first_step, int64_t total_steps) {
  const int64_t first = total_steps - first_step > 1 ? first_step + 1 : first_step;
  return {first, std::min(first + 2, std::max(total_steps, first + 1))};
}

StepTracer::StepTracer(Trace& trace, StepRange range) : trace_(trace), range_(range) {}
StepTracer::~StepTracer() = default;

void StepTracer::before_forward(int64_t step, data::Batch&) {
  // Past the size bound the trace keeps nothing more: tracing stops (Trace::write then names the bound).
  if (!range_.contains(step) || scope_ || trace_.dropped_events() > 0) return;
  scope_ = std::make_unique<TraceScope>(trace_);  // restarts the interval peak: the step's own from here
  begin_us_ = trace_.now_us();
  first_sample_ = trace_.memory_samples().size();
  trace_.sample_memory(begin_us_, SamplePoint::StepBegin);
}

void StepTracer::after_forward(int64_t step, const Value&) {
  if (!scope_) return;
  backward_us_ = trace_.now_us();
  trace_.span("step", "forward", "step", begin_us_, backward_us_);
}

void StepTracer::after_backward(int64_t step) {
  if (!scope_) return;
  trace_.span("step", "backward", "step", backward_us_, trace_.now_us());
}

void StepTracer::after_step(int64_t step, const StepStats& stats) {
  if (!scope_) return;
  const double end = trace_.now_us();
  trace_.sample_memory(end, SamplePoint::StepEnd);
  trace_.span("step", "step " + std::to_string(step), "step", begin_us_, end);
  scope_.reset();
  TracedStep t;
  t.step = step;
  t.peak_bytes = stats.peak_bytes;
  t.begin_us = begin_us_;
  t.end_us = end;
  const std::vector<MemorySample> samples = trace_.memory_samples();
  for (size_t i = first_sample_; i < samples.size(); ++i) {
    const MemorySample& s = samples[i];
    switch (s.at) {
      case SamplePoint::StepBegin: t.begin_bytes = s.device_bytes; break;
      case SamplePoint::Forward: t.forward_peaks.push_back(s.peak_bytes); break;
      case SamplePoint::Backward: t.backward_peaks.push_back(s.peak_bytes); break;
      case SamplePoint::StepEnd: t.update_peak = s.peak_bytes; break;
    }
  }
  // Micro-batches of one step (dist.sync_every) each run a step: the last one stands for the step, as
  // in the report.
  if (!steps_.empty() && steps_.back().step == step) steps_.back() = std::move(t);
  else steps_.push_back(std::move(t));
}

const TracedStep* StepTracer::highest_peak() const {
  const auto it = std::max_element(steps_.begin(), steps_.end(),
                                   [](const TracedStep& a, const TracedStep& b) { return a.peak_bytes < b.peak_bytes; });
  return it == steps_.end() ? nullptr : &*it;
}

}  // namespace ration::train
