// Offload (seed method M2): tiers round-trip bytes and leave no files behind, gradients with offload
// equal the plain run bitwise for every tier and threshold setting, and the thresholds and back-pressure
// behave as specified (made deterministic with a slowed tier).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>

#include "test_util.h"

#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/plan/simulator.h"
#include "ration/runtime/step_runtime.h"
#include "ration/models/model.h"
#include "ration/runtime/budget.h"

namespace ration {
namespace {
using memory::OffloadOptions;
using memory::OffloadStats;
using testing::TempDir;

int64_t files_in(const std::filesystem::path& dir) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

at::Tensor bytes(int64_t n, int seed) {
  at::manual_seed(seed);
  return at::randint(0, 256, {n}, at::kByte);
}

// ---- tiers ------------------------------------------------------------------------------------------

TEST(Tier, SpillRoundTripLeavesNoNamedFilesAndFreesSpace) {
  TempDir dir("spill");
  memory::SpillTier tier(dir.path.string());
  const at::Tensor a = bytes(3 << 20, 1), b = bytes(12345, 2);
  auto sa = tier.write(a);
  auto sb = tier.write(b);
  EXPECT_EQ(tier.used_bytes(), a.numel() + b.numel());
  EXPECT_EQ(files_in(dir.path), 0) << "spill files must be anonymous (gone on exit or crash)";
  at::Tensor ra = at::empty_like(a), rb = at::empty_like(b);
  tier.read(*sb, rb);
  tier.read(*sa, ra);
  EXPECT_TRUE(at::equal(ra, a));
  EXPECT_TRUE(at::equal(rb, b));
  sa.reset();
  sb.reset();
  EXPECT_EQ(tier.used_bytes(), 0);
}

TEST(Tier, SpillKeepsFreedFilesForTheNextWriteOfTheirSizeWithinTheMostHeldAtOnce) {
  TempDir dir("spill-pool");
  memory::SpillTier tier(dir.path.string());
  const at::Tensor a = bytes(1 << 20, 1), b = bytes(1 << 20, 2), c = bytes(2 << 20, 3);
  auto sa = tier.write(a);
  sa.reset();
  EXPECT_EQ(tier.pooled_bytes(), a.numel()) << "a freed spill file is kept for reuse";
  EXPECT_EQ(tier.used_bytes(), 0);
  auto sb = tier.write(b);  // same size: goes into the kept file
  EXPECT_EQ(tier.reused_files(), 1);
  EXPECT_EQ(tier.pooled_bytes(), 0);
  at::Tensor rb = at::zeros_like(b);
  tier.read(*sb, rb);
  EXPECT_TRUE(at::equal(rb, b)) << "a reused file must hold the new bytes only";
  auto sc = tier.write(c);  // no kept file of this size: a new one
  EXPECT_EQ(tier.reused_files(), 1);
  EXPECT_EQ(files_in(dir.path), 0) << "kept files stay anonymous";
  // The tier held 3 MiB at once: both files are kept; then a lone 1 MiB write and free keeps no more.
  sb.reset();
  sc.reset();
  EXPECT_EQ(tier.pooled_bytes(), 3 << 20);
  EXPECT_EQ(tier.used_bytes(), 0);
  {
    auto s1 = tier.write(a);
    auto s2 = tier.write(a);  // one reuses the kept 1 MiB file, the other is new
    auto s3 = tier.write(a);
    EXPECT_EQ(tier.reused_files(), 2);
  }
  EXPECT_LE(tier.pooled_bytes(), 3 << 20) << "kept files never exceed the most bytes held at once";
  tier.release_pool();
  EXPECT_EQ(tier.pooled_bytes(), 0);
}

TEST(Tier, SpillKeptFilesCountInTheLimit) {
  TempDir dir("spill-pool-limit");
  memory::SpillTier tier(dir.path.string(), /*limit=*/1 << 20);
  tier.write(bytes(600 << 10, 1)).reset();  // kept: 600 KiB of the 1 MiB limit
  EXPECT_EQ(tier.pooled_bytes(), 600 << 10);
  EXPECT_EQ(tier.free_bytes(), 1 << 20) << "kept files are the tier's room";
  // A write of another size closes kept files to stay within the limit, and fits.
  auto s = tier.write(bytes(800 << 10, 2));
  EXPECT_EQ(tier.pooled_bytes(), 0);
  EXPECT_THROW(tier.write(bytes(600 << 10, 3)), memory::TierFull);
}

TEST(Tier, SpillLimitIsTierFullAndBadDirectoriesAreClearErrors) {
  TempDir dir("spill-limit");
  memory::SpillTier tier(dir.path.string(), /*limit=*/1 << 20);
  auto s = tier.write(bytes(600 << 10, 1));
  EXPECT_THROW(tier.write(bytes(600 << 10, 2)), memory::TierFull);
  const std::string file = dir.write("not-a-dir", "x");
  testing::expect_error_containing([&] { memory::SpillTier t(file); }, {"offload.dir", file, "not a directory"});
  testing::expect_error_containing([&] { memory::SpillTier t(file + "/sub"); }, {"offload.dir", file + "/sub"});
  testing::expect_error_containing([&] { memory::SpillTier t("/nonexistent/ration"); },
                                   {"offload.dir '/nonexistent/ration'", "expected an existing writable directory"});
}

TEST(Tier, SpillFilesVanishWhenTheProcessIsKilled) {
  TempDir dir("spill-crash");
  const at::Tensor a = bytes(1 << 20, 3);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    memory::SpillTier tier(dir.path.string());
    auto slot = tier.write(a);
    ::raise(SIGKILL);  // a crash with the spill file open
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(files_in(dir.path), 0);
}

TEST(Tier, ChainOverflowsFromHostToDisk) {
  TempDir dir("chain");
  memory::ChainTier tier(std::make_unique<memory::HostTier>(1 << 20),
                         std::make_unique<memory::SpillTier>(dir.path.string()));
  const at::Tensor a = bytes(700 << 10, 1), b = bytes(700 << 10, 2);
  auto sa = tier.write(a);
  auto sb = tier.write(b);
  EXPECT_EQ(sa->where, "host");
  EXPECT_EQ(sb->where, "disk");
  EXPECT_EQ(tier.first().used_bytes(), a.numel());
  EXPECT_EQ(tier.second().used_bytes(), b.numel());
  at::Tensor ra = at::empty_like(a), rb = at::empty_like(b);
  tier.read(*sa, ra);
  tier.read(*sb, rb);
  EXPECT_TRUE(at::equal(ra, a) && at::equal(rb, b));
}

TEST(Tier, OptionsAreValidatedNamingTheKey) {
  OffloadOptions o;
  o.tier = "tape";
  testing::expect_error_containing([&] { memory::validate(o); }, {"offload.tier", "tape", "disk, host or host+disk"});
  o = {};
  o.t1 = 100;
  o.t2 = 10;
  testing::expect_error_containing([&] { memory::validate(o); }, {"offload.t1", "offload.t2"});
  o = {};
  o.prefetch = -1;
  testing::expect_error_containing([&] { memory::validate(o); }, "offload.prefetch");
}

// ---- the engine on a model ---------------------------------------------------------------------------

struct StepResult {
  std::vector<std::pair<std::string, at::Tensor>> grads;
  int64_t peak = 0;  // above the step's baseline
  OffloadStats stats;
  int64_t pending_after = 0;
  int64_t tier_used_after = 0;
  int64_t tier_used_before_backward = 0;
};

// Reads the tier between forward and backward.
class TierProbe : public train::StepHook {
 public:
  explicit TierProbe(train::StepRuntime& runtime) : runtime_(runtime) {}
  void after_forward(int64_t, const Value&) override { used = runtime_.engine()->tier().used_bytes(); }
  int64_t used = 0;

