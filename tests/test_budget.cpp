// The budget planner and executor (seed method M0): measured peak within the budget, prediction
// within 5% of the measurement, gradients bit-identical to unconstrained training (dropout on), the
// user-override rule and the below-minimum error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "test_util.h"
#include "batch_util.h"

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/plan/chain.h"
#include "ration/plan/context.h"
#include "ration/plan/graph.h"
#include "ration/plan/incremental.h"
#include "ration/plan/planner.h"
#include "ration/models/model.h"
#include "ration/runtime/budget.h"
#include "ration/runtime/step_runtime.h"

namespace ration {
namespace {
using testing::error_of;

struct Case {
  std::string name;
  std::string toml;
};

data::Batch batch_for(const std::string& name) {
  return testing::random_batch(name == "cnn", name == "cnn" ? 64 : 8, 32, 5);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"gpt", "[model]\ntype='gpt'\nn_layer=3\nn_head=2\nn_embd=32\nblock_size=32\ndropout=0.1\n"},
      {"cnn", "[model]\ntype='cnn'\nchannels=[8,16]\nfc_hidden=32\ndropout=0.25\n"},
      {"lstm_lm", "[model]\ntype='lstm_lm'\nn_embd=16\nhidden_size=32\nn_layer=2\ndropout=0.1\n"},
  };
  return c;
}

// A 12-layer gpt: deep enough for re-run cascades and for the two descents to part ways.
const Case& deep_gpt() {
  static const Case c{"gpt", "[model]\ntype='gpt'\nn_layer=12\nn_head=2\nn_embd=16\nblock_size=32\ndropout=0.1\n"};
  return c;
}

// Offload costs slow enough that some copies do not hide under compute.
memory::OffloadCosts slow_offload() {
  memory::OffloadCosts costs;
  costs.write_bytes_per_ms = costs.read_bytes_per_ms = 2e5;
  costs.per_copy_ms = 0.01;
  return costs;
}

// Peaks are compared above each run's own baseline (StepStats::peak_above_baseline: bytes live before
// the step excluded), so tensors the test itself keeps alive between runs (the reference gradients) do
// not blur the comparison. Every step runs with the same dropout seed, gradients collected.
const train::StepOptions kStep = train::StepOptions::collecting(11);

void expect_same_gradients(const train::StepStats& a, const train::StepStats& b) {
  ASSERT_EQ(a.gradients.size(), b.gradients.size());
  for (size_t i = 0; i < a.gradients.size(); ++i)
    EXPECT_TRUE(at::equal(a.gradients[i].second, b.gradients[i].second)) << a.gradients[i].first << " differs";
}

class Budget : public ::testing::TestWithParam<Case> {};

