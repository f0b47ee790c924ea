// trace.cpp — see trace.h. Events are rendered to JSON text as they arrive (so the size bound is exact)
// and joined when written.
#include "ration/core/trace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration {
namespace {

std::atomic<Trace*> g_trace{nullptr};

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string micros(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", us);
  return buf;
}

// The categories that make up device memory (Category::Data is host-side, see allocator.h).
constexpr memory::Category kDeviceCategories[] = {memory::Category::Parameters, memory::Category::Gradients,
                                                  memory::Category::Optimizer, memory::Category::SavedActivations,
                                                  memory::Category::Workspace, memory::Category::Other};

}  // namespace

Trace::Trace(int64_t max_bytes) : origin_(std::chrono::steady_clock::now()), max_bytes_(max_bytes) {
  RATION_CHECK(max_bytes > 0, "trace size bound must be positive; got ", max_bytes, " bytes");
}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

int Trace::tid_of(const std::string& track) {
  auto it = tids_.find(track);
  if (it != tids_.end()) return it->second;
  const int tid = static_cast<int>(tids_.size()) + 1;
  tids_.emplace(track, tid);
  tracks_.emplace_back(tid, track);
  return tid;
}

void Trace::add(std::string event, double ts_us) {
  last_us_ = std::max(last_us_, ts_us);
  const int64_t size = static_cast<int64_t>(event.size()) + 2;
  if (bytes_ + size > max_bytes_) {
    ++dropped_;
    return;
  }
  bytes_ += size;
  events_.push_back(std::move(event));
}

void Trace::span(const std::string& track, const std::string& name, const std::string& category, double start_us,
                 double end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  const int tid = tid_of(track);
  add("{\"name\":" + quoted(name) + ",\"cat\":" + quoted(category) + ",\"ph\":\"X\",\"ts\":" + micros(start_us) +
          ",\"dur\":" + micros(end_us - start_us) + ",\"pid\":1,\"tid\":" + std::to_string(tid) + "}",
      end_us);
}

void Trace::counter(const std::string& name, const std::vector<std::pair<std::string, int64_t>>& values,
                    double ts_us) {
  std::string args;
  for (const auto& [series, value] : values) {
    if (!args.empty()) args += ',';
    args += quoted(series) + ":" + std::to_string(value);
  }
  std::lock_guard<std::mutex> lock(mu_);
  add("{\"name\":" + quoted(name) + ",\"ph\":\"C\",\"ts\":" + micros(ts_us) + ",\"pid\":1,\"args\":{" + args + "}}",
      ts_us);
}

void Trace::instant(const std::string& track, const std::string& name, const std::string& category, double ts_us) {
  std::lock_guard<std::mutex> lock(mu_);
  const int tid = tid_of(track);
  add("{\"name\":" + quoted(name) + ",\"cat\":" + quoted(category) + ",\"ph\":\"i\",\"s\":\"t\",\"ts\":" +
          micros(ts_us) + ",\"pid\":1,\"tid\":" + std::to_string(tid) + "}",
      ts_us);
}

void Trace::set_budget(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_bytes_ = bytes;
}

void Trace::sample_memory(double ts_us, SamplePoint at) {
  const memory::Stats s = memory::stats();
  std::vector<std::pair<std::string, int64_t>> values;
  const MemorySample sample{ts_us, at, memory::device_current_bytes(s), memory::take_interval_peak()};
  for (memory::Category c : kDeviceCategories)
    values.emplace_back(memory::to_string(c), s.current[static_cast<size_t>(c)]);
  counter("device memory (bytes)", values, ts_us);
  counter("device memory peak (bytes)", {{"peak since previous sample", sample.peak_bytes}}, ts_us);
  std::lock_guard<std::mutex> lock(mu_);
  samples_.push_back(sample);
}

std::vector<MemorySample> Trace::memory_samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}

int64_t Trace::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(events_.size());
}

int64_t Trace::dropped_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::string Trace::json() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"ration\"}}";
  for (const auto& [tid, track] : tracks_)
    os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid << ",\"args\":{\"name\":" << quoted(track)
       << "}}";
  for (const auto& e : events_) os << ",\n" << e;
  if (budget_bytes_ >= 0) {  // a flat line across the whole trace
    for (double ts : {0.0, last_us_})
      os << ",\n{\"name\":\"budget (bytes)\",\"ph\":\"C\",\"ts\":" << micros(ts) << ",\"pid\":1,\"args\":{\"budget\":"
         << budget_bytes_ << "}}";
  }
  os << "\n]}\n";
  return os.str();
}

void Trace::write(const std::string& path, const std::string& what, const std::string& bound_flag) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RATION_CHECK(dropped_ == 0, what, " '", path, "': the trace outgrew its bound of ", memory::format_bytes(max_bytes_),
                 " (", dropped_, " events not kept after ", events_.size(), "); raise ", bound_flag,
                 " or trace a shorter run");
  }
  const std::string text = json();
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    RATION_CHECK(out.good(), what, " '", path, "': cannot create '", tmp, "': ", std::strerror(errno),
                 " (expected a writable file path, e.g. trace.json)");
    out << text;
    out.flush();
    RATION_CHECK(out.good(), what, " '", path, "': write failed: ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    RATION_CHECK(false, what, " '", path, "': cannot rename the finished trace into place: ", std::strerror(err));
  }
}

Trace* current_trace() { return g_trace.load(std::memory_order_acquire); }
TraceScope::TraceScope(Trace& trace) : prev_(g_trace.exchange(&trace, std::memory_order_acq_rel)) {
  (void)memory::take_interval_peak();  // the first peak sample covers only this trace
}
TraceScope::~TraceScope() { g_trace.store(prev_, std::memory_order_release); }

const char* to_string(SpanKind k) {
  switch (k) {
    case SpanKind::Forward: return "forward";
    case SpanKind::Backward: return "backward";
    case SpanKind::Recompute: return "recompute";
  }
  return "?";
}

TraceSpan::TraceSpan(SpanKind kind, const std::string& scope, const std::string& op)
    : trace_(current_trace()), kind_(kind) {
  if (trace_ == nullptr) return;
  name_ = scope.empty() ? op : scope + "/" + op;
  start_us_ = trace_->now_us();
}

TraceSpan::~TraceSpan() {
  if (trace_ == nullptr) return;
  const double end = trace_->now_us();
  trace_->span("compute", name_, to_string(kind_), start_us_, end);
  if (kind_ != SpanKind::Recompute)
    trace_->sample_memory(end, kind_ == SpanKind::Forward ? SamplePoint::Forward : SamplePoint::Backward);
}

void TraceRegion::begin(const char* track, const char* category, std::string name) {
  track_ = track;
  category_ = category;
  name_ = std::move(name);
  start_us_ = trace_->now_us();
}

TraceRegion::~TraceRegion() {
  if (trace_ != nullptr) trace_->span(track_, name_, category_, start_us_, trace_->now_us());
}

}  // namespace ration