 private:
  train::StepRuntime& runtime_;
};

class OffloadModel : public ::testing::Test {
 protected:
  void SetUp() override {
    Config cfg = Config::from_string(
        "[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=64\nblock_size=64\ndropout=0.1\n", "gpt.toml");
    at::manual_seed(3);
    model_ = models::build_model(cfg);
    model_->train();
    at::manual_seed(5);
    at::Tensor tokens = at::randint(0, 256, {8, 65}, at::kLong);
    batch_.input = Value(tokens.slice(1, 0, 64).contiguous());
    batch_.target = Value(tokens.slice(1, 1, 65).contiguous());
    batch_.items = 8 * 64;
    plain_ = step(nullptr);
  }

  // One step; with options, under threshold offload.
  StepResult step(const OffloadOptions* options) {
    train::MemorySettings settings;
    if (options) {
      settings.offload.enabled = true;
      settings.offload.options = *options;
    }
    train::StepRuntime runtime(settings);
    TierProbe probe(runtime);
    if (options) runtime.add_hook(&probe);
    train::StepStats st = runtime.measure_step(*model_, batch_, train::StepOptions::collecting(11));
    StepResult r;
    r.grads = std::move(st.gradients);
    r.peak = st.peak_above_baseline();
    r.stats = st.offload;
    r.tier_used_before_backward = probe.used;
    if (options) {
      r.pending_after = runtime.engine()->pending_entries();
      r.tier_used_after = runtime.engine()->tier().used_bytes();
    }
    return r;
  }

  void expect_bitwise_equal(const StepResult& r) {
    ASSERT_EQ(r.grads.size(), plain_.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i)
      EXPECT_TRUE(at::equal(r.grads[i].second, plain_.grads[i].second)) << r.grads[i].first;
  }

  OffloadOptions options(const std::string& tier) {
    OffloadOptions o;
    o.tier = tier;
    o.dir = dir_.path.string();
    o.min_bytes = 16 << 10;
    o.t2 = 0;  // forward waits for each copy: memory does not depend on how fast the copy thread runs
    return o;
  }

