// op_profile.cpp — see op_profile.h.
#include "ration/train/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "ration/core/trace.h"

namespace ration::train {

OpProfile::OpProfile(int64_t skip, int64_t steps) : skip_(skip), steps_(steps) {}
OpProfile::~OpProfile() = default;

void OpProfile::before_forward(int64_t, data::Batch&) {
  const int64_t index = seen_++;
  active_ = index >= skip_ && index < skip_ + steps_;
  if (!active_) return;
  trace_ = std::make_unique<Trace>(int64_t{512} << 20);
  scope_ = std::make_unique<TraceScope>(*trace_);
  optimizer_start_us_ = -1;
  step_start_us_ = trace_->now_us();
}

void OpProfile::before_optimizer(int64_t) {
  if (active_) optimizer_start_us_ = trace_->now_us();
}

void OpProfile::after_step(int64_t, const StepStats& stats) {
  if (!active_) return;
  // The optimiser's share: the step's own wall time less what ran before before_optimizer (hooks that
  // run after the step, before this one's after_step, are not counted).
  if (optimizer_start_us_ >= 0)
    optimizer_ms_ += std::max(0.0, stats.ms - (optimizer_start_us_ - step_start_us_) / 1e3);
  scope_.reset();
  add_trace(trace_->json());
  trace_.reset();
  step_ms_ += stats.ms;
  ++profiled_;
  active_ = false;
}

// Self time per span: a backward span contains the recompute spans of the values it rebuilt (and a
// recompute may contain further ones), so each span's children are subtracted from it.
void OpProfile::add_trace(const std::string& trace_json) {
  struct Span {
    std::string name, cat;
    double ts, dur;
  };
  std::vector<Span> spans;
  const nlohmann::json j = nlohmann::json::parse(trace_json);
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat != "forward" && cat != "backward" && cat != "recompute") continue;
    spans.push_back({e.value("name", ""), cat, e.value("ts", 0.0), e.value("dur", 0.0)});
  }
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.ts < b.ts || (a.ts == b.ts && a.dur > b.dur);
  });
  std::vector<double> self(spans.size());
  std::vector<size_t> stack;  // open spans (indices), innermost last
  for (size_t i = 0; i < spans.size(); ++i) {
    self[i] = spans[i].dur;
    while (!stack.empty() && spans[stack.back()].ts + spans[stack.back()].dur <= spans[i].ts) stack.pop_back();
    if (!stack.empty()) self[stack.back()] -= spans[i].dur;
    stack.push_back(i);
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const double ms = std::max(0.0, self[i]) / 1e3;
    const size_t slash = s.name.rfind('/');
    const std::string op = slash == std::string::npos ? s.name : s.name.substr(slash + 1);
    if (!nodes_.count(s.name)) node_order_.push_back(s.name);
    for (Totals* t : {&ops_[op], &nodes_[s.name]}) {
      if (s.cat == "forward") {
        t->forward_ms += ms;
        ++t->calls;
      } else if (s.cat == "backward") {
        t->backward_ms += ms;
      } else {
        t->recompute_ms += ms;
      }
    }
    spans_ms_ += ms;
  }
}

nlohmann::json OpProfile::to_json() const {
  const double n = static_cast<double>(std::max<int64_t>(profiled_, 1));
  nlohmann::json ops = nlohmann::json::array();
  std::vector<std::pair<std::string, Totals>> sorted(ops_.begin(), ops_.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.forward_ms + a.second.backward_ms + a.second.recompute_ms >
           b.second.forward_ms + b.second.backward_ms + b.second.recompute_ms;
  });
  for (const auto& [op, t] : sorted)
    ops.push_back({{"op", op}, {"calls_per_step", static_cast<double>(t.calls) / n}, {"forward_ms", t.forward_ms / n},
                   {"backward_ms", t.backward_ms / n}, {"recompute_ms", t.recompute_ms / n}});
  nlohmann::json nodes = nlohmann::json::array();
  for (const std::string& name : node_order_) {
    const Totals& t = nodes_.at(name);
    nodes.push_back({{"node", name}, {"calls_per_step", static_cast<double>(t.calls) / n},
                     {"forward_ms", t.forward_ms / n}, {"backward_ms", t.backward_ms / n},
                     {"recompute_ms", t.recompute_ms / n}});
  }
  const double step = step_ms_ / n, spans = spans_ms_ / n, opt = optimizer_ms_ / n;
  return {{"profiled_steps", profiled_}, {"step_ms", step}, {"node_spans_ms", spans}, {"optimizer_ms", opt},
          {"outside_spans_ms", std::max(0.0, step - spans - opt)}, {"ops", ops}, {"nodes", nodes}};
}

std::string OpProfile::table(size_t max_rows) const {
  const nlohmann::json j = to_json();
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "per-op profile: %lld steps, per-step averages (self time, ms)\n",
                static_cast<long long>(profiled_));
  out += line;
  std::snprintf(line, sizeof line, "%-28s %8s %10s %10s %10s %10s\n", "op", "calls", "forward", "backward",
                "recompute", "total");
  out += line;
  size_t rows = 0;
  for (const auto& o : j["ops"]) {
    if (rows++ >= max_rows) break;
    const double f = o["forward_ms"], b = o["backward_ms"], r = o["recompute_ms"];
    std::snprintf(line, sizeof line, "%-28s %8.1f %10.2f %10.2f %10.2f %10.2f\n", o["op"].get<std::string>().c_str(),
                  o["calls_per_step"].get<double>(), f, b, r, f + b + r);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "step %.2f ms = node spans %.2f + optimiser/clip %.2f + outside spans (engine, hooks) %.2f\n",
                j["step_ms"].get<double>(), j["node_spans_ms"].get<double>(), j["optimizer_ms"].get<double>(),
                j["outside_spans_ms"].get<double>());
  out += line;
  return out;
}

}  // namespace ration::train