TEST_P(Budget, PeakFitsPredictionWithinFivePercentGradientsBitwiseEqual) {
  Config cfg = Config::from_string(GetParam().toml, GetParam().name + ".toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  const data::Batch batch = batch_for(GetParam().name);
  train::StepRuntime runtime, plain_runtime;
  const memory::StepProfile& profile = runtime.profile(*model, batch, 11);
  const train::StepStats plain = plain_runtime.measure_step(*model, batch, kStep);
  const int64_t base = profile.baseline_bytes;

  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const memory::Plan loose = memory::make_plan(profile, probe);
  const int64_t hi = loose.unconstrained_peak_bytes, lo = loose.minimum_peak_bytes;
  ASSERT_LT(lo, hi) << "planner found no saving at all";
  EXPECT_NEAR(static_cast<double>(hi - base), static_cast<double>(plain.peak_above_baseline()),
              0.05 * static_cast<double>(plain.peak_above_baseline()))
      << "unconstrained prediction vs measurement";

  // Re-run counts are not compared between budgets: the knapsack orders groups by measured recompute
  // time, and a tighter budget may take the memory-ordered descent's plan where the looser one took the
  // time-ordered one, so a tighter plan can re-run fewer nodes (it did, once in three CI runs, with
  // freshly measured times). What holds at every budget: nothing is rebuilt at the unconstrained peak,
  // and every recomputed group is rebuilt at least once.
  for (double f : {1.0, 0.75, 0.5, 0.25, 0.0}) {
    memory::PlanOptions o;
    o.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
    const memory::Plan& plan = runtime.plan(o);
    const train::StepStats m = runtime.measure_step(*model, batch, kStep);
    SCOPED_TRACE("budget " + memory::format_bytes(o.budget_bytes) + ": " + plan.to_table());
    EXPECT_LE(m.peak_above_baseline(), o.budget_bytes - base) << "measured peak over budget";
    const int64_t predicted = plan.prediction.peak_bytes - base;
    EXPECT_LE(std::abs(static_cast<double>(predicted - m.peak_above_baseline())),
              0.05 * static_cast<double>(m.peak_above_baseline()))
        << "predicted " << predicted << " measured " << m.peak_above_baseline() << " (above baseline)";
    expect_same_gradients(m, plain);
    if (f == 1.0) {
      EXPECT_EQ(plan.dropped_groups, 0) << "a group dropped at the unconstrained peak";
      EXPECT_EQ(plan.prediction.recomputed_nodes, 0) << "a node re-run at the unconstrained peak";
    }
    if (plan.dropped_groups > plan.offloaded_groups)
      EXPECT_GT(plan.prediction.recomputed_nodes, 0) << "recomputed groups never rebuilt";
    if (f == 0.0) EXPECT_GT(plan.dropped_groups, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Budget, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

class PlannerRules : public ::testing::Test {
 protected:
  void SetUp() override {
    Config cfg = Config::from_string(cases()[0].toml, "gpt.toml");
    at::manual_seed(3);
    model = models::build_model(cfg);
    model->train();
    batch = batch_for("gpt");
    profile = runtime.profile(*model, batch, 11);
    memory::PlanOptions probe;
    probe.budget_bytes = int64_t{1} << 40;
    const memory::Plan loose = memory::make_plan(profile, probe);
    hi = loose.unconstrained_peak_bytes;
    lo = loose.minimum_peak_bytes;
  }
  std::unique_ptr<models::Model> model;
  data::Batch batch;
  train::StepRuntime runtime, plain_runtime;
  memory::StepProfile profile;
  int64_t hi = 0, lo = 0;
};

TEST_F(PlannerRules, BudgetBelowMinimumFailsStatingTheMinimum) {
  memory::PlanOptions o;
  o.budget_bytes = lo - 1024 * 1024;
  const std::string msg = error_of([&] { memory::make_plan(profile, o); });
  EXPECT_NE(msg.find("below the feasible minimum " + memory::format_bytes(lo)), std::string::npos) << msg;
}

// Measured forward times are noisy from run to run; whether a budget is met must not be. The feasible
// minimum, and the fit at a budget just above it, are the same under any distortion of the times.
TEST_F(PlannerRules, FeasibleMinimumDoesNotDependOnMeasuredTimes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> factor(0.2, 5.0);
  for (int trial = 0; trial < 6; ++trial) {
    memory::StepProfile noisy = profile;
    for (auto& n : noisy.nodes) n.forward_ms *= factor(rng);
    memory::PlanOptions o;
    o.budget_bytes = int64_t{1} << 40;
    const memory::Plan loose = memory::make_plan(noisy, o);
    EXPECT_EQ(loose.minimum_peak_bytes, lo) << "trial " << trial;
    EXPECT_EQ(loose.unconstrained_peak_bytes, hi) << "trial " << trial;
    o.budget_bytes = lo;
    memory::Plan at_floor;
    ASSERT_NO_THROW(at_floor = memory::make_plan(noisy, o)) << "trial " << trial;
    EXPECT_LE(at_floor.prediction.peak_bytes, lo);
    o.budget_bytes = lo - 1;
    EXPECT_NE(error_of([&] { memory::make_plan(noisy, o); }).find("below the feasible minimum"), std::string::npos);
  }
}

// What a plan command promises must not move with timing noise either: at every budget, under any
// distortion of the measured times, the initial figure (what --keep-groups / --keep-bytes may ask for) is
// the same, and so is whether an override succeeds; the plan still fits. Times only choose which groups.
TEST_F(PlannerRules, InitialFigureAndOverridesDoNotDependOnMeasuredTimes) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> factor(0.5, 2.0);
  std::vector<memory::StepProfile> noisy(8, profile);
  for (auto& p : noisy)
    for (auto& n : p.nodes) n.forward_ms *= factor(rng);
  for (const int64_t budget : {lo, lo + (hi - lo) / 20, lo + (hi - lo) / 5, lo + (hi - lo) / 2, hi - (hi - lo) / 10}) {
    SCOPED_TRACE("budget " + memory::format_bytes(budget));
    memory::PlanOptions o;
    o.budget_bytes = budget;
    const memory::Plan first = memory::make_plan(profile, o);
    const int64_t groups = first.initial_kept_groups, bytes = first.initial_kept_bytes;
    // Overrides at and below the figure: their outcome (plan or error text) is the same on every run.
    auto outcome = [&](const memory::StepProfile& p, std::optional<int64_t> keep_groups, std::optional<int64_t> keep_bytes) {
      memory::PlanOptions with = o;
      with.keep_groups = keep_groups;
      with.keep_bytes = keep_bytes;
      try {
        const memory::Plan plan = memory::make_plan(p, with);
        EXPECT_TRUE(plan.fits);
        EXPECT_LE(plan.prediction.peak_bytes, budget);
        if (keep_groups) EXPECT_LE(plan.kept_groups, *keep_groups);
        if (keep_bytes) EXPECT_LE(plan.kept_bytes, *keep_bytes);
        return std::string("ok");
      } catch (const Error& e) {
        return std::string(e.what());
      }
    };
    const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> overrides = {
        {groups, std::nullopt}, {groups + 1, std::nullopt}, {groups - 1, std::nullopt}, {groups / 2, std::nullopt},
        {std::nullopt, bytes}, {std::nullopt, bytes + 1}, {std::nullopt, bytes * 3 / 4}};
    std::vector<std::string> expected;
    for (const auto& [g, b] : overrides) expected.push_back(outcome(profile, g, b));
    EXPECT_EQ(expected[0], "ok");
    EXPECT_NE(expected[1].find("initial figure of " + std::to_string(groups)), std::string::npos) << expected[1];
    for (size_t t = 0; t < noisy.size(); ++t) {
      SCOPED_TRACE("distortion " + std::to_string(t));
      const memory::Plan plan = memory::make_plan(noisy[t], o);
      EXPECT_EQ(plan.initial_kept_groups, groups);
      EXPECT_EQ(plan.initial_kept_bytes, bytes);
      EXPECT_LE(plan.prediction.peak_bytes, budget);
      for (size_t k = 0; k < overrides.size(); ++k)
        EXPECT_EQ(outcome(noisy[t], overrides[k].first, overrides[k].second), expected[k]) << "override " << k;
    }
  }
}

// The trainer's correction re-plans the same profile for a lower budget: the plan a fresh make_plan gives
// for that budget, and the feasible minimum of the first plan (the floor does not depend on the budget)
// without the floor's whole descents.
TEST_F(PlannerRules, ReplanKeepsTheMinimumAndGivesTheSamePlan) {
  memory::PlanOptions o;
  o.budget_bytes = lo + (hi - lo) * 3 / 4;
  const memory::Plan first = runtime.plan(o);
  ASSERT_EQ(first.minimum_peak_bytes, lo);
  for (const int64_t budget : {lo + (hi - lo) / 2, lo + (hi - lo) / 10, lo}) {
    SCOPED_TRACE("budget " + memory::format_bytes(budget));
    const memory::Plan replanned = runtime.replan(budget);
    o.budget_bytes = budget;
    const memory::Plan fresh = memory::make_plan(profile, o);
    EXPECT_EQ(replanned.minimum_peak_bytes, lo);
    ASSERT_EQ(replanned.groups.size(), fresh.groups.size());
    for (size_t i = 0; i < fresh.groups.size(); ++i) EXPECT_EQ(replanned.groups[i].decision, fresh.groups[i].decision);
    EXPECT_EQ(replanned.prediction.peak_bytes, fresh.prediction.peak_bytes);
    EXPECT_LE(replanned.prediction.peak_bytes, budget);
  }
  EXPECT_NE(error_of([&] { runtime.replan(lo - 1); }).find("below the feasible minimum " + memory::format_bytes(lo)),
            std::string::npos);
}

TEST_F(PlannerRules, OverrideMayOnlyLowerWhatIsKept) {
  memory::PlanOptions o;
  o.budget_bytes = (lo + hi) / 2;
  const memory::Plan initial = memory::make_plan(profile, o);
  const int64_t figure = initial.initial_kept_groups, figure_bytes = initial.initial_kept_bytes;
  ASSERT_GT(figure, 2);
  ASSERT_GT(figure_bytes, 0);

  o.keep_groups = figure + 1;
  const std::string msg = error_of([&] { memory::make_plan(profile, o); });
  EXPECT_NE(msg.find("initial figure of " + std::to_string(figure)), std::string::npos) << msg;
  o.keep_groups = static_cast<int64_t>(initial.groups.size()) + 1;
  EXPECT_NE(error_of([&] { memory::make_plan(profile, o); }).find("save " + std::to_string(initial.groups.size()) + " groups"),
            std::string::npos);

  o.keep_groups = figure - 2;
  const memory::Plan lower = memory::make_plan(profile, o);
  EXPECT_LE(lower.kept_groups, figure - 2);
  EXPECT_EQ(lower.initial_kept_groups, figure);
  EXPECT_TRUE(lower.fits);

  o.keep_groups.reset();
  o.keep_bytes = figure_bytes + 1;
  EXPECT_NE(error_of([&] { memory::make_plan(profile, o); }).find("initial figure"), std::string::npos);
  o.keep_bytes = figure_bytes / 2;
  const memory::Plan by_bytes = memory::make_plan(profile, o);
  EXPECT_LE(by_bytes.kept_bytes, figure_bytes / 2);

  // The lowered plan still trains with identical gradients.
  const train::StepStats plain = plain_runtime.measure_step(*model, batch, kStep);
  runtime.use_plan(by_bytes);
  expect_same_gradients(runtime.measure_step(*model, batch, kStep), plain);
}

TEST_F(PlannerRules, EveryStrategyGivesAValidPlanOrAClearError) {
  const train::StepStats plain = plain_runtime.measure_step(*model, batch, kStep);
  for (auto s : {memory::Strategy::Knapsack, memory::Strategy::Ordered, memory::Strategy::OrderedSets,
                 memory::Strategy::Uniform, memory::Strategy::Sqrt}) {
    SCOPED_TRACE(memory::to_string(s));
    memory::PlanOptions o;
    o.strategy = s;
    o.budget_bytes = hi;  // every strategy can meet the unconstrained peak
    memory::Plan plan;
    ASSERT_NO_THROW(plan = memory::make_plan(profile, o));
    EXPECT_LE(plan.prediction.peak_bytes, o.budget_bytes);
    runtime.use_plan(plan);
    const train::StepStats m = runtime.measure_step(*model, batch, kStep);
    EXPECT_LE(m.peak_above_baseline(),
              static_cast<int64_t>(1.05 * static_cast<double>(plan.prediction.peak_bytes - profile.baseline_bytes)));
    expect_same_gradients(m, plain);
    if (s == memory::Strategy::Uniform) EXPECT_GT(plan.dropped_groups, 0) << "per-block checkpointing drops inside blocks";
  }
}

TEST_F(PlannerRules, OptimalChainRefusesANonChainNamingWhy) {
  memory::PlanOptions o;
  o.strategy = memory::parse_strategy("optimal-chain");
  EXPECT_EQ(o.strategy, memory::Strategy::OptimalChain);
  o.budget_bytes = hi;
  const std::string msg = error_of([&] { memory::make_plan(profile, o); });
  EXPECT_NE(msg.find("needs a chain-shaped model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not of the node just before it"), std::string::npos) << msg;
  EXPECT_FALSE(memory::why_not_chain(profile).empty());
}

// A chain (MLP of equal layers): optimal-chain re-runs exactly the binomial optimum for the slots its plan
// uses, executes as predicted (re-runs, peak within 5%, peak within budget) with bitwise-equal gradients,
// and knapsack stays within 10% of it from sqrt(n) slots up. At a budget where a keep/recompute plan
// re-runs fewer nodes than every schedule that fits (a byte budget, not whole slots), that plan is taken.
TEST(ChainPlanner, OptimalChainIsTheBinomialOptimumKnapsackWithinTenPercent) {
  const int64_t layers = 8, width = 128, batch_size = 512;
  Config cfg = Config::from_string("[model]\ntype='mlp'\ndropout=0.0\nhidden=[128,128,128,128,128,128,128,128]\n",
                                   "chain.toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  at::manual_seed(5);
  data::Batch batch;
  batch.input = Value(at::randn({batch_size, 1, 28, 28}));
  batch.target = Value(at::randint(0, 10, {batch_size}, at::kLong));
  batch.items = batch_size;
  train::StepRuntime runtime, plain_runtime;
  const memory::StepProfile& profile = runtime.profile(*model, batch, 11);
  ASSERT_EQ(memory::why_not_chain(profile), "");
  const train::StepStats plain = plain_runtime.measure_step(*model, batch, kStep);
  const int64_t base = profile.baseline_bytes;
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const memory::Plan loose = memory::make_plan(profile, probe);
  const int64_t slot = batch_size * width * 4;

  int checked = 0, within = 0, knapsack_taken = 0;
  for (int64_t s : {7, 6, 5, 4, 3, 2, 1}) {
    memory::PlanOptions o;
    o.budget_bytes = loose.fixed_bytes + s * slot + slot / 2;
    if (o.budget_bytes < loose.minimum_peak_bytes) continue;
    o.strategy = memory::Strategy::OptimalChain;
    const memory::Plan chain = memory::make_plan(profile, o);
    SCOPED_TRACE("slots " + std::to_string(s) + ": " + chain.to_table());
    // The schedule's slots: activation states resident at once (the peak also holds a step's working
    // values, so they are read from the plan, not from the peak).
    const int64_t slots = chain.chain_slots;
    if (slots == 0) {  // a keep/recompute plan re-runs fewer than every schedule that fits (byte budgets, below)
      const std::vector<memory::ChainCandidate> schedules = memory::chain_candidates(profile, loose.groups, 0);
      const memory::ChainCandidate* binomial = memory::best_chain_fit(schedules, o.budget_bytes);
      if (binomial != nullptr) EXPECT_LT(chain.prediction.recomputed_nodes, binomial->prediction.recomputed_nodes);
      runtime.use_plan(chain);
      const train::StepStats m = runtime.measure_step(*model, batch, kStep);
      EXPECT_EQ(m.recomputed_nodes, chain.prediction.recomputed_nodes) << "executor re-ran other nodes";
      EXPECT_LE(m.peak_above_baseline(), o.budget_bytes - base) << "measured peak over budget";
      expect_same_gradients(m, plain);
      ++knapsack_taken;
      continue;
    }
    const int64_t steps = chain.prediction.recomputed_nodes / 2;  // linear + relu per layer step
    // The 8 layer states and the head are Revolve's chain of 9 steps.
    EXPECT_EQ(steps, memory::revolve_min_recomputes(layers + 1, slots)) << "slots used " << slots;
    ++checked;
    EXPECT_GT(steps, 0);
    EXPECT_FALSE(chain.store_from.empty());

    runtime.use_plan(chain);
    const train::StepStats m = runtime.measure_step(*model, batch, kStep);
    EXPECT_EQ(m.recomputed_nodes, chain.prediction.recomputed_nodes) << "executor re-ran other nodes";
    EXPECT_LE(m.peak_above_baseline(), o.budget_bytes - base) << "measured peak over budget";
    const int64_t predicted = chain.prediction.peak_bytes - base;
    EXPECT_LE(std::abs(static_cast<double>(predicted - m.peak_above_baseline())),
              0.05 * static_cast<double>(m.peak_above_baseline()))
        << "predicted " << predicted << " measured " << m.peak_above_baseline();
    expect_same_gradients(m, plain);

    o.strategy = memory::Strategy::Knapsack;
    const memory::Plan knapsack = memory::make_plan(profile, o);
    if (slots * slots >= layers) {
      EXPECT_LE(static_cast<double>(knapsack.prediction.recomputed_nodes / 2), 1.10 * static_cast<double>(steps));
      ++within;
    }
    runtime.use_plan(knapsack);
    const train::StepStats k = runtime.measure_step(*model, batch, kStep);
    EXPECT_LE(k.peak_above_baseline(), o.budget_bytes - base);
    expect_same_gradients(k, plain);
  }
  EXPECT_GE(checked, 4);
  EXPECT_GE(checked + knapsack_taken, 5);
  EXPECT_GE(within, 3);
}

// A byte budget is not a whole number of slots: at some budgets the binomial schedule of m slots does not
// fit where a keep/recompute plan keeping m states does. optimal-chain takes the plan with the fewer re-runs
// of the two, so it never re-runs more than the knapsack nor than the best binomial schedule, and on this
// chain (16 layers of 256, batch 1024) it takes the knapsack's at one budget at least.
TEST(ChainPlanner, OptimalChainReRunsNoMoreThanKnapsackAtByteBudgets) {
  const int64_t layers = 16, width = 256, batch_size = 1024;
  std::string hidden = "[";
  for (int64_t l = 0; l < layers; ++l) hidden += (l ? ",256" : "256");
  Config cfg = Config::from_string("[model]\ntype='mlp'\ndropout=0.0\nhidden=" + hidden + "]\n", "chain.toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  at::manual_seed(5);
  data::Batch batch;
  batch.input = Value(at::randn({batch_size, 1, 28, 28}));
  batch.target = Value(at::randint(0, 10, {batch_size}, at::kLong));
  batch.items = batch_size;
  const memory::StepProfile profile = train::profile_step(*model, batch, 11);
  ASSERT_EQ(memory::why_not_chain(profile), "");
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const memory::Plan loose = memory::make_plan(profile, probe);
  const std::vector<memory::ChainCandidate> schedules = memory::chain_candidates(profile, loose.groups, 0);
  const int64_t slot = batch_size * width * 4;
  int checked = 0, greedy_taken = 0;
  for (int64_t s = layers - 1; s >= 1; --s) {
    memory::PlanOptions o;
    o.budget_bytes = loose.fixed_bytes + s * slot + slot / 2;
    if (o.budget_bytes < loose.minimum_peak_bytes) continue;
    o.strategy = memory::Strategy::OptimalChain;
    const memory::Plan chain = memory::make_plan(profile, o);
    o.strategy = memory::Strategy::Knapsack;
    const memory::Plan knapsack = memory::make_plan(profile, o);
    SCOPED_TRACE("budget " + memory::format_bytes(o.budget_bytes) + ": " + chain.to_table());
    EXPECT_LE(chain.prediction.peak_bytes, o.budget_bytes);
    EXPECT_LE(chain.prediction.recomputed_nodes, knapsack.prediction.recomputed_nodes);
    const memory::ChainCandidate* binomial = memory::best_chain_fit(schedules, o.budget_bytes);
    if (binomial != nullptr) EXPECT_LE(chain.prediction.recomputed_nodes, binomial->prediction.recomputed_nodes);
    if (binomial != nullptr && chain.prediction.recomputed_nodes < binomial->prediction.recomputed_nodes) {
      EXPECT_EQ(chain.chain_slots, 0) << "a plan with fewer re-runs than every schedule must be the knapsack's";
      ++greedy_taken;
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
  EXPECT_GE(greedy_taken, 1) << "no budget where a byte budget beat the slot count: the test shows nothing";
}

// A model family's profile and the loose plan's groups, and a whole-step simulation's peak for
// per-group decisions: the oracle of the incremental-peak tests below.
struct ProfiledGroups {
  memory::StepProfile profile;
  memory::Plan loose;  // the plan of an unbounded budget: every group kept, the minimum and unconstrained peaks
  std::vector<memory::Group> groups;
  int64_t simulated(const std::vector<memory::Decision>& d, int64_t extra) const {
    std::vector<memory::Decision> by_storage(profile.storages.size(), memory::Decision::Keep);
    for (size_t i = 0; i < groups.size(); ++i) by_storage[static_cast<size_t>(groups[i].storage)] = d[i];
    return memory::simulate(profile, by_storage, extra).peak_bytes;
  }
};

ProfiledGroups profiled_groups(const Case& c) {
  Config cfg = Config::from_string(c.toml, c.name + ".toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  ProfiledGroups out;
  out.profile = train::profile_step(*model, batch_for(c.name), 11);
  memory::PlanOptions o;
  o.budget_bytes = int64_t{1} << 40;
  out.loose = memory::make_plan(out.profile, o);
  out.groups = out.loose.groups;
  return out;
}

// The incremental peak (used by the descents) equals a whole-step simulation after every change and for
// every change it is asked about, on each model family, through random walks of keep/recompute flips.
TEST(Planner, IncrementalPeakEqualsTheSimulator) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const ProfiledGroups pg = profiled_groups(c);
    const memory::StepProfile& profile = pg.profile;
    const std::vector<memory::Group>& groups = pg.groups;
    ASSERT_GT(groups.size(), 4u);
    const int64_t extra = 12345;
    auto simulated = [&](const std::vector<memory::Decision>& d) { return pg.simulated(d, extra); };
    std::mt19937 rng(17);
    for (int walk = 0; walk < 3; ++walk) {
      // Walks start all kept, half recomputed, all recomputed.
      std::vector<memory::Decision> d(groups.size(), memory::Decision::Keep);
      for (size_t i = 0; i < d.size(); ++i)
        if (walk == 2 || (walk == 1 && rng() % 2)) d[i] = memory::Decision::Recompute;
      memory::IncrementalPeak inc(profile, groups, extra, d);
      ASSERT_EQ(inc.peak(), simulated(d)) << "walk " << walk << " at start";
      for (int step = 0; step < 120; ++step) {
        const size_t g = rng() % groups.size();
        const memory::Decision to = d[g] == memory::Decision::Keep ? memory::Decision::Recompute : memory::Decision::Keep;
        std::vector<memory::Decision> next = d;
        next[g] = to;
        const int64_t expected = simulated(next);
        // Stopped early (peak_if's stop_at): exact below the threshold, a bound in [threshold, peak] at it.
        ASSERT_EQ(inc.peak_if(g, to, expected + 1), expected) << "walk " << walk << " step " << step;
        const int64_t cut = expected - 4096;
        const int64_t bound = inc.peak_if(g, to, cut);
        ASSERT_GE(bound, cut) << "walk " << walk << " step " << step;
        ASSERT_LE(bound, expected) << "walk " << walk << " step " << step;
        ASSERT_EQ(inc.peak_if(g, to), expected) << "walk " << walk << " step " << step << " group " << g;
        // As a descent asks (stop at the committed peak): exact where the change lowers it.
        const int64_t now = inc.peak();
        const int64_t asked = inc.peak_if(g, to, now);
        if (expected < now) {
          ASSERT_EQ(asked, expected) << "walk " << walk << " step " << step << " group " << g;
        } else {
          ASSERT_GE(asked, now) << "walk " << walk << " step " << step;
          ASSERT_LE(asked, expected) << "walk " << walk << " step " << step;
        }
        if (rng() % 3 == 0) continue;  // asked about, not taken
        inc.set(g, to);
        d = next;
        ASSERT_EQ(inc.peak(), expected) << "walk " << walk << " step " << step;
      }
    }
  }
}

// Along a knapsack-like descent on a deeper model (cheapest recompute per byte first, passes until one
// releases nothing: the order that drops the same cheap value layer after layer, building re-run
// cascades and moving them step by step to earlier steps), the incremental peak equals a whole-step
// simulation for every release it accepts and stays at or above the committed peak for every one it
// refuses; then, keeping groups back most expensive first under a budget, for every keep it is asked.
TEST(Planner, IncrementalPeakFollowsADescentOnADeepModel) {
  const ProfiledGroups pg = profiled_groups(deep_gpt());
  const std::vector<memory::Group>& groups = pg.groups;
  ASSERT_GT(groups.size(), 100u);
  const int64_t extra = 4321;
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto per_byte = [&](size_t i) { return groups[i].recompute_ms / static_cast<double>(std::max<int64_t>(groups[i].bytes, 1)); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return per_byte(a) < per_byte(b); });
  std::vector<memory::Decision> d(groups.size(), memory::Decision::Keep);
  memory::IncrementalPeak inc(pg.profile, groups, extra, d);
  int64_t peak = inc.peak();
  ASSERT_EQ(peak, pg.simulated(d, extra));
  const int64_t unconstrained = peak;
  size_t released = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i : order) {
      if (d[i] != memory::Decision::Keep) continue;
      std::vector<memory::Decision> next = d;
      next[i] = memory::Decision::Recompute;
      const int64_t expected = pg.simulated(next, extra);
      const int64_t asked = inc.peak_if(i, memory::Decision::Recompute, peak);
      if (expected < peak) {
        ASSERT_EQ(asked, expected) << "release " << released << " group " << i;
        inc.set(i, memory::Decision::Recompute);
        d = std::move(next);
        peak = expected;
        ASSERT_EQ(inc.peak(), peak) << "after release " << released;
        ++released;
        progress = true;
      } else {
        ASSERT_GE(asked, peak) << "group " << i;
        ASSERT_LE(asked, expected) << "group " << i;
      }
    }
  }
  EXPECT_GT(released, groups.size() / 2);
  EXPECT_LT(peak, unconstrained);
  const int64_t budget = peak + (unconstrained - peak) / 4;
  size_t kept = 0;
  for (size_t r = order.size(); r-- > 0;) {
    const size_t i = order[r];
    if (d[i] == memory::Decision::Keep) continue;
    std::vector<memory::Decision> next = d;
    next[i] = memory::Decision::Keep;
    const int64_t expected = pg.simulated(next, extra);
    ASSERT_EQ(inc.peak_if(i, memory::Decision::Keep), expected) << "keep group " << i;
    if (expected > budget) continue;
    inc.set(i, memory::Decision::Keep);
    d = std::move(next);
    ASSERT_EQ(inc.peak(), expected) << "after keeping group " << i;
    ++kept;
  }
  EXPECT_GT(kept, 0u);
}

// The knapsack's fall-back (a descent to the budget in the first memory order that reaches it) read from
// the floor's own descents to 0 takes the same decisions as descending again, at budgets from the floor
// up, with and without an offload tier.
TEST(Planner, MemoryOrderedFallBackReadFromTheFloorsDescents) {
  const ProfiledGroups pg = profiled_groups(deep_gpt());
  memory::PlanOptions loose;
  loose.budget_bytes = int64_t{1} << 40;
  const memory::Plan p = memory::make_plan(pg.profile, loose);
  ASSERT_LT(p.minimum_peak_bytes, p.unconstrained_peak_bytes);
  size_t reached = 0;
  for (const bool offload : {false, true}) {
    for (const double f : {0.0, 0.02, 0.1, 0.3, 0.6}) {
      memory::PlanOptions o;
      o.budget_bytes = p.minimum_peak_bytes + static_cast<int64_t>(f * static_cast<double>(p.unconstrained_peak_bytes - p.minimum_peak_bytes));
      if (offload) o.offload = slow_offload();
      SCOPED_TRACE(std::string(offload ? "offload " : "") + std::to_string(f));
      const memory::PlanContext descending(pg.profile, o);
      const std::optional<memory::Choice> again = descending.reach_budget_by_memory_order();
      memory::PlanContext reading(pg.profile, o);
      reading.minimum_peak();  // records the floor's descents
      const std::optional<memory::Choice> read = reading.reach_budget_by_memory_order();
      ASSERT_EQ(again.has_value(), read.has_value());
      if (!again) continue;
      EXPECT_EQ(again->decisions, read->decisions);
      EXPECT_LE(reading.predict(read->decisions).peak_bytes, o.budget_bytes);
      ++reached;
    }
  }
  EXPECT_GT(reached, 5u);
}

// A re-plan (report_minimum off) decides whether the budget is above the floor from descents that stop at
// the budget instead of the floor's whole descents: the same plans at every budget, with and without
// offload, and the same "below the feasible minimum" error below the floor.
TEST(Planner, ReplanWithoutTheMinimumGivesTheSamePlans) {
  const ProfiledGroups pg = profiled_groups(deep_gpt());
  size_t compared = 0, refused = 0;
  for (const bool offload : {false, true}) {
    memory::PlanOptions loose;
    loose.budget_bytes = int64_t{1} << 40;
    if (offload) loose.offload = slow_offload();
    const memory::Plan p = memory::make_plan(pg.profile, loose);  // the floor with these options
    ASSERT_LT(p.minimum_peak_bytes, p.unconstrained_peak_bytes);
    for (const double f : {-0.05, -0.001, 0.0, 0.02, 0.1, 0.3, 0.6, 1.0}) {
      memory::PlanOptions o = loose;
      o.budget_bytes = p.minimum_peak_bytes + static_cast<int64_t>(f * static_cast<double>(p.unconstrained_peak_bytes - p.minimum_peak_bytes));
      SCOPED_TRACE(std::string(offload ? "offload " : "") + std::to_string(f));
      memory::PlanOptions replan = o;
      replan.report_minimum = false;
      if (o.budget_bytes < p.minimum_peak_bytes) {
        const std::string reported = error_of([&] { memory::make_plan(pg.profile, o); });
        const std::string replanned = error_of([&] { memory::make_plan(pg.profile, replan); });
        EXPECT_NE(reported.find("below the feasible minimum"), std::string::npos) << reported << " // " << replanned;
        EXPECT_EQ(reported, replanned);
        ++refused;
        continue;
      }
      const memory::Plan a = memory::make_plan(pg.profile, o);
      const memory::Plan b = memory::make_plan(pg.profile, replan);
      EXPECT_EQ(b.minimum_peak_bytes, 0);
      ASSERT_EQ(a.groups.size(), b.groups.size());
      for (size_t i = 0; i < a.groups.size(); ++i) EXPECT_EQ(a.groups[i].decision, b.groups[i].decision) << "group " << i;
      EXPECT_EQ(a.prediction.peak_bytes, b.prediction.peak_bytes);
      EXPECT_EQ(a.prediction.recomputed_nodes, b.prediction.recomputed_nodes);
      EXPECT_LE(b.prediction.peak_bytes, o.budget_bytes);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 12u);
  EXPECT_EQ(refused, 4u);
}

// Copies of an incremental peak (every descent starts from a copy of the all-kept one) and peaks built
// `like` another share the static data only: changes to one leave the others' peaks as they were, and each
// still equals the simulator.
TEST(Planner, IncrementalPeakCopiesShareOnlyStaticData) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const ProfiledGroups pg = profiled_groups(c);
    const memory::StepProfile& profile = pg.profile;
    const std::vector<memory::Group>& groups = pg.groups;
    ASSERT_GT(groups.size(), 4u);
    const int64_t extra = 777;
    auto simulated = [&](const std::vector<memory::Decision>& d) { return pg.simulated(d, extra); };
    const std::vector<memory::Decision> kept(groups.size(), memory::Decision::Keep);
    const memory::IncrementalPeak base(profile, groups, extra, kept);
    const int64_t base_peak = simulated(kept);
    ASSERT_EQ(base.peak(), base_peak);
    std::mt19937 rng(5);
    // `steps` random flips made on `inc` (decisions `dd`), each checked against the simulator, while
    // `other` keeps its peak `other_peak`.
    auto walk = [&](memory::IncrementalPeak& inc, std::vector<memory::Decision>& dd, int steps,
                    const memory::IncrementalPeak& other, int64_t other_peak, const char* what) {
      for (int step = 0; step < steps; ++step) {
        const size_t g = rng() % groups.size();
        dd[g] = dd[g] == memory::Decision::Keep ? memory::Decision::Recompute : memory::Decision::Keep;
        inc.set(g, dd[g]);
        ASSERT_EQ(inc.peak(), simulated(dd)) << what << ", step " << step;
        ASSERT_EQ(other.peak(), other_peak) << what << ", step " << step;
      }
    };
    memory::IncrementalPeak copy = base;
    std::vector<memory::Decision> d = kept;
    walk(copy, d, 60, base, base_peak, "copy");
    if (HasFatalFailure()) return;
    const int64_t copy_peak = simulated(d);
    // A copy made after many changes (its lists packed tight again) goes on as the original does.
    memory::IncrementalPeak again = copy;
    std::vector<memory::Decision> a = d;
    walk(again, a, 30, copy, copy_peak, "copy of a copy");
    if (HasFatalFailure()) return;
    // Built like `base` for other decisions: the same as built from scratch, and independent of `copy`.
    memory::IncrementalPeak like(base, d);
    const memory::IncrementalPeak fresh(profile, groups, extra, d);
    ASSERT_EQ(like.peak(), fresh.peak());
    ASSERT_EQ(like.peak(), simulated(d));
    std::vector<memory::Decision> e = d;
    walk(like, e, 30, copy, copy_peak, "like");
    if (HasFatalFailure()) return;
  }
}

// The planner reads a profile once into a flat graph (plan/graph.h); every list and figure in it is the
// profile's own, read the way the profile reads it (storage_of, the value and last-alive maps).
TEST(Planner, GraphReadsTheProfileAsItIs) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const ProfiledGroups pg = profiled_groups(c);
    const memory::StepProfile& p = pg.profile;
    const memory::PlanGraph g(p);
    ASSERT_EQ(g.nodes, p.nodes.size());
    ASSERT_EQ(g.storages, p.storages.size());
    ASSERT_EQ(g.steps, p.backward_order.size());
    ASSERT_TRUE(std::is_sorted(g.leaves.begin(), g.leaves.end()));
    size_t saved_leaves = 0;
    for (size_t o = 0; o < p.nodes.size(); ++o) {
      const memory::ProfiledNode& n = p.nodes[o];
      ASSERT_EQ(g.saved[o].size(), n.saved.size());
      for (size_t i = 0; i < n.saved.size(); ++i) {
        const int v = g.saved[o][i];
        ASSERT_EQ(v, g.value(n.saved[i])) << "node " << o;
        ASSERT_GE(v, 0) << "node " << o;
        ASSERT_EQ(g.storage[static_cast<size_t>(v)], p.storage_of(n.saved[i])) << "node " << o;
        ASSERT_EQ(g.is_leaf(v), n.saved[i].is_leaf()) << "node " << o;
        if (!g.is_leaf(v)) {
          ASSERT_EQ(g.producer(v), n.saved[i].producer) << "node " << o;
          ASSERT_EQ(g.output(v), n.saved[i].output) << "node " << o;
        } else {
          ++saved_leaves;
        }
      }
      ASSERT_EQ(g.inputs[o].size(), n.inputs.size());
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        ASSERT_EQ(g.inputs[o][i].producer, n.inputs[i].producer) << "node " << o;
        ASSERT_EQ(g.inputs[o][i].output, n.inputs[i].output) << "node " << o;
        ASSERT_EQ(g.inputs[o][i].value, g.value(n.inputs[i])) << "node " << o;
      }
      ASSERT_EQ(std::vector<int64_t>(g.allocated[o].begin(), g.allocated[o].end()), n.allocated_storage) << "node " << o;
      ASSERT_EQ(g.first_output(o + 1) - g.first_output(o), n.output_storage.size()) << "node " << o;
      for (size_t j = 0; j < n.output_storage.size(); ++j) {
        const auto v = static_cast<int>(g.first_output(o) + j);
        ASSERT_EQ(g.storage[static_cast<size_t>(v)], n.output_storage[j]);
        ASSERT_EQ(g.producer(v), static_cast<int>(o));
        ASSERT_EQ(g.output(v), static_cast<int>(j));
        const memory::ValueKey key{static_cast<int64_t>(o), static_cast<int>(j)};
        const auto rec = p.value_storage.find(key);
        ASSERT_EQ(g.recorded_storage[g.slots.first(o) + j], rec == p.value_storage.end() ? -1 : rec->second);
      }
      ASSERT_EQ(g.peak_bytes[o], n.peak_bytes);
      ASSERT_EQ(g.end_bytes[o], n.end_bytes);
      ASSERT_EQ(g.forward_ms[o], n.forward_ms);
      ASSERT_EQ(g.backward_ms[o], n.backward_ms);
    }
    ASSERT_GT(saved_leaves, 0u);  // parameters are saved: the leaf numbering is exercised
    // Per storage: the latest last-alive ordinal of the node outputs on it (held past forward: nodes).
    std::vector<int64_t> last(p.storages.size(), -1);
    for (const auto& [key, s] : p.value_storage) {
      if (key.is_leaf() || s < 0) continue;
      const auto it = p.value_last_alive.find(key);
      last[static_cast<size_t>(s)] = std::max(last[static_cast<size_t>(s)],
                                              it == p.value_last_alive.end() ? static_cast<int64_t>(p.nodes.size()) : it->second);
    }
    ASSERT_EQ(g.last_alive, last);
    ASSERT_EQ(g.value(memory::ValueKey{static_cast<int64_t>(p.nodes.size()) + 5, 0}), -1);
    ASSERT_EQ(g.value(memory::ValueKey{0, 1000}), -1);
  }
}

