// trace_parse.h — reading a Chrome trace written by core/trace.h back, for the trace tests.
// Owns: the parse and the rules every trace must keep (spans closed — complete events with a non-negative
//       duration — and properly nested per track, counters non-negative, only metadata / span / counter /
//       instant events). Does not own what a particular trace must contain (the tests).
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ration::testing {

struct Span {
  std::string name, cat;
  double ts = 0, end = 0;
};

struct Parsed {
  std::map<int, std::string> track_names;
  std::map<int, std::vector<Span>> spans;  // by tid, in ts order
  std::map<int, std::vector<Span>> instants;  // by tid (end == ts)
  std::vector<std::pair<double, int64_t>> memory;  // (ts, device bytes) per sample
  std::vector<std::pair<double, int64_t>> peaks;   // (ts, peak since the previous sample) per sample
  std::vector<int64_t> budget;
  int64_t max_peak = -1;  // highest "device memory peak" sample

  // The spans of the track named `name` (empty when there is no such track).
  std::vector<Span> track(const std::string& name) const {
    for (const auto& [tid, n] : track_names)
      if (n == name) {
        auto it = spans.find(tid);
        return it == spans.end() ? std::vector<Span>{} : it->second;
      }
    return {};
  }
  std::vector<Span> marks(const std::string& name) const {
    for (const auto& [tid, n] : track_names)
      if (n == name) {
        auto it = instants.find(tid);
        return it == instants.end() ? std::vector<Span>{} : it->second;
      }
    return {};
  }
};

inline Parsed parse(const std::string& text) {
  Parsed p;
  const nlohmann::json j = nlohmann::json::parse(text);
  for (const auto& e : j.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M" && e.at("name") == "thread_name") p.track_names[e.at("tid")] = e.at("args").at("name");
    if (ph == "X") {
      const double dur = e.at("dur");
      EXPECT_GE(dur, 0.0) << e.dump();
      p.spans[e.at("tid")].push_back({e.at("name"), e.at("cat"), e.at("ts"), double(e.at("ts")) + dur});
    }
    if (ph == "i") p.instants[e.at("tid")].push_back({e.at("name"), e.at("cat"), e.at("ts"), e.at("ts")});
    if (ph == "C") {
      int64_t total = 0;
      for (const auto& [series, v] : e.at("args").items()) {
        EXPECT_GE(v.get<int64_t>(), 0) << series;
        total += v.get<int64_t>();
      }
      if (e.at("name") == "device memory (bytes)") p.memory.emplace_back(e.at("ts"), total);
      if (e.at("name") == "budget (bytes)") p.budget.push_back(total);
      if (e.at("name") == "device memory peak (bytes)") {
        p.peaks.emplace_back(e.at("ts"), total);
        p.max_peak = std::max(p.max_peak, total);
      }
    }
    EXPECT_TRUE(ph == "M" || ph == "X" || ph == "C" || ph == "i") << "unexpected event " << e.dump();
  }
  for (auto& [tid, spans] : p.spans) {
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.ts < b.ts || (a.ts == b.ts && a.end > b.end);
    });
    std::vector<const Span*> open;
    for (const Span& s : spans) {
      // ts and dur are each printed to 1 ns, so spans that share a boundary (a step's forward and
      // backward phases) may overlap by up to 1 ns in the file: adjacent, not nested.
      while (!open.empty() && open.back()->end <= s.ts + 1e-3) open.pop_back();
      if (!open.empty())
        EXPECT_LE(s.end, open.back()->end + 1e-3) << s.name << " overlaps " << open.back()->name << " on track "
                                                  << p.track_names[tid];
      open.push_back(&s);
    }
  }
  return p;
}

inline int count_cat(const std::vector<Span>& spans, const std::string& cat) {
  return static_cast<int>(std::count_if(spans.begin(), spans.end(), [&](const Span& s) { return s.cat == cat; }));
}

}  // namespace ration::testing
