// The offload-aware incremental peak (plan/offload_peak.h): plans with an offload tier are the same plans
// whether the knapsack's descents price their tries by it or by a whole-step simulation each
// (PlanOptions::offload_peak off, the planner before it) — every decision, copy deadline and prefetch
// distance, and every predicted figure — over gpt at several depths, cnn, lstm_lm and mlp, at budgets from
// the floor up, with tiers fast enough for every copy to hide, slow enough for many not to, with little room,
// and with copy-ins into the engine's pool. And the model itself: where it calls its answer exact it is the simulator's, elsewhere a lower
// bound of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "batch_util.h"

#include "ration/base/check.h"
#include "ration/plan/graph.h"
#include "ration/plan/incremental.h"
#include "ration/plan/offload_peak.h"
#include "ration/plan/planner.h"
#include "ration/plan/simulator.h"
#include "ration/models/model.h"
#include "ration/runtime/step_runtime.h"

namespace ration {
namespace {

struct Model {
  std::string name, toml;
  bool images = false;
};

const std::vector<Model>& models_planned() {
  static const std::vector<Model> m = {
      {"gpt2", "[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=32\nblock_size=32\ndropout=0.1\n"},
      {"gpt6", "[model]\ntype='gpt'\nn_layer=6\nn_head=2\nn_embd=16\nblock_size=32\ndropout=0.1\n"},
      {"gpt16", "[model]\ntype='gpt'\nn_layer=16\nn_head=2\nn_embd=16\nblock_size=32\ndropout=0.1\n"},
      {"cnn", "[model]\ntype='cnn'\nchannels=[8,16]\nfc_hidden=32\ndropout=0.25\n", true},
      {"lstm_lm", "[model]\ntype='lstm_lm'\nn_embd=16\nhidden_size=32\nn_layer=2\ndropout=0.1\n"},
      {"mlp", "[model]\ntype='mlp'\ndropout=0.1\nhidden=[256,256,128,128,64]\n", true},
  };
  return m;
}

data::Batch batch_for(const Model& m) { return testing::random_batch(m.images, m.images ? 64 : 8, 32, 5); }

memory::StepProfile profile_of(const Model& m) {
  Config cfg = Config::from_string(m.toml, m.name + ".toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  return train::profile_step(*model, batch_for(m), 11);
}

struct Tier {
  std::string name;
  memory::OffloadCosts costs;
};

// Bandwidths in bytes per ms: every copy hides (2e7), many do not (2e5, 3e4, so prefetches run many nodes
// ahead and copies queue behind each other), a tier with room for a few copies only, and copy-ins into the
// engine's pool.
std::vector<Tier> tiers() {
  auto tier = [](double bandwidth, int64_t min_bytes) {
    memory::OffloadCosts c;
    c.write_bytes_per_ms = c.read_bytes_per_ms = bandwidth;
    c.per_copy_ms = 0.01;
    c.min_bytes = min_bytes;
    c.min_prefetch = 2;
    return c;
  };
  std::vector<Tier> t = {{"fast", tier(2e7, 0)}, {"slow", tier(2e5, 4096)}, {"slower", tier(3e4, 0)}};
  memory::OffloadCosts small = tier(2e5, 0);
  small.capacity_bytes = 64 * 1024;
  t.push_back({"small", small});
  memory::OffloadCosts pooled = tier(2e5, 0);
  pooled.copy_in = memory::CopyInMemory::Pooled;
  t.push_back({"pooled", pooled});
  return t;
}

// The plan, or the error's text.
struct Outcome {
  memory::Plan plan;
  std::string error;
};
Outcome plan_or_error(const memory::StepProfile& profile, const memory::PlanOptions& o) {
  Outcome out;
  try {
    out.plan = memory::make_plan(profile, o);
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

// Each model's measured profile, and two with its forward times scaled by seeded random factors (other
// knapsack orders, other copy timelines).
std::vector<memory::StepProfile> profiles_of(const Model& m) {
  std::vector<memory::StepProfile> profiles(3, profile_of(m));
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> factor(0.3, 3.0);
  for (size_t v = 1; v < profiles.size(); ++v)
    for (auto& n : profiles[v].nodes) n.forward_ms *= factor(rng);
  return profiles;
}

// What the comparison covered.
struct Covered {
  size_t compared = 0, with_offloads = 0, with_queued = 0, refused = 0;
};

// One profile and tier: the plans at budgets from below the floor to the unconstrained peak, reported and
// re-planned, with and without the offload-aware peak.
void compare_at_budgets(const memory::StepProfile& profile, const Tier& tier, const std::string& name, Covered& c) {
  memory::PlanOptions loose;
  loose.budget_bytes = int64_t{1} << 40;
  loose.offload = tier.costs;
  const memory::Plan range = memory::make_plan(profile, loose);
  const int64_t lo = range.minimum_peak_bytes, hi = range.unconstrained_peak_bytes;
  for (const double f : {-0.01, 0.0, 0.03, 0.15, 0.4, 0.7, 1.0}) {
    for (const bool report_minimum : {true, false}) {
      memory::PlanOptions o = loose;
      o.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
      o.report_minimum = report_minimum;
      SCOPED_TRACE(name + ", tier " + tier.name + ", budget " + memory::format_bytes(o.budget_bytes) +
                   (report_minimum ? "" : ", re-plan"));
      memory::PlanOptions before = o;
      before.offload_peak = false;
      const Outcome now = plan_or_error(profile, o), then = plan_or_error(profile, before);
      ASSERT_EQ(now.error, then.error);
      if (!now.error.empty()) {
        ++c.refused;
        continue;
      }
      EXPECT_EQ(memory::plan_difference(now.plan, then.plan), "");
      ++c.compared;
      if (now.plan.offloaded_groups > 0) ++c.with_offloads;
      for (const memory::Group& g : now.plan.groups)
        if (g.decision == memory::Decision::Offload && g.prefetch > tier.costs.min_prefetch) {
          ++c.with_queued;  // a fetch that does not land within the shortest distance
          break;
        }
    }
  }
}

TEST(PlanOffloadPeak, SamePlansAsWholeStepSimulations) {
  Covered c;
  for (const Model& m : models_planned()) {
    const std::vector<memory::StepProfile> profiles = profiles_of(m);
    for (size_t v = 0; v < profiles.size(); ++v)
      for (const Tier& tier : tiers()) compare_at_budgets(profiles[v], tier, m.name + " times " + std::to_string(v), c);
  }
  // The comparison covers plans that offload, and plans whose copies queue behind each other.
  EXPECT_GT(c.compared, 900u);
  EXPECT_GT(c.with_offloads, 300u);
  EXPECT_GT(c.with_queued, 60u);
  EXPECT_GT(c.refused, 0u);
}

// The comparison sees every field: a plan differs from itself with one decision, deadline or prefetch
// distance changed, or one predicted figure.
TEST(PlanOffloadPeak, PlanDifferenceNamesEveryChange) {
  const memory::StepProfile profile = profile_of(models_planned()[1]);
  memory::PlanOptions o;
  o.budget_bytes = int64_t{1} << 40;
  o.offload = tiers()[1].costs;
  const memory::Plan loose = memory::make_plan(profile, o);
  o.budget_bytes = loose.minimum_peak_bytes + (loose.unconstrained_peak_bytes - loose.minimum_peak_bytes) / 5;
  const memory::Plan plan = memory::make_plan(profile, o);
  ASSERT_GT(plan.offloaded_groups, 0);
  EXPECT_EQ(memory::plan_difference(plan, plan), "");
  size_t offloaded = 0;
  while (plan.groups[offloaded].decision != memory::Decision::Offload) ++offloaded;
  std::vector<std::pair<std::string, std::function<void(memory::Plan&)>>> changes = {
      {"decision", [&](memory::Plan& p) { p.groups[0].decision = p.groups[0].kept() ? memory::Decision::Recompute : memory::Decision::Keep; }},
      {"deadline", [&](memory::Plan& p) { p.groups[offloaded].deadline += 1; }},
      {"prefetch", [&](memory::Plan& p) { p.groups[offloaded].prefetch += 1; }},
      {"predicted peak", [](memory::Plan& p) { p.prediction.peak_bytes += 1; }},
      {"backward peaks", [](memory::Plan& p) { p.prediction.backward_peaks.back() += 1; }},
      {"offload stall", [](memory::Plan& p) { p.prediction.offload_stall_ms += 1e-9; }},
      {"feasible minimum", [](memory::Plan& p) { p.minimum_peak_bytes += 1; }},
  };
  for (const auto& [what, change] : changes) {
    memory::Plan changed = plan;
    change(changed);
    EXPECT_NE(memory::plan_difference(plan, changed), "") << what;
  }
}

// The model against the simulator, over random sequences of releases (offloads and recomputes) from
// everything kept: where a price is exact it is the simulator's peak, else a lower bound of it (or the
// threshold is reached in both). An exact change is committed, after which every forward and backward figure
// is the simulator's; after any other the model is built again from the simulator's prediction and its
// fetches on demand, and is then the simulator's figure for figure too.
TEST(PlanOffloadPeak, ModelIsExactOrALowerBound) {
  std::mt19937 rng(17);
  std::map<std::string, size_t> exact, priced, rebuilt;  // by tier
  for (const Model& m : models_planned()) {
    const memory::StepProfile profile = profile_of(m);
    auto graph = std::make_shared<const memory::PlanGraph>(profile);
    memory::PlanOptions loose;
    loose.budget_bytes = int64_t{1} << 40;
    const std::vector<memory::Group> groups = memory::make_plan(profile, loose).groups;
    const int64_t extra = 4096;
    for (int pass = 0; pass < 3; ++pass) {
      for (const Tier& tier : tiers()) {
        SCOPED_TRACE(m.name + ", tier " + tier.name + ", pass " + std::to_string(pass));
        std::vector<memory::Decision> d(groups.size(), memory::Decision::Keep);
        std::optional<memory::OffloadPeak> model;
        model.emplace(memory::IncrementalPeak(graph, groups, extra, d), *graph, groups, tier.costs, d);
        std::vector<memory::Decision> by_storage(profile.storages.size(), memory::Decision::Keep);
        std::vector<int64_t> on_demand;
        auto simulated = [&]() {
          const memory::OffloadSchedule sch = memory::schedule_offloads(*graph, by_storage, tier.costs);
          on_demand.assign(graph->storages, -1);
          return memory::simulate(*graph, by_storage, extra, {}, &sch, memory::IncrementalPeak::kExact, nullptr, &on_demand);
        };
        std::vector<size_t> order(groups.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i : order) {
          const auto s = static_cast<size_t>(groups[i].storage);
          const memory::Decision to = rng() % 3 == 0 ? memory::Decision::Recompute : memory::Decision::Offload;
          const int64_t stop_at = rng() % 2 == 0 ? memory::IncrementalPeak::kExact : model->peak();
          const memory::OffloadPeak::Price p = model->price(i, to, stop_at);
          by_storage[s] = to;
          d[i] = to;
          const memory::Prediction truth = simulated();
          ++priced[tier.name];
          if (p.peak < stop_at && p.exact) {
            EXPECT_EQ(p.peak, truth.peak_bytes) << "group " << i << " " << memory::to_string(to);
            ++exact[tier.name];
            model->commit(i, to);
            EXPECT_TRUE(model->matches(truth)) << "group " << i << " " << memory::to_string(to) << " committed";
            continue;
          }
          EXPECT_LE(std::min(p.peak, stop_at), truth.peak_bytes) << "group " << i << " " << memory::to_string(to);
          std::vector<memory::Decision> held = d;
          std::replace(held.begin(), held.end(), memory::Decision::Offload, memory::Decision::Keep);
          model.emplace(memory::IncrementalPeak(graph, groups, extra, held), *graph, groups, tier.costs, d, &truth, &on_demand);
          ASSERT_TRUE(model->in_step()) << "group " << i << " " << memory::to_string(to);
          EXPECT_EQ(model->peak(), truth.peak_bytes);
          ++rebuilt[tier.name];
        }
      }
    }
  }
  // Every tier, copy-ins into the pool included, is priced exactly often enough to matter, and rebuilt at times.
  for (const Tier& tier : tiers()) {
    EXPECT_GT(exact[tier.name], priced[tier.name] / 4)
        << tier.name << ": the model was exact on " << exact[tier.name] << " of " << priced[tier.name] << " prices";
    EXPECT_GT(rebuilt[tier.name], 0u) << tier.name;
  }
  std::printf("exact / priced / rebuilt by tier:");
  for (const Tier& tier : tiers())
    std::printf(" %s %zu/%zu/%zu", tier.name.c_str(), exact[tier.name], priced[tier.name], rebuilt[tier.name]);
  std::printf("\n");
}

}  // namespace
}  // namespace ration