  TempDir dir_{"offload-model"};
  std::unique_ptr<models::Model> model_;
  data::Batch batch_;
  StepResult plain_;
};

TEST_F(OffloadModel, EveryTierGivesBitwiseEqualGradientsAndFreesEverything) {
  for (const std::string tier : {"disk", "host", "host+disk"}) {
    SCOPED_TRACE(tier);
    OffloadOptions o = options(tier);
    if (tier == "host+disk") o.host_limit_bytes = 512 << 10;  // most goes on to disk
    const StepResult r = step(&o);
    expect_bitwise_equal(r);
    EXPECT_GT(r.stats.offloaded_values, 10);
    EXPECT_GT(r.tier_used_before_backward, 0);
    EXPECT_EQ(r.stats.written_bytes, r.stats.read_bytes);
    EXPECT_EQ(r.pending_after, 0) << "stored buffers left after backward";
    EXPECT_EQ(r.tier_used_after, 0);
    EXPECT_EQ(files_in(dir_.path), 0);
    EXPECT_LT(r.peak, plain_.peak) << "offloading everything must lower the measured peak";
  }
}

TEST_F(OffloadModel, T1DecidesWhatIsOffloaded) {
  OffloadOptions none = options("disk");
  none.t1 = int64_t{1} << 40;
  none.t2 = none.t1;
  const StepResult r_none = step(&none);
  EXPECT_EQ(r_none.stats.offloaded_values, 0);
  expect_bitwise_equal(r_none);

  OffloadOptions all = options("disk");
  all.t1 = 0;
  const StepResult r_all = step(&all);
  // Half way: usage exceeds T1 only in the second half of forward.
  OffloadOptions half = options("disk");
  half.t1 = memory::device_current_bytes(memory::stats()) + plain_.peak / 3;
  half.t2 = half.t1;
  const StepResult r_half = step(&half);
  EXPECT_GT(r_half.stats.offloaded_values, 0);
  EXPECT_LT(r_half.stats.offloaded_values, r_all.stats.offloaded_values);
  expect_bitwise_equal(r_all);
  expect_bitwise_equal(r_half);
  EXPECT_LE(r_all.peak, r_half.peak);
  EXPECT_LT(r_half.peak, plain_.peak);
}

TEST_F(OffloadModel, T2PausesForwardWhileCopiesAreInFlight) {
  // A slow tier (10 MB/s): without T2 copies pile up and the device holds them; with T2 = 0 forward
  // waits for every copy before it goes on.
  OffloadOptions free_run = options("disk");
  free_run.t2 = memory::kNoLimit;
  free_run.throttle_bytes_per_second = 10e6;
  const StepResult r_free = step(&free_run);
  OffloadOptions paced = free_run;
  paced.t2 = 0;
  const StepResult r_paced = step(&paced);
  EXPECT_EQ(r_free.stats.forward_pauses, 0);
  EXPECT_GT(r_paced.stats.forward_pauses, 0);
  EXPECT_GT(r_paced.stats.forward_pause_ms, 0);
  EXPECT_LT(r_paced.stats.max_usage_bytes, r_free.stats.max_usage_bytes)
      << "back-pressure must keep in-flight copies off the device";
  EXPECT_LE(r_paced.peak, r_free.peak);
  expect_bitwise_equal(r_free);
  expect_bitwise_equal(r_paced);
}

TEST_F(OffloadModel, T3DefersPrefetchAndPrefetchRunsAhead) {
  OffloadOptions ahead = options("disk");
  ahead.prefetch = 3;
  const StepResult r_ahead = step(&ahead);
  EXPECT_GT(r_ahead.stats.prefetches, 0);
  EXPECT_EQ(r_ahead.stats.deferred_prefetches, 0);

  OffloadOptions held = ahead;
  held.t3 = 0;  // every prefetch would exceed T3: the fetch queue waits until backward asks
  const StepResult r_held = step(&held);
  EXPECT_EQ(r_held.stats.prefetches, 0);
  EXPECT_GT(r_held.stats.deferred_prefetches, 0);
  EXPECT_EQ(r_held.stats.demand_fetches, r_held.stats.offloaded_storages);
  EXPECT_LE(r_held.peak, r_ahead.peak) << "prefetching early cannot need less memory than fetching on demand";

  OffloadOptions none = options("disk");
  none.prefetch = 0;
  const StepResult r_none = step(&none);
  EXPECT_EQ(r_none.stats.prefetches, 0);
  for (const auto* r : {&r_ahead, &r_held, &r_none}) expect_bitwise_equal(*r);
}

// The threshold loop: a value whose copy-out does not fit stays resident (counted as a fall-back) and
// offloading stops; a plan's does the same by recompute (Reliability.FullTier* tests).
TEST_F(OffloadModel, FullTierFallsBackWithEqualGradients) {
  OffloadOptions o = options("disk");
  o.fail_after_bytes = 256 << 10;  // the "disk" fills up after 256 KiB
  const StepResult r = step(&o);
  EXPECT_GT(r.stats.fallbacks, 0);
  EXPECT_GT(r.stats.read_bytes, 0) << "what did fit is still fetched back";
  expect_bitwise_equal(r);
  EXPECT_EQ(r.pending_after, 0);

  OffloadOptions limited = options("disk");
  limited.disk_limit_bytes = 300 << 10;
  const StepResult r2 = step(&limited);
  EXPECT_GT(r2.stats.fallbacks, 0);
  expect_bitwise_equal(r2);
}

TEST_F(OffloadModel, BackwardWithoutTheScopeIsAClearError) {
  OffloadOptions o = options("disk");
  Value loss;
  {
    OffloadScope scope(o);
    manual_seed(11);
    loss = model_->loss(batch_);
  }
  testing::expect_error_containing([&] { loss.backward(); }, "no memory policy is installed to fetch it back");
  model_->zero_grad();
}


// ---- the joint keep/recompute/offload plan -------------------------------------------------------------

TEST_F(OffloadModel, JointPlanFitsPredictsAndKeepsGradientsBitwise) {
  train::MemorySettings settings;
  settings.offload.enabled = true;
  settings.offload.options = options("disk");
  train::StepRuntime runtime(settings);
  const memory::StepProfile& profile = runtime.profile(*model_, batch_, 11);
  const int64_t base = profile.baseline_bytes;
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  probe.offload = runtime.offload_costs(4 << 20);
  const memory::Plan loose = memory::make_plan(profile, probe);
  const int64_t hi = loose.unconstrained_peak_bytes, lo = loose.minimum_peak_bytes;
  ASSERT_LT(lo, hi);
  int64_t offloaded_somewhere = 0, misses_before = 0;
  for (double f : {0.75, 0.5, 0.25, 0.0}) {
    memory::PlanOptions po = probe;
    po.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
    // A copy (not a reference): the runtime re-plans after a step whose copies missed their deadlines.
    const memory::Plan plan = runtime.plan(po);
    SCOPED_TRACE("budget " + memory::format_bytes(po.budget_bytes) + ": " + plan.to_table());
    const train::StepStats r = runtime.measure_step(*model_, batch_, train::StepOptions::collecting(11));
    offloaded_somewhere += plan.offloaded_groups;
    EXPECT_EQ(r.offloaded_values > 0, plan.offloaded_groups > 0);
    EXPECT_LE(r.peak_above_baseline(), po.budget_bytes - base) << "measured peak over budget";
    const int64_t predicted = plan.prediction.peak_bytes - base;
    EXPECT_LE(std::abs(static_cast<double>(predicted - r.peak_above_baseline())),
              0.05 * static_cast<double>(r.peak_above_baseline()))
        << "predicted " << predicted << " measured " << r.peak_above_baseline();
    EXPECT_EQ(predicted, r.peak_above_baseline()) << "the prediction is exact to the byte, copy-in pool included";
    // Copy-ins land in the pool the plan predicted: its buffers are made in backward, one per storage of
    // a size resident at once, and freed when the step ends.
    int64_t pool_made = 0;
    for (const auto& [b, n] : plan.prediction.copy_in_pool) pool_made += n;
    EXPECT_EQ(r.offload.pool_misses - misses_before, pool_made);
    misses_before = r.offload.pool_misses;
    EXPECT_EQ(runtime.engine()->copy_in_pool_bytes(), 0) << "a plan's pool is not held across steps";
    expect_bitwise_equal({r.gradients});
    EXPECT_EQ(runtime.engine()->pending_entries(), 0);
  }
  EXPECT_GT(offloaded_somewhere, 0) << "a fast tier should take part in the plan";
}

// A tier far slower (10 MB/s, throttled) than the plan was priced with (10 GB/s): the first plan's copies
// miss their deadlines (forward waits for them: slower, still within the prediction) even where a loaded
// machine slows the forward pass that hides them (at 40 MB/s a slowed first step sometimes hid them all).
// The runtime then plans the same budget again with the bandwidth its copies got, until planned copies
// land by their deadlines: the engine counts no deadline wait in the last steps.
TEST_F(OffloadModel, LateCopiesMakeTheRuntimeReplanUntilDeadlinesAreMet) {
  train::MemorySettings settings;
  settings.offload.enabled = true;
  settings.offload.options = options("disk");
  settings.offload.options.throttle_bytes_per_second = 10e6;
  train::StepRuntime runtime(settings);
  const memory::StepProfile& profile = runtime.profile(*model_, batch_, 11);
  const int64_t base = profile.baseline_bytes;
  memory::PlanOptions po;
  po.budget_bytes = int64_t{1} << 40;
  memory::OffloadCosts fast{1e7, 1e7, 0.001, 16 << 10, 0};
  fast.copy_in = memory::CopyInMemory::Pooled;
  fast.deadline_margin = 3;  // this test's machine may be shared: copies of a few ms jitter by as much
  po.offload = fast;
  const memory::Plan loose = memory::make_plan(profile, po);
  po.budget_bytes = loose.minimum_peak_bytes + (loose.unconstrained_peak_bytes - loose.minimum_peak_bytes) / 4;
  ASSERT_GT(runtime.plan(po).offloaded_groups, 0);
  EXPECT_EQ(runtime.copy_replans(), 0);
  std::vector<int64_t> waits;
  int64_t before = 0;
  for (int s = 0; s < 8; ++s) {
    const memory::Plan planned = *runtime.current_plan();  // the plan this step runs
    const train::StepStats r = runtime.measure_step(*model_, batch_, train::StepOptions::collecting(11));
    waits.push_back(r.offload.deadline_waits - before);
    before = r.offload.deadline_waits;
    SCOPED_TRACE("step " + std::to_string(s) + ": " + planned.to_table());
    EXPECT_LE(r.peak_above_baseline(), po.budget_bytes - base) << "measured peak over budget";
    EXPECT_LE(r.peak_above_baseline(), planned.prediction.peak_bytes - base) << "measured above the prediction";
    expect_bitwise_equal({r.gradients});
    EXPECT_EQ(runtime.engine()->pending_entries(), 0);
  }
  std::string seen;
  for (int64_t w : waits) seen += std::to_string(w) + " ";
  SCOPED_TRACE("deadline waits per step: " + seen + "; re-plans " + std::to_string(runtime.copy_replans()) +
               "; offloaded groups now " + std::to_string(runtime.current_plan()->offloaded_groups));
  EXPECT_GT(waits.front(), 0) << "copies priced 1000 times too fast must miss their deadlines";
  EXPECT_GE(runtime.copy_replans(), 1);
  EXPECT_EQ(waits.back(), 0) << "after re-planning, every planned copy lands by its deadline";
  EXPECT_LT(runtime.current_plan()->offload_costs->write_bytes_per_ms, fast.write_bytes_per_ms / 100);
  EXPECT_LE(runtime.current_plan()->prediction.peak_bytes, po.budget_bytes);
}

TEST_F(OffloadModel, JointPlanPrefersRecomputeWhenTheTierCannotHide) {
  const memory::StepProfile profile = train::profile_step(*model_, batch_, 11);
  memory::PlanOptions po;
  po.budget_bytes = int64_t{1} << 40;
  memory::OffloadCosts fast{1e7, 1e7, 0.01, 16 << 10, 2};   // 10 GB/s
  memory::OffloadCosts slow{10, 10, 0.01, 16 << 10, 2};   // 10 kB/s: a copy of 16 KiB takes 1.6 s
  po.offload = fast;
  const memory::Plan loose = memory::make_plan(profile, po);
  po.budget_bytes = (loose.unconstrained_peak_bytes + loose.minimum_peak_bytes) / 2;
  const memory::Plan with_fast = memory::make_plan(profile, po);
  po.offload = slow;
  const memory::Plan with_slow = memory::make_plan(profile, po);
  EXPECT_GT(with_fast.offloaded_groups, 0);
  EXPECT_EQ(with_slow.offloaded_groups, 0) << with_slow.to_table();
  EXPECT_GT(with_slow.prediction.recompute_ms, with_fast.prediction.recompute_ms);
  EXPECT_LE(with_fast.prediction.offload_stall_ms, 1.0);
}

TEST_F(OffloadModel, CopyDeadlinesGetSlackWithoutRaisingThePeak) {
  const memory::StepProfile profile = train::profile_step(*model_, batch_, 11);
  memory::PlanOptions po;
  po.budget_bytes = int64_t{1} << 40;
  memory::OffloadCosts fast{1e7, 1e7, 0.01, 16 << 10, 2};
  fast.copy_in = memory::CopyInMemory::Pooled;
  po.offload = fast;
  const memory::Plan loose = memory::make_plan(profile, po);
  int64_t later = 0, offloaded = 0;
  for (double f : {0.5, 0.25}) {
    po.budget_bytes = loose.minimum_peak_bytes +
                      static_cast<int64_t>(f * static_cast<double>(loose.unconstrained_peak_bytes - loose.minimum_peak_bytes));
    const memory::Plan plan = memory::make_plan(profile, po);
    SCOPED_TRACE(plan.to_table());
    std::vector<memory::Decision> by_storage(profile.storages.size(), memory::Decision::Keep);
    for (const auto& g : plan.groups) by_storage[static_cast<size_t>(g.storage)] = g.decision;
    const memory::OffloadSchedule tight = memory::schedule_offloads(profile, by_storage, fast);
    memory::OffloadSchedule relaxed = tight;
    for (const auto& g : plan.groups) {
      if (g.decision != memory::Decision::Offload) continue;
      ++offloaded;
      const int64_t at = tight.deadline[static_cast<size_t>(g.storage)];
      EXPECT_GE(g.deadline, at) << "a deadline moved earlier than the copy is predicted to land";
      EXPECT_LT(g.deadline, static_cast<int64_t>(profile.nodes.size()));
      later += g.deadline > at ? 1 : 0;
      relaxed.deadline[static_cast<size_t>(g.storage)] = g.deadline;
    }
    // The plan's prediction is the simulation with its own (relaxed) deadlines, and its peak is the one
    // the tight deadlines give: the slack is taken only where a node stays below the peak.
    const memory::Prediction with_tight =
        memory::simulate(profile, by_storage, po.extra_fixed_bytes, plan.store_from, &tight);
    const memory::Prediction with_relaxed =
        memory::simulate(profile, by_storage, po.extra_fixed_bytes, plan.store_from, &relaxed);
    EXPECT_EQ(plan.prediction.peak_bytes, with_tight.peak_bytes);
    EXPECT_EQ(plan.prediction.peak_bytes, with_relaxed.peak_bytes);
    EXPECT_EQ(plan.prediction.forward_peaks, with_relaxed.forward_peaks);
    EXPECT_LE(plan.prediction.peak_bytes, po.budget_bytes);
  }
  EXPECT_GT(offloaded, 0);
  EXPECT_GT(later, 0) << "no copy-out got any slack";
}


// The planner prices each try of an offload plan by a whole-step simulation that may stop where the peak
// reaches what the try must beat, and by the copy queues' timeline, whose prefetch distances are found by
// bisection. Oracles: the simulation run to the end, and the executor's rule as a linear search over
// distances.
TEST_F(OffloadModel, StoppedSimulationsAndPrefetchDistancesFollowTheirRules) {
  const memory::StepProfile profile = train::profile_step(*model_, batch_, 11);
  const memory::PlanGraph graph(profile);
  // The read rule's table: the first backward step at or after which some node with an ordinal at most x
  // has run (the last step where none has), against a scan.
  const auto& bo = profile.backward_order;
  ASSERT_FALSE(bo.empty());
  for (int64_t x = -2; x <= static_cast<int64_t>(profile.nodes.size()) + 2; ++x) {
    size_t expect = bo.size() - 1;
    for (size_t j = 0; j < bo.size(); ++j)
      if (*std::min_element(bo.begin(), bo.begin() + static_cast<std::ptrdiff_t>(j) + 1) <= x) {
        expect = j;
        break;
      }
    EXPECT_EQ(graph.first_step_at_or_below(x), expect) << "ordinal " << x;
  }
  memory::PlanOptions po;
  po.budget_bytes = int64_t{1} << 40;
  // Reads slow enough that most prefetches must run several nodes ahead.
  memory::OffloadCosts costs{1e7, 2e4, 0.01, 16 << 10, 1};
  po.offload = costs;
  const memory::Plan loose = memory::make_plan(profile, po);
  po.budget_bytes = (loose.unconstrained_peak_bytes + loose.minimum_peak_bytes) / 2;
  std::vector<memory::Decision> by_storage(profile.storages.size(), memory::Decision::Keep);
  int offloaded = 0;
  for (const auto& g : loose.groups) {  // every group that can go offloaded, so that the queue is long
    if (g.bytes < costs.min_bytes) continue;
    by_storage[static_cast<size_t>(g.storage)] = memory::Decision::Offload;
    ++offloaded;
  }
  ASSERT_GT(offloaded, 2);
  const memory::OffloadSchedule sch = memory::schedule_offloads(graph, by_storage, costs);
  // The executor's rule, distance by distance: reads in order of need share one queue; each takes the
  // shortest distance from min_prefetch whose read lands by its need, or is issued at the first backward
  // node, or exceeds the node count.
  const memory::SaveSpan& span = memory::save_span(graph);
  const auto nn = static_cast<int64_t>(profile.nodes.size());
  std::vector<std::pair<size_t, size_t>> reads;
  for (size_t s = 0; s < by_storage.size(); ++s)
    if (by_storage[s] == memory::Decision::Offload && span.saved_at[s] >= 0)
      reads.emplace_back(graph.first_step_at_or_below(span.first_use[s]), s);
  std::stable_sort(reads.begin(), reads.end());
  double free_b = 0;
  int longer = 0;
  for (const auto& [need_j, s] : reads) {
    const double copy = costs.per_copy_ms + static_cast<double>(profile.storages[s].bytes) / costs.read_bytes_per_ms;
    int d = costs.min_prefetch;
    double done = 0;
    for (;; ++d) {
      const size_t issue = graph.first_step_at_or_below(span.first_use[s] + d);
      done = std::max(graph.backward_start[issue], free_b) + copy;
      if (done <= graph.backward_start[need_j] || issue == 0 || d > nn) break;
    }
    free_b = done;
    EXPECT_EQ(sch.prefetch[s], d) << "storage " << s;
    longer += d > costs.min_prefetch ? 1 : 0;
  }
  EXPECT_GT(longer, 0) << "no read needed more than the least distance: the bisection was not exercised";
  // Stopped simulations: below the peak the prediction is whole and exact; at or above it the simulation
  // stops with a peak that reaches the threshold and does not pass the whole one.
  const memory::Prediction whole = memory::simulate(graph, by_storage, po.extra_fixed_bytes, {}, &sch);
  for (const int64_t stop_at : {whole.peak_bytes + 1, whole.peak_bytes, whole.peak_bytes - 1,
                                (whole.peak_bytes + whole.forward_peaks.front()) / 2, whole.forward_peaks.front()}) {
    bool stopped = false;
    const memory::Prediction p = memory::simulate(graph, by_storage, po.extra_fixed_bytes, {}, &sch, stop_at, &stopped);
    SCOPED_TRACE("stop at " + std::to_string(stop_at) + ", whole peak " + std::to_string(whole.peak_bytes));
    EXPECT_EQ(stopped, whole.peak_bytes >= stop_at);
    if (!stopped) {
      EXPECT_EQ(p.peak_bytes, whole.peak_bytes);
      EXPECT_EQ(p.forward_peaks, whole.forward_peaks);
      EXPECT_EQ(p.backward_peaks, whole.backward_peaks);
      EXPECT_EQ(p.peak_at, whole.peak_at);
    } else {
      EXPECT_GE(p.peak_bytes, stop_at);
      EXPECT_LE(p.peak_bytes, whole.peak_bytes);
    }
    EXPECT_EQ(p.offloaded_bytes, whole.offloaded_bytes);
    EXPECT_GT(p.offloaded_bytes, 0);
  }
}


// ---- the copy-in pool and O(1) fetch -------------------------------------------------------------------

// Saved values on one producer node, offloaded through the engine's public API and fetched back as a
// backward node would (the bench and measure_offload_costs drive it the same way).
struct EngineRound {
  std::shared_ptr<Node> node = std::make_shared<Node>();
  std::vector<std::shared_ptr<SavedValue>> values;
  std::vector<at::Tensor> back;
};
EngineRound engine_round(memory::OffloadEngine& engine, const std::vector<at::Tensor>& sources) {
  EngineRound r;
  r.node->spec.name = "pool_test";
  r.node->seq = 1;
  for (size_t i = 0; i < sources.size(); ++i) {
    r.values.push_back(std::make_shared<SavedValue>(r.node, static_cast<int>(i), sources[i].numel()));
    r.values.back()->save(sources[i]);
  }
  engine.begin_step();
  engine.begin_forward_node(*r.node, 0);
  for (auto& v : r.values) EXPECT_TRUE(engine.offload(v, 0));
  engine.end_forward_node(0);
  engine.before_backward_node(0, nullptr);
  for (auto& v : r.values) r.back.push_back(engine.fetch(*v));
  return r;
}

TEST(OffloadEngine, CopyInPoolIsReusedOnceBackwardReleasesAndIsCountedMemory) {
  memory::install_counting_allocator();
  OffloadOptions o;
  o.tier = "host";
  o.min_bytes = 0;
  memory::OffloadEngine engine(o);
  const std::vector<at::Tensor> a = {bytes(300 << 10, 1), bytes(300 << 10, 2), bytes(70 << 10, 3)};
  const std::vector<at::Tensor> b = {bytes(300 << 10, 4), bytes(70 << 10, 5), bytes(300 << 10, 6)};
  const int64_t before = memory::current_bytes();
  {
    EngineRound r = engine_round(engine, a);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(r.back[i], a[i]));
  }  // backward released every value: the buffers stay in the pool, free, until the step ends
  const OffloadStats first = engine.stats();
  EXPECT_EQ(engine.copy_in_pool_bytes(), (600 << 10) + (70 << 10));
  engine.end_step();
  EXPECT_EQ(engine.copy_in_pool_bytes(), 0) << "nothing reserved: the step's end frees the pool";
  engine.reserve_copy_in({{300 << 10, 2}, {70 << 10, 1}});
  EXPECT_EQ(first.pool_misses, 3);
  EXPECT_EQ(first.pool_reads, 0);
  EXPECT_EQ(engine.copy_in_pool_bytes(), (600 << 10) + (70 << 10));
  EXPECT_EQ(memory::current_bytes() - before, engine.copy_in_pool_bytes()) << "the pool is ordinary counted memory";
  {
    EngineRound r = engine_round(engine, b);
    for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(at::equal(r.back[i], b[i])) << "buffer reused with stale bytes";
    // While the values live their buffers are in use: one more read of that size needs a new buffer.
    EngineRound more = engine_round(engine, {bytes(70 << 10, 7)});
    EXPECT_TRUE(at::equal(more.back[0], bytes(70 << 10, 7)));
  }
  const OffloadStats second = engine.stats();
  EXPECT_EQ(second.pool_reads, 3) << "reserved buffers are reused by size";
  EXPECT_EQ(second.pool_misses, 4);
  EXPECT_EQ(engine.copy_in_pool_bytes(), (600 << 10) + (140 << 10));
  engine.end_step();
  EXPECT_EQ(engine.copy_in_pool_bytes(), (600 << 10) + (70 << 10)) << "the step's end keeps the reservation only";
  // A plan's reservation holds exactly what it names and frees the rest.
  engine.reserve_copy_in({{300 << 10, 1}, {1 << 20, 2}});
  EXPECT_EQ(engine.copy_in_pool_bytes(), (300 << 10) + (2 << 20));
  EXPECT_EQ(memory::current_bytes() - before, engine.copy_in_pool_bytes());
}

// A pipeline stage's micro-batches in flight number their nodes alike: each copy belongs to the micro-batch
// selected when it was made, a backward fetches (and prefetches) only its own micro-batch's, and selecting a
// micro-batch frees the copy-in buffers another one left idle (docs/METHODS.md, "Distributed training").
TEST(OffloadEngine, MicroBatchesInFlightKeepTheirCopiesApart) {
  memory::install_counting_allocator();
  OffloadOptions o;
  o.tier = "host";
  o.min_bytes = 0;
  o.prefetch = 4;
  memory::OffloadEngine engine(o);
  auto node = [](int seq) {
    auto n = std::make_shared<Node>();
    n->spec.name = "micro";
    n->seq = seq;
    return n;
  };
  const std::vector<std::shared_ptr<Node>> nodes = {node(1), node(2)};
  const std::vector<at::Tensor> sources = {bytes(200 << 10, 1), bytes(200 << 10, 2)};
  std::vector<std::shared_ptr<SavedValue>> values;
  engine.begin_step();
  for (int64_t micro = 0; micro < 2; ++micro) {  // both forwards, the same ordinal 0
    engine.select_micro_batch(micro);
    values.push_back(std::make_shared<SavedValue>(nodes[static_cast<size_t>(micro)], 0, sources[static_cast<size_t>(micro)].numel()));
    values.back()->save(sources[static_cast<size_t>(micro)]);
    engine.begin_forward_node(*nodes[static_cast<size_t>(micro)], 0);
    ASSERT_TRUE(engine.offload(values.back(), 0));
    engine.end_forward_node(0);
  }
  for (int64_t micro = 0; micro < 2; ++micro) {  // each backward in turn
    engine.select_micro_batch(micro);
    EXPECT_EQ(engine.copy_in_pool_bytes(), 0) << "micro-batch " << micro << " begins with no idle copy-in buffer";
    engine.before_backward_node(0, nullptr);
    const OffloadStats s = engine.stats();
    EXPECT_EQ(s.prefetches + s.demand_fetches, micro + 1) << "backward of micro-batch " << micro << " read another's copy";
    {
      const at::Tensor back = engine.fetch(*values[static_cast<size_t>(micro)]);
      EXPECT_TRUE(at::equal(back, sources[static_cast<size_t>(micro)]));
      values[static_cast<size_t>(micro)].reset();
    }
    EXPECT_EQ(engine.copy_in_pool_bytes(), 200 << 10) << "the buffer stays in the pool until the next selection";
  }
  engine.end_step();
  EXPECT_EQ(engine.pending_entries(), 0);
}

TEST(OffloadEngine, FetchFindsEveryViewOfManyStoragesInAnyOrder) {
  OffloadOptions o;
  o.tier = "host";
  o.min_bytes = 0;
  memory::OffloadEngine engine(o);
  auto node = std::make_shared<Node>();
  node->spec.name = "many";
  node->seq = 1;
  constexpr int kStorages = 600;
  std::vector<at::Tensor> bases;
  std::vector<std::shared_ptr<SavedValue>> values;
  std::vector<at::Tensor> expected;
  engine.begin_step();
  engine.begin_forward_node(*node, 0);
  for (int i = 0; i < kStorages; ++i) {
    bases.push_back(at::arange(i, i + 64, at::kFloat));
    for (const at::Tensor& view : {bases.back().narrow(0, 0, 32), bases.back().narrow(0, 16, 48)}) {
      values.push_back(std::make_shared<SavedValue>(node, static_cast<int>(values.size()), 256));
      values.back()->save(view);
      expected.push_back(view.clone());
      ASSERT_TRUE(engine.offload(values.back(), -1, 0));
    }
  }
  engine.end_forward_node(0);
  EXPECT_EQ(engine.pending_entries(), kStorages) << "views of one storage share one entry";
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  for (size_t i : order) {
    const at::Tensor t = engine.fetch(*values[i]);
    ASSERT_TRUE(at::equal(t, expected[i])) << "value " << i;
  }
  EXPECT_EQ(engine.pending_entries(), 0);
  EXPECT_EQ(engine.stats().read_bytes, kStorages * 256);
}

TEST(OffloadEngine, CostsAreMeasuredThroughTheEngineWithItsPool) {
  OffloadOptions o;
  o.tier = "host";
  memory::HostTier tier;
  const memory::OffloadCosts c = memory::measure_offload_costs(tier, o, 4 << 20);
  EXPECT_EQ(c.copy_in, memory::CopyInMemory::Pooled);
  EXPECT_GT(c.write_bytes_per_ms, 1e3) << "host memory copies faster than 1 MB/s";
  EXPECT_GT(c.read_bytes_per_ms, 1e3);
  EXPECT_GT(c.per_copy_ms, 0);
  EXPECT_EQ(tier.used_bytes(), 0) << "measuring leaves nothing in the tier";
  TempDir dir("costs");
  memory::SpillTier spill(dir.path.string());
  const memory::OffloadCosts d = memory::measure_offload_costs(spill, o, 16 << 20);
  EXPECT_EQ(d.copy_in, memory::CopyInMemory::Pooled);
  EXPECT_GT(d.read_bytes_per_ms, 1e3);
  EXPECT_EQ(spill.used_bytes(), 0);
}

// A host tier whose copies take a while and remember the thread that ran them.
class RecordingTier : public memory::Tier {
 public:
  std::string name() const override { return "recording"; }
  std::unique_ptr<Slot> write(const at::Tensor& src) override {
    note();
    return inner_.write(src);
  }
  void read(const Slot& slot, at::Tensor& dst) override {
    note();
    inner_.read(slot, dst);
  }
  int64_t on(std::thread::id id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::count(threads_.begin(), threads_.end(), id);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.clear();
  }