// The preset-order strategies' oracle: groups [0, k) recomputed, the rest kept, with k the first count from
// `from` up whose whole-step simulation fits `budget`; empty when none does.
std::vector<memory::Decision> first_fitting_prefix(const memory::StepProfile& profile,
                                                   const std::vector<memory::Group>& groups, int64_t budget,
                                                   size_t from) {
  const size_t n = groups.size();
  for (size_t k = from; k <= n; ++k) {
    std::vector<memory::Decision> by_storage(profile.storages.size(), memory::Decision::Keep);
    std::vector<memory::Decision> d(n, memory::Decision::Keep);
    for (size_t i = 0; i < k; ++i) {
      d[i] = memory::Decision::Recompute;
      by_storage[static_cast<size_t>(groups[i].storage)] = memory::Decision::Recompute;
    }
    if (memory::simulate(profile, by_storage, 0).peak_bytes <= budget) return d;
  }
  return {};
}

// The two preset-order strategies at budgets from the floor to the unconstrained peak: `ordered` recomputes
// the shortest forward-order prefix whose simulated peak fits; `ordered-count` first recomputes the
// n − G groups that the count rule leaves out (G = capacity / largest group: groups counted as equal-sized)
// and goes on in forward order from there until the plan fits. Where no prefix fits, each refuses the budget.
TEST(Planner, PresetOrderStrategiesDeleteInForwardOrderUntilTheRestFits) {
  int count_differs = 0;  // budgets where the count rule deleted another prefix than the search
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const ProfiledGroups profiled = profiled_groups(c);
    const memory::StepProfile& profile = profiled.profile;
    const memory::Plan& loose = profiled.loose;
    memory::PlanOptions o;
    const size_t n = loose.groups.size();
    int64_t unit = 0;
    for (const auto& g : loose.groups) unit = std::max(unit, g.bytes);
    ASSERT_GT(unit, 0);
    int planned = 0, partial = 0;
    for (double f : {0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0}) {
      const int64_t budget = loose.minimum_peak_bytes +
          static_cast<int64_t>(f * static_cast<double>(loose.unconstrained_peak_bytes - loose.minimum_peak_bytes));
      SCOPED_TRACE("f " + std::to_string(f) + ", budget " + memory::format_bytes(budget));
      const int64_t capacity = budget - loose.fixed_bytes;
      const size_t count_kept = static_cast<size_t>(std::clamp<int64_t>(capacity / unit, 0, static_cast<int64_t>(n)));
      const std::pair<const char*, size_t> rules[] = {{"ordered", 0}, {"ordered-count", n - count_kept}};
      std::vector<memory::Decision> chosen[2];
      for (int r = 0; r < 2; ++r) {
        SCOPED_TRACE(rules[r].first);
        o.strategy = memory::parse_strategy(rules[r].first);
        o.budget_bytes = budget;
        const std::vector<memory::Decision> expected = first_fitting_prefix(profile, loose.groups, budget, rules[r].second);
        if (expected.empty()) {
          EXPECT_NE(error_of([&] { memory::make_plan(profile, o); }).find("cannot meet the budget"), std::string::npos);
          continue;
        }
        const memory::Plan plan = memory::make_plan(profile, o);
        ++planned;
        ASSERT_EQ(plan.groups.size(), n);
        for (size_t i = 0; i < n; ++i) EXPECT_EQ(plan.groups[i].decision, expected[i]) << "group " << i;
        EXPECT_LE(plan.prediction.peak_bytes, budget);
        const auto dropped = std::count(expected.begin(), expected.end(), memory::Decision::Recompute);
        EXPECT_EQ(plan.dropped_groups, dropped);
        if (dropped > 0 && static_cast<size_t>(dropped) < n) ++partial;
        chosen[r] = expected;
      }
      if (!chosen[0].empty() && !chosen[1].empty() && chosen[0] != chosen[1]) ++count_differs;
    }
    EXPECT_GT(planned, 4);
    EXPECT_GT(partial, 0) << "no budget between the floor and the unconstrained peak deleted only some groups";
  }
  EXPECT_GT(count_differs, 0) << "the count rule chose the same prefix as the search at every budget of every model";
}

