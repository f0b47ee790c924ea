// test_trace.cpp — the timeline (core/trace.h) parses and tells the truth about the step it recorded.
// Owns: checks that a traced step is valid Chrome Trace Event JSON with every span closed and nested per
//       track, one forward span per recorded node and one backward span per backward node, recompute
//       spans inside the backward span that needed them, non-negative counters whose forward samples equal
//       the profiler's measured bytes at each node's end and whose peak counter's maximum is the step's
//       measured peak, the budget line, the size bound's error, and
//       nested scopes. Does not own the CLI flags (`--trace` on plan and gradcheck call the same code).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "op_check.h"
#include "test_util.h"
#include "trace_parse.h"

#include "ration/config/config.h"
#include "ration/core/trace.h"
#include "ration/base/allocator.h"
#include "ration/models/model.h"
#include "ration/ops/ops.h"
#include "ration/runtime/step_runtime.h"

namespace ration::testing {
namespace {

TEST(Trace, ProfiledStepMatchesTheProfile) {
  Config cfg = Config::from_string("[model]\ntype='cnn'\nchannels=[4,8]\nfc_hidden=16\ndropout=0.25\n", "cnn.toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  data::Batch b;
  b.input = Value(at::randn({16, 1, 28, 28}));
  b.target = Value(at::randint(0, 10, {16}, at::kLong));
  b.items = 16;
  Trace trace;
  trace.set_budget(int64_t{7} << 20);
  memory::StepProfile profile;
  {
    TraceScope scope(trace);
    profile = train::profile_step(*model, b, 11);
  }
  const Parsed p = parse(trace.json());
  ASSERT_EQ(p.track_names.size(), 1u);
  EXPECT_EQ(p.track_names.begin()->second, "compute");
  const std::vector<Span>& compute = p.spans.begin()->second;
  ASSERT_EQ(count_cat(compute, "forward"), static_cast<int>(profile.nodes.size()));
  EXPECT_EQ(count_cat(compute, "backward"), static_cast<int>(profile.backward_order.size()));
  // Forward spans in creation order carry the node's module path and op; the memory sample at each
  // forward span's end (same instant; ts and dur are each printed to 1 ns) is the profiler's measurement
  // at that node's end, byte for byte.
  std::vector<const Span*> forward;
  for (const Span& s : compute)
    if (s.cat == "forward") forward.push_back(&s);
  for (size_t i = 0; i < forward.size(); ++i) {
    const auto& node = profile.nodes[i];
    EXPECT_EQ(forward[i]->name, node.scope.empty() ? node.op : node.scope + "/" + node.op);
    const auto sample = std::find_if(p.memory.begin(), p.memory.end(),
                                     [&](const auto& m) { return std::abs(m.first - forward[i]->end) < 0.002; });
    ASSERT_NE(sample, p.memory.end()) << "no memory sample at the end of " << forward[i]->name;
    EXPECT_EQ(sample->second, node.end_bytes) << forward[i]->name;
  }
  EXPECT_EQ(p.memory.size(), profile.nodes.size() + profile.backward_order.size());
  EXPECT_EQ(p.max_peak, profile.measured_peak_bytes) << "the peak counter's maximum is the step's measured peak";
  for (size_t i = 1; i < p.memory.size(); ++i) EXPECT_GE(p.memory[i].first, p.memory[i - 1].first) << "one clock";
  ASSERT_EQ(p.budget.size(), 2u) << "the budget is a flat line from start to end";
  EXPECT_EQ(p.budget[0], int64_t{7} << 20);
}

TEST(Trace, RecomputeSpansNestInsideTheBackwardThatNeedsThem) {
  DropAllPolicy drop;
  Trace trace;
  Value x(at::randn({8, 16}), true), w(at::randn({16, 16}) * 0.3, true);
  {
    TraceScope scope(trace);
    PolicyScope policy(&drop);
    Value h = x;
    for (int i = 0; i < 3; ++i) h = ops::tanh(ops::matmul(h, w));
    ops::mean(h).backward();
  }
  ASSERT_GT(drop.recomputes, 0);
  const Parsed p = parse(trace.json());
  const std::vector<Span>& compute = p.spans.begin()->second;
  EXPECT_EQ(count_cat(compute, "recompute"), drop.recomputes);
  for (const Span& r : compute) {
    if (r.cat != "recompute") continue;
    const bool inside = std::any_of(compute.begin(), compute.end(), [&](const Span& b) {
      return b.cat == "backward" && b.ts <= r.ts && r.end <= b.end + 1e-3;
    });
    EXPECT_TRUE(inside) << r.name << " at " << r.ts;
  }
}

TEST(Trace, OffCostsNothingAndScopesNest) {
  EXPECT_EQ(current_trace(), nullptr);
  Trace outer, inner;
  {
    TraceScope a(outer);
    {
      TraceScope b(inner);
      EXPECT_EQ(current_trace(), &inner);
    }
    EXPECT_EQ(current_trace(), &outer);
  }
  EXPECT_EQ(current_trace(), nullptr);
  Value x(at::randn({4}), true);
  ops::sum(ops::tanh(x)).backward();  // no trace installed: nothing recorded anywhere
  EXPECT_EQ(outer.events(), 0);
  EXPECT_EQ(inner.events(), 0);
}

TEST(Trace, OutgrowingTheBoundIsAnErrorNamingTheFlag) {
  Trace small(600);
  {
    TraceScope scope(small);
    Value x(at::randn({4}), true);
    ops::sum(ops::tanh(ops::tanh(x))).backward();
  }
  EXPECT_GT(small.dropped_events(), 0);
  TempDir dir("trace");
  const std::string path = (dir.path / "t.json").string();
  expect_error_containing([&] { small.write(path, "--trace", "--trace-max-mb"); },
                          {"--trace", "t.json", "--trace-max-mb", "outgrew"});
  Trace ok;
  ok.span("copy-out", "x \"quoted\"", "copy", 1, 2);
  ok.write(path, "--trace", "--trace-max-mb");
  const Parsed p = parse(read_file(path));
  EXPECT_EQ(p.spans.begin()->second.at(0).name, "x \"quoted\"");
}

}  // namespace
}  // namespace ration::testing