 private:
  void note() {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mu_);
    threads_.push_back(std::this_thread::get_id());
  }
  memory::HostTier inner_;
  mutable std::mutex mu_;
  std::vector<std::thread::id> threads_;
};

TEST(OffloadEngine, AWaitingComputeThreadRunsTheQueuedCopiesItWaitsFor) {
  OffloadOptions o;
  o.min_bytes = 0;
  auto owned = std::make_unique<RecordingTier>();
  RecordingTier& tier = *owned;
  memory::OffloadEngine engine(std::move(owned), o);
  std::vector<at::Tensor> src;
  for (int i = 0; i < 6; ++i) src.push_back(bytes(64 << 10, 20 + i));
  const auto me = std::this_thread::get_id();
  {
    // Every copy-out is due at node 0: the wait there runs queued copies on this thread, and the fetches
    // (all issued at once, each waited for in order) run the queued reads up to their own.
    EngineRound r = engine_round(engine, src);
    for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(at::equal(r.back[i], src[i]));
    EXPECT_GE(tier.on(me), 1) << "the waiting thread copied nothing itself";
    // Each copy not done at its deadline counts (50 ms each: only a preemption that long between the
    // first offload and the deadline check would let the first one finish before it).
    EXPECT_GE(engine.stats().deadline_waits, 5);
  }
  engine.end_step();
  tier.clear();
  engine.set_copy_waits(memory::CopyWaits::Block);
  {
    EngineRound r = engine_round(engine, src);
    for (size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(at::equal(r.back[i], src[i]));
    EXPECT_EQ(tier.on(me), 0) << "CopyWaits::Block leaves every copy to the queues";
  }
  engine.end_step();
  EXPECT_EQ(engine.pending_entries(), 0);
  EXPECT_EQ(engine.stats().written_bytes, 2 * 6 * (64 << 10));
}

}  // namespace
}  // namespace ration