// Ordered sets prices each kept count incrementally; the oracle is the rule itself with a whole-step
// simulation per kept count G (largest G first; shares of G by node-set size, largest remainders).
TEST(Planner, OrderedSetsEqualsTheWholeStepSearch) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const ProfiledGroups profiled = profiled_groups(c);
    const memory::StepProfile& profile = profiled.profile;
    const memory::Plan& loose = profiled.loose;
    memory::PlanOptions o;
    const std::vector<memory::Group>& groups = loose.groups;
    const size_t n = groups.size();
    std::vector<std::string> names;
    std::vector<std::vector<size_t>> sets;
    for (size_t i = 0; i < n; ++i) {
      const auto it = std::find(names.begin(), names.end(), groups[i].node_set);
      if (it == names.end()) {
        names.push_back(groups[i].node_set);
        sets.push_back({i});
      } else {
        sets[static_cast<size_t>(it - names.begin())].push_back(i);
      }
    }
    auto simulated = [&](const std::vector<memory::Decision>& d) {
      std::vector<memory::Decision> by_storage(profile.storages.size(), memory::Decision::Keep);
      for (size_t i = 0; i < n; ++i) by_storage[static_cast<size_t>(groups[i].storage)] = d[i];
      return memory::simulate(profile, by_storage, 0).peak_bytes;
    };
    int planned = 0;
    for (double f : {0.2, 0.5, 0.8}) {
      o.strategy = memory::Strategy::OrderedSets;
      o.budget_bytes = loose.minimum_peak_bytes +
                       static_cast<int64_t>(f * static_cast<double>(loose.unconstrained_peak_bytes - loose.minimum_peak_bytes));
      std::vector<memory::Decision> expected;
      for (int64_t target = static_cast<int64_t>(n); target >= 0 && expected.empty(); --target) {
        std::vector<int64_t> per(sets.size());
        std::vector<std::pair<double, size_t>> rem;
        int64_t assigned = 0;
        for (size_t k = 0; k < sets.size(); ++k) {
          const double exact = static_cast<double>(target) * static_cast<double>(sets[k].size()) / static_cast<double>(n);
          per[k] = static_cast<int64_t>(std::floor(exact));
          assigned += per[k];
          rem.emplace_back(exact - std::floor(exact), k);
        }
        std::stable_sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
        for (size_t r = 0; assigned < target && r < rem.size(); ++r, ++assigned) per[rem[r].second] += 1;
        std::vector<memory::Decision> d(n, memory::Decision::Keep);
        for (size_t k = 0; k < sets.size(); ++k)
          for (size_t m = 0; m < sets[k].size(); ++m)
            if (static_cast<int64_t>(m) < static_cast<int64_t>(sets[k].size()) - per[k]) d[sets[k][m]] = memory::Decision::Recompute;
        if (simulated(d) <= o.budget_bytes) expected = d;
      }
      memory::Plan plan;
      try {
        plan = memory::make_plan(profile, o);
      } catch (const Error&) {
        EXPECT_TRUE(expected.empty()) << "f " << f << ": the whole-step search found a plan that fits";
        continue;
      }
      ASSERT_FALSE(expected.empty()) << "f " << f;
      ++planned;
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(plan.groups[i].decision, expected[i]) << "f " << f << " group " << i;
      EXPECT_EQ(plan.prediction.peak_bytes, simulated(expected)) << "f " << f;
    }
    EXPECT_GT(planned, 0);
  }
}

TEST(Planner, NodeSetsAndRevolve) {
  EXPECT_EQ(memory::node_set_of("blocks.3.attn.qkv"), "blocks.3");
  EXPECT_EQ(memory::node_set_of("conv1"), "conv1");
  EXPECT_EQ(memory::node_set_of("lstm.cell"), "lstm");
  EXPECT_EQ(memory::node_set_of(""), "(top)");
  EXPECT_EQ(memory::revolve_min_recomputes(10, 9), 0);
  EXPECT_EQ(memory::revolve_min_recomputes(10, 1), 36);  // (n-1)(n-2)/2 with one checkpoint
  EXPECT_EQ(memory::revolve_min_recomputes(10, 2), 11);
  EXPECT_THROW(memory::parse_strategy("greedy"), Error);
}

}  // namespace
}  // namespace ration
