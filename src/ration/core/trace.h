// trace.h — a timeline of a run in Chrome Trace Event format (opens in Perfetto and chrome://tracing).
// Owns: Trace (events kept in memory against one steady clock, a size bound, the JSON written
//       atomically), TraceScope (installs a Trace for the whole process while alive, so copy threads see
//       it too; scopes nest), TraceSpan (an RAII span on a named track), and the memory counters (the
//       counting allocator's current device bytes by category and its high-water mark between samples,
//       plus the budget line when one is set).
// Does not own: what is traced. core records a span per node forward, backward and recompute on the
//       "compute" track and samples memory as each forward or backward node ends; other layers (the
//       offload engine's copy queues, optimisers, collectives) add spans on tracks of their own through
//       the same API.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ration {

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
  // Samples the counting allocator's device bytes by category (counter "device memory (bytes)") and the
  // high-water mark since the previous sample (counter "device memory peak (bytes)"), so the peak
  // counter's maximum is the traced run's measured peak, peaks inside a node included.
  void sample_memory(double ts_us);
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

}  // namespace ration
