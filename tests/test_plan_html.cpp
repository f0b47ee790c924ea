// test_plan_html.cpp — the memory picture (plan/html.h) says what the plan says.
// Owns: checks of the page's content against the StepProfile and Plan it was drawn from: one step per
//       node boundary in each series, the budget line where the budget is, one table row per group with
//       the plan's decision, bytes and deadline, nothing fetched from outside, names escaped, the
//       atomic write and its error. Does not own rendering in a browser (tests/cli/plan_html_render.sh).
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "test_util.h"

#include "ration/config/config.h"
#include "ration/base/allocator.h"
#include "ration/plan/html.h"
#include "ration/plan/planner.h"
#include "ration/models/model.h"
#include "ration/runtime/step_runtime.h"

namespace ration::testing {
namespace {

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// The number of step segments ("H") in the path of the series with this id.
int steps_in(const std::string& page, const std::string& id) {
  const std::regex re("<path id=\"" + id + "\"[^>]* d=\"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(page, m, re)) return -1;
  return count_of(m[1].str(), "H");
}

struct Planned {
  memory::StepProfile profile;
  memory::Plan plan;
};

// Channels [8, 16]: with [4, 8] the step's peak sat in the first convolution's backward on some hosts (its
// workspace, which depends on the CPU's convolution kernels, outgrew every activation), so no drop lowered it.
Planned plan_cnn(double budget_fraction) {
  Config cfg = Config::from_string("[model]\ntype='cnn'\nchannels=[8,16]\nfc_hidden=16\ndropout=0.25\n", "cnn.toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  data::Batch b;
  b.input = Value(at::randn({32, 1, 28, 28}));
  b.target = Value(at::randint(0, 10, {32}, at::kLong));
  b.items = 32;
  Planned p;
  p.profile = train::profile_step(*model, b, 11);
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const memory::Plan loose = memory::make_plan(p.profile, probe);
  EXPECT_LT(loose.minimum_peak_bytes, loose.unconstrained_peak_bytes) << "dropping activations lowers this step's peak";
  memory::PlanOptions o;
  o.budget_bytes = loose.minimum_peak_bytes +
                   static_cast<int64_t>(budget_fraction * static_cast<double>(loose.unconstrained_peak_bytes -
                                                                              loose.minimum_peak_bytes));
  p.plan = memory::make_plan(p.profile, o);
  return p;
}

TEST(PlanHtml, ChartAndTableMatchThePlan) {
  const Planned p = plan_cnn(0.3);
  ASSERT_GT(p.plan.dropped_groups, 0) << "a budget between the floor and the unconstrained peak drops something";
  const std::string page = memory::plan_html(p.profile, p.plan, "cnn <test> & budget");

  // One step per node boundary: forward nodes, then backward nodes.
  const int slots = static_cast<int>(p.profile.nodes.size() + p.profile.backward_peak_bytes.size());
  EXPECT_EQ(steps_in(page, "series-measured"), slots);
  EXPECT_EQ(steps_in(page, "series-plan"),
            static_cast<int>(p.plan.prediction.forward_peaks.size() + p.plan.prediction.backward_peaks.size()));
  EXPECT_EQ(static_cast<int>(p.plan.prediction.forward_peaks.size()), static_cast<int>(p.profile.nodes.size()));
  EXPECT_NE(page.find("id=\"budget-line\""), std::string::npos);
  EXPECT_NE(page.find("budget " + memory::format_bytes(p.plan.budget_bytes)), std::string::npos);
  EXPECT_NE(page.find("device memory (MiB)"), std::string::npos) << "y axis names its unit";
  EXPECT_NE(page.find("node boundary"), std::string::npos) << "x axis is labelled";

  // The budget line sits below the measured unconstrained peak (this budget forces drops) and above
  // the plan's whole prediction: compare y coordinates (SVG y grows downwards).
  const std::regex budget_re("id=\"budget-line\"[^>]* y1=\"([0-9.]+)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(page, m, budget_re));
  const double y_budget = std::stod(m[1].str());
  const std::regex path_re("<path id=\"series-plan\"[^>]* d=\"([^\"]*)\"");
  ASSERT_TRUE(std::regex_search(page, m, path_re));
  const std::string d = m[1].str();
  const std::regex point_re("[ML]([0-9.]+) ([0-9.]+)");
  int points = 0;
  for (auto it = std::sregex_iterator(d.begin(), d.end(), point_re); it != std::sregex_iterator(); ++it, ++points)
    EXPECT_GE(std::stod((*it)[2].str()) + 0.05, y_budget) << "a predicted step is drawn above the budget line";
  EXPECT_EQ(points, slots);

  // One row per group, with the plan's decision and exact bytes.
  EXPECT_EQ(count_of(page, "<tr data-group="), static_cast<int>(p.plan.groups.size()));
  EXPECT_EQ(count_of(page, "data-v=\"kept\""), p.plan.kept_groups);
  EXPECT_EQ(count_of(page, "data-v=\"recomputed\""), p.plan.dropped_groups - p.plan.offloaded_groups);
  for (const auto& g : p.plan.groups) {
    const std::regex row_re("<tr data-group=\"" + std::to_string(g.storage) + "\">.*?data-v=\"" +
                            std::to_string(g.bytes) + "\".*?data-v=\"(kept|recomputed|offloaded)\"");
    ASSERT_TRUE(std::regex_search(page, m, row_re)) << "group " << g.storage;
    EXPECT_EQ(m[1].str(), g.decision == memory::Decision::Keep ? "kept" : g.decision == memory::Decision::Offload ? "offloaded" : "recomputed");
  }

  // Self-contained and escaped.
  for (const char* external : {"http:", "https:", "<link", "<img", "src=", "href=", "url(", "@import"})
    EXPECT_EQ(page.find(external), std::string::npos) << external;
  EXPECT_NE(page.find("cnn &lt;test&gt; &amp; budget"), std::string::npos);
  EXPECT_EQ(page.find("<test>"), std::string::npos);
  EXPECT_EQ(count_of(page, "<script>"), 1);
}

TEST(PlanHtml, WritesAtomicallyAndNamesTheFlagOnError) {
  const Planned p = plan_cnn(0.6);
  TempDir dir("plan_html");
  const std::string path = (dir.path / "plan.html").string();
  memory::write_plan_html(path, "--html", p.profile, p.plan, "cnn");
  EXPECT_EQ(read_file(path), memory::plan_html(p.profile, p.plan, "cnn"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename(), "plan.html") << "a temporary file was left behind";
  expect_error_containing([&] { memory::write_plan_html("/nonexistent/dir/plan.html", "--html", p.profile, p.plan, "cnn"); },
                          {"--html", "/nonexistent/dir/plan.html"});
}

}  // namespace
}  // namespace ration::testing
