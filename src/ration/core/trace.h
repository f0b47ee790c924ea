// trace.h — a timeline of a run in Chrome Trace Event format (opens in Perfetto and chrome://tracing).
// Owns: Trace (events kept in memory against one steady clock, a size bound, the JSON written
//       atomically), TraceScope (installs a Trace for the whole process while alive, so copy threads see
//       it too; scopes nest), TraceSpan (the compute track's node spans), TraceRegion and trace_instant
//       (the one-line trace points other layers use: an RAII span / a mark on a named track), and the
//       memory counters (the counting allocator's current device bytes by category and its high-water
//       mark between samples, kept as structured samples too, plus the budget line when one is set).
// Does not own: what is traced. core records a span per node forward, backward and recompute on the
//       "compute" track and samples memory as each forward or backward node ends; other layers add spans
//       on tracks of their own through TraceRegion (the offload engine's "copy-out" and "copy-in" queues
//       and its "stalls", the step runtime's "optimizer", the reducer's "collectives", the parameter-server
//       client's "ps"); which steps of a training run are traced is train/step_trace.h.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ration {

// Where a memory sample was taken: at the end of a forward or backward node (core), or at a traced
// training step's begin or end (train/step_trace.h).
enum class SamplePoint { Forward, Backward, StepBegin, StepEnd };

// One memory sample as numbers (the same values the counters carry).
struct MemorySample {
  double ts_us = 0;
  SamplePoint at = SamplePoint::Forward;
  int64_t device_bytes = 0;  // device bytes now (every category but the host-side dataset)
  int64_t peak_bytes = 0;    // device bytes' high-water mark since the previous sample
};

class Trace {
 public:
  // `max_bytes`: bound on the JSON the events take; events past it are counted, not kept, and write()
  // then fails naming the bound.
  explicit Trace(int64_t max_bytes = int64_t{256} << 20);
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Microseconds since this trace began: the one clock of every event.
  double now_us() const;
  // A finished span [start_us, end_us] on `track` (one row in the viewer, e.g. "compute", "copy-out").
  void span(const std::string& track, const std::string& name, const std::string& category, double start_us,
            double end_us);
  // One sample of the counter track `name`: each (series, value) pair is one stacked series.
  void counter(const std::string& name, const std::vector<std::pair<std::string, int64_t>>& values, double ts_us);
  // A mark at `ts_us` on `track` (an instant event: a decision, not a span of time).
  void instant(const std::string& track, const std::string& name, const std::string& category, double ts_us);
  // Samples the counting allocator's device bytes by category (counter "device memory (bytes)") and the
  // high-water mark since the previous sample (counter "device memory peak (bytes)"), so the peak
  // counter's maximum is the traced run's measured peak, peaks inside a node included.
  void sample_memory(double ts_us, SamplePoint at = SamplePoint::Forward);
  // Every memory sample so far, in the order taken.
  std::vector<MemorySample> memory_samples() const;
  // Draws the budget as a flat counter "budget (bytes)" across the whole trace (may be set at any time).
  void set_budget(int64_t bytes);

  int64_t events() const;
  int64_t dropped_events() const;
  // {"traceEvents": [...], "displayTimeUnit": "ms"} with a thread_name record per track.
  std::string json() const;
  // Writes json() to `path` through a temporary file renamed into place. Throws ration::Error naming
  // `what` (the flag that gave the path or the bound) when events were dropped or the file cannot be
  // written.
  void write(const std::string& path, const std::string& what, const std::string& bound_flag) const;

 private:
  void add(std::string event, double ts_us);  // under mu_
  int tid_of(const std::string& track);  // under mu_

  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point origin_;
  int64_t max_bytes_;
  int64_t bytes_ = 0;
  int64_t dropped_ = 0;
  int64_t budget_bytes_ = -1;
  double last_us_ = 0;
  std::vector<std::string> events_;
  std::vector<MemorySample> samples_;
  std::vector<std::pair<int, std::string>> tracks_;  // tid -> track name, in order of first use
  std::unordered_map<std::string, int> tids_;
};

// The installed trace (null when tracing is off: every hook then costs one atomic load).
Trace* current_trace();
class TraceScope {
 public:
  explicit TraceScope(Trace& trace);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* prev_;
};

// What a span on the compute track stands for; forward and backward spans also sample memory at their end.
enum class SpanKind { Forward, Backward, Recompute };
const char* to_string(SpanKind k);

// A span on the compute track named "<module path>/<op>" (or "<op>" at top level); nothing when tracing is
// off (the name is then never built).
class TraceSpan {
 public:
  TraceSpan(SpanKind kind, const std::string& scope, const std::string& op);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Trace* trace_;
  SpanKind kind_;
  std::string name_;
  double start_us_ = 0;
};

// A span on `track` (e.g. "copy-out", "stalls", "optimizer") from construction to destruction, on the
// trace installed when it was constructed. With tracing off it costs one atomic load: the name is a
// literal, or a callable that builds it only when tracing is on:
//   TraceRegion span("copy-out", "copy", [&] { return "write " + format_bytes(bytes); });
class TraceRegion {
 public:
  TraceRegion(const char* track, const char* category, const char* name) : trace_(current_trace()) {
    if (trace_ != nullptr) begin(track, category, name);
  }
  template <typename NameFn, typename = std::enable_if_t<std::is_invocable_r_v<std::string, NameFn&>>>
  TraceRegion(const char* track, const char* category, NameFn&& name) : trace_(current_trace()) {
    if (trace_ != nullptr) begin(track, category, name());
  }
  ~TraceRegion();
  TraceRegion(const TraceRegion&) = delete;
  TraceRegion& operator=(const TraceRegion&) = delete;

 private:
  void begin(const char* track, const char* category, std::string name);
  Trace* trace_;
  const char* track_ = nullptr;
  const char* category_ = nullptr;
  std::string name_;
  double start_us_ = 0;
};

// A mark now on `track` of the installed trace; nothing when tracing is off (`name` is then never called).
template <typename NameFn>
void trace_instant(const char* track, const char* category, NameFn&& name) {
  if (Trace* t = current_trace()) t->instant(track, name(), category, t->now_us());
}

}  // namespace ration
