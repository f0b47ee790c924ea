// test_trace_train.cpp — traces of training runs (train/step_trace.h and the layers' trace points).
// Owns: checks that a traced run of `ration train` is a valid trace (every span closed and nested per
//       track, counters non-negative) whose memory counter's maximum is the report's peak — per traced
//       step StepStats::peak_bytes, over a range covering the run memory.peak_bytes — with nothing sampled
//       between traced steps; that offloading draws the copy-out and copy-in queues and the stalls (T2
//       pauses, T3 holds, waits for a copy) on tracks of their own, one span per copy the engine counted;
//       that the optimiser, the reducer's bucket all-reduces and the parameter-server pulls and pushes
//       appear; and the step range's parsing and default.
// Does not own the trace format's own checks (test_trace.cpp) or the CLI flags (tests/cli).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "trace_parse.h"

#include "ration/core/trace.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/step_trace.h"
#include "ration/train/trainer.h"

namespace ration::testing {
namespace {

// Attaches a StepTracer for `range` to the run, as `ration train --trace` does.
class Tracing : public train::RunObserver {
 public:
  Tracing(Trace& trace, train::StepRange range) : trace_(trace), range_(range) {}
  void before_steps(train::StepRuntime& runtime, int64_t, int64_t) override {
    tracer = std::make_unique<train::StepTracer>(trace_, range_);
    runtime.add_hook(tracer.get());
    if (runtime.settings().budget.has_budget()) trace_.set_budget(runtime.settings().budget.budget_bytes());
  }
  std::unique_ptr<train::StepTracer> tracer;

 private:
  Trace& trace_;
  train::StepRange range_;
};

std::string gpt_config(int64_t steps, const std::string& extra = "") {
  return "[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=32\nblock_size=32\ndropout=0.1\n"
         "[data]\nkind='text'\n[optim]\nname='adamw'\nlr=0.003\nwarmup_steps=1\n[train]\nbatch_size=8\nsteps=" +
         std::to_string(steps) + "\neval_every=2\neval_batches=2\nlog_every=100\nthreads=1\ncheckpoint_dir=''\n" + extra;
}

struct TracedRun {
  nlohmann::json report;
  Parsed parsed;
  std::vector<train::TracedStep> steps;
};

TracedRun traced_run(const std::string& config, train::StepRange range, std::vector<std::string> overrides = {}) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  Trace trace;
  Tracing tracing(trace, range);
  train::TrainOptions o;
  o.config_path = dir.write("run.toml", config);
  o.overrides = std::move(overrides);
  o.json = true;
  o.observer = &tracing;
  TracedRun r;
  r.report = train::run_training(o);
  r.parsed = parse(trace.json());
  r.steps = tracing.tracer->steps();
  EXPECT_EQ(trace.dropped_events(), 0);
  return r;
}

bool inside(const Span& s, const Span& outer) { return outer.ts <= s.ts && s.end <= outer.end + 1e-3; }

// The step track's "step N" spans.
std::vector<Span> step_spans(const Parsed& p) {
  std::vector<Span> out;
  for (const Span& s : p.track("step"))
    if (s.name.rfind("step ", 0) == 0) out.push_back(s);
  return out;
}

TEST(TraceTrain, TracedStepsAreWellFormedAndTheirPeakIsTheReports) {
  const TracedRun r = traced_run(gpt_config(4), {0, 4});
  const Parsed& p = r.parsed;
  const std::vector<Span> steps = step_spans(p);
  ASSERT_EQ(steps.size(), 4u);
  ASSERT_EQ(r.steps.size(), 4u);
  // Each step holds its forward and backward phases; node spans and the optimiser update lie in a step.
  const std::vector<Span> phases = p.track("step");
  EXPECT_EQ(phases.size(), 12u);
  const std::vector<Span> compute = p.track("compute");
  EXPECT_GT(count_cat(compute, "forward"), 4 * 10);
  EXPECT_GT(count_cat(compute, "backward"), 4 * 10);
  const std::vector<Span> updates = p.track("optimizer");
  ASSERT_EQ(updates.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(steps[i].name, "step " + std::to_string(i));
    EXPECT_EQ(updates[i].name, "AdamW update");
    EXPECT_TRUE(inside(updates[i], steps[i])) << "update of step " << i;
  }
  for (const Span& s : compute)
    EXPECT_TRUE(std::any_of(steps.begin(), steps.end(), [&](const Span& st) { return inside(s, st); })) << s.name;
  // Memory is sampled inside traced steps only (evaluation after step 1 and 3 is not traced), and each
  // step's highest peak sample is that step's measured peak; over the whole run, the report's peak.
  for (const auto& [ts, bytes] : p.peaks)
    EXPECT_TRUE(std::any_of(steps.begin(), steps.end(), [&](const Span& st) { return st.ts <= ts && ts <= st.end + 1e-3; }))
        << "a memory sample at " << ts << " us outside every traced step";
  for (size_t i = 0; i < 4; ++i) {
    int64_t high = -1;
    for (const auto& [ts, bytes] : p.peaks)
      if (steps[i].ts <= ts && ts <= steps[i].end + 1e-3) high = std::max(high, bytes);
    EXPECT_EQ(high, r.steps[i].peak_bytes) << "step " << i;
    EXPECT_EQ(r.steps[i].forward_peaks.size(), r.steps[0].forward_peaks.size());
    EXPECT_GT(r.steps[i].backward_peaks.size(), 0u);
  }
  EXPECT_EQ(p.max_peak, r.report["memory"]["peak_bytes"].get<int64_t>());
}

TEST(TraceTrain, ARangeTracesOnlyItsSteps) {
  const TracedRun r = traced_run(gpt_config(5), {2, 4});
  const std::vector<Span> steps = step_spans(r.parsed);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].name, "step 2");
  EXPECT_EQ(steps[1].name, "step 3");
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.parsed.max_peak, std::max(r.steps[0].peak_bytes, r.steps[1].peak_bytes));
  EXPECT_LE(r.parsed.max_peak, r.report["memory"]["peak_bytes"].get<int64_t>());
}

TEST(TraceTrain, OffloadDrawsCopyQueuesAndStallsOnTracksOfTheirOwn) {
  // Threshold offload of every saved value of 1 KiB or more through a slowed tier: forward pauses above
  // T2 while copies fly, T3 holds every prefetch back, so backward waits for copy-ins.
  const TracedRun r = traced_run(gpt_config(3), {0, 3},
                                 {"offload.enabled=true", "offload.tier=host", "offload.min_bytes=1KiB",
                                  "offload.t2=1B", "offload.t3=1B", "offload.throttle=64MiB"});
  const Parsed& p = r.parsed;
  const nlohmann::json& totals = r.report["offload"]["totals"];
  ASSERT_GT(totals["offloaded_storages"].get<int64_t>(), 0);
  // Copies a waiting compute thread ran itself (OffloadEngine's CopyWaits) are on tracks of their own.
  std::vector<Span> out = p.track("copy-out"), in = p.track("copy-in");
  const std::vector<Span> stalls = p.track("stalls");
  for (const Span& s : p.track("copy-out (waiting thread)")) out.push_back(s);
  for (const Span& s : p.track("copy-in (waiting thread)")) in.push_back(s);
  EXPECT_EQ(static_cast<int64_t>(out.size()), totals["offloaded_storages"].get<int64_t>());
  EXPECT_EQ(static_cast<int64_t>(in.size()),
            totals["prefetches"].get<int64_t>() + totals["demand_fetches"].get<int64_t>());
  for (const Span& s : out) EXPECT_EQ(s.name.rfind("write ", 0), 0u) << s.name;
  for (const Span& s : in) EXPECT_EQ(s.name.rfind("read ", 0), 0u) << s.name;
  auto named = [](const std::vector<Span>& spans, const std::string& prefix) {
    return static_cast<int64_t>(
        std::count_if(spans.begin(), spans.end(), [&](const Span& s) { return s.name.rfind(prefix, 0) == 0; }));
  };
  EXPECT_EQ(named(stalls, "T2 pause"), totals["forward_pauses"].get<int64_t>());
  EXPECT_GT(totals["forward_pauses"].get<int64_t>(), 0);
  EXPECT_GT(named(stalls, "wait for copy-in"), 0);
  EXPECT_EQ(named(p.marks("stalls"), "T3 hold"), totals["deferred_prefetches"].get<int64_t>());
  EXPECT_GT(totals["deferred_prefetches"].get<int64_t>(), 0);
  EXPECT_EQ(p.max_peak, r.report["memory"]["peak_bytes"].get<int64_t>());
}

TEST(TraceTrain, CollectivesAndParameterServerCallsHaveSpans) {
  // The ctr model pulls its embedding rows from parameter-server shards in forward and pushes their
  // gradients in backward; dist.sync_every=2 sends every step's gradients through the reducer's buckets.
  const std::string ctr =
      "[model]\ntype='ctr'\nembedding_dim=8\nbottom=[16]\ntop=[16]\nbag_mode='mean'\n"
      "[data]\nkind='synthetic_ctr'\ncardinalities=[2000, 200, 20]\nbag_min=[1, 1, 1]\nbag_max=[1, 3, 2]\n"
      "num_dense=3\ntrain_samples=4000\neval_samples=500\nclick_rate=0.3\nweight_scale=1.5\n"
      "[ps]\nshards=2\nlr=0.1\n[dist]\nsync_every=2\nbucket_bytes='1KiB'\nfirst_bucket_bytes='1KiB'\n"
      "[optim]\nname='sgd'\nlr=0.01\nschedule='constant'\n"
      "[train]\nbatch_size=64\nsteps=3\neval_every=0\nlog_every=1000\nthreads=1\ncheckpoint_dir=''\n";
  const TracedRun r = traced_run(ctr, {0, 3});
  const Parsed& p = r.parsed;
  const nlohmann::json& dist = r.report["dist"];
  const int64_t buckets = static_cast<int64_t>(dist["bucket_bytes"].size());
  ASSERT_GT(buckets, 1);
  const std::vector<Span> collectives = p.track("collectives");
  EXPECT_EQ(static_cast<int64_t>(collectives.size()), buckets * dist["synchronizations"].get<int64_t>());
  for (const Span& s : collectives) EXPECT_NE(s.name.find("all-reduce, bucket "), std::string::npos) << s.name;
  const std::vector<Span> stalls = p.track("stalls");
  EXPECT_EQ(static_cast<int64_t>(stalls.size()), dist["synchronizations"].get<int64_t>());
  const std::vector<Span> ps = p.track("ps");
  const auto pulls = std::count_if(ps.begin(), ps.end(), [](const Span& s) { return s.name.rfind("pull ", 0) == 0; });
  const auto pushes = std::count_if(ps.begin(), ps.end(), [](const Span& s) { return s.name.rfind("push ", 0) == 0; });
  EXPECT_GE(pulls, 3 * 2);   // every micro-batch pulls
  EXPECT_GE(pushes, 3 * 2);  // and pushes
  EXPECT_EQ(p.track("optimizer").size(), 3u);  // one update per step, after the second micro-batch
}

TEST(TraceTrain, StepRangesParseAndDefaultAfterTheFirstStep) {
  const train::StepRange r = train::parse_step_range("2:5", "--trace-steps");
  EXPECT_EQ(r.first, 2);
  EXPECT_EQ(r.end, 5);
  for (const char* bad : {"5:2", "3:3", "3", "a:4", "-1:2", "1:2x"})
    expect_error_containing([&] { train::parse_step_range(bad, "--trace-steps"); },
                            {"--trace-steps", "expected A:B", std::string("'") + bad + "'"});
  auto eq = [](train::StepRange a, int64_t first, int64_t end) { return a.first == first && a.end == end; };
  EXPECT_TRUE(eq(train::default_trace_steps(0, 10), 1, 3));
  EXPECT_TRUE(eq(train::default_trace_steps(0, 2), 1, 2));
  EXPECT_TRUE(eq(train::default_trace_steps(0, 1), 0, 1));
  EXPECT_TRUE(eq(train::default_trace_steps(7, 20), 8, 10));  // a resumed run
}

}  // namespace
}  // namespace ration::testing
