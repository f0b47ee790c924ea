// The speed settings (BENCHMARKS.md, "Speed vs PyTorch") keep results exact: the counting allocator's
// lock-free counters give exact totals and peaks (device peak independent of host data allocated
// mid-step), also with allocating threads; the loader's prefetch hands out the same batches in the same
// order; train.threads sets ATen and OpenBLAS together; the per-op profile sees every op's backward.
#include <gtest/gtest.h>

#include <thread>

#include "gpt_fixture.h"
#include "test_util.h"

#include "ration/core/compute_threads.h"
#include "ration/data/text.h"
#include "ration/base/allocator.h"
#include "ration/plan/planner.h"
#include "ration/models/model.h"
#include "ration/config/config.h"
#include "ration/train/op_profile.h"
#include "ration/runtime/step_runtime.h"

namespace ration {
namespace {

using testing::small_gpt;
using testing::token_batch;

TEST(Speed, CountingAllocatorPeaksAreExactAndDeviceIgnoresHostData) {
  memory::install_counting_allocator();
  memory::reset_peak();
  const int64_t base = memory::device_current_bytes(memory::stats());
  {
    at::Tensor a = at::empty({1 << 18}, at::kFloat);  // 1 MiB workspace
    a.fill_(1);
  }
  {
    memory::CategoryGuard data(memory::Category::Data);
    at::Tensor d = at::empty({1 << 19}, at::kFloat);  // 2 MiB host data: raises the total, not the device
    d.fill_(1);
  }
  const memory::Stats s = memory::stats();
  EXPECT_EQ(memory::device_peak_bytes(s) - base, int64_t{1} << 20);
  EXPECT_GE(s.peak_bytes - s.current_bytes, int64_t{2} << 20);
}

TEST(Speed, CountingAllocatorTotalsAreExactAcrossThreads) {
  memory::install_counting_allocator();
  const int64_t before = memory::current_bytes();
  const int64_t allocations_before = memory::stats().allocations;
  memory::reset_peak();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 500; ++i) {
        at::Tensor x = at::empty({1024 + i}, at::kFloat);
        x.zero_();
      }
    });
  for (auto& th : threads) th.join();
  const memory::Stats s = memory::stats();
  EXPECT_EQ(s.current_bytes, before);
  EXPECT_EQ(s.allocations - allocations_before, 4 * 500);
  // At least one thread's largest tensor was live, at most all four's.
  EXPECT_GE(s.peak_bytes - before, (1024 + 499) * 4);
  EXPECT_LE(s.peak_bytes - before, 4 * (1024 + 499) * 4);
}

TEST(Speed, LoaderPrefetchHandsOutTheSameBatches) {
  at::Tensor text = at::arange(0, 200, at::kLong).remainder(256).to(at::kByte);
  auto ds = std::make_shared<data::TextWindows>(text, 8, 3);
  data::LoaderOptions plain_options{5, true, 7, false};
  data::LoaderOptions pre_options = plain_options;
  pre_options.prefetch = true;
  data::Loader plain(ds, plain_options), pre(ds, pre_options);
  for (int i = 0; i < 30; ++i) {  // several epochs
    if (i == 17) {  // a resume in the middle discards the prepared batch
      plain.set_position({1, 10});
      pre.set_position({1, 10});
    }
    const data::Batch a = plain.next(), b = pre.next();
    ASSERT_TRUE(at::equal(a.input.tensor(), b.input.tensor())) << "batch " << i;
    ASSERT_TRUE(at::equal(a.target.tensor(), b.target.tensor())) << "batch " << i;
    ASSERT_EQ(plain.position(), pre.position()) << "batch " << i;
    ASSERT_EQ(plain.last_global_items(), pre.last_global_items());
  }
  EXPECT_GE(pre.prefetched_batches(), 25);
  EXPECT_EQ(plain.prefetched_batches(), 0);
}

TEST(Speed, ComputeThreadsSetAtenAndOpenBlasTogether) {
  const ComputeThreads before = compute_threads();
  set_compute_threads(1);
  ComputeThreads t = compute_threads();
  EXPECT_EQ(t.aten, 1);
  if (t.blas_library == "openblas") EXPECT_EQ(t.blas, 1);
  set_compute_threads(2);
  t = compute_threads();
  EXPECT_EQ(t.aten, 2);
  if (t.blas_library == "openblas") EXPECT_EQ(t.blas, 2);
  EXPECT_THROW(set_compute_threads(0), Error);
  set_compute_threads(before.aten);
}

TEST(Speed, OpProfileTimesForwardAndBackwardPerOp) {
  memory::install_counting_allocator();
  auto model = small_gpt();
  const data::Batch batch = token_batch();
  train::StepRuntime rt;
  train::OpProfile profile(/*skip=*/1, /*steps=*/2);
  rt.add_hook(&profile);
  for (int i = 0; i < 4; ++i) {
    train::StepOptions o;
    o.gradients = train::GradientsAfter::Cleared;
    rt.run_step(*model, batch, o);
  }
  EXPECT_EQ(profile.profiled_steps(), 2);
  const auto& ops = profile.ops();
  ASSERT_TRUE(ops.count("causal_attention"));
  EXPECT_EQ(ops.at("causal_attention").calls, 2 * 2);  // 2 layers x 2 profiled steps
  EXPECT_GT(ops.at("causal_attention").backward_ms, 0.0);
  ASSERT_TRUE(ops.count("linear"));
  EXPECT_GT(ops.at("linear").forward_ms, 0.0);
  const nlohmann::json j = profile.to_json();
  EXPECT_EQ(j["profiled_steps"], 2);
  EXPECT_FALSE(j["nodes"].empty());
  EXPECT_NE(profile.table().find("causal_attention"), std::string::npos);
}

}  // namespace
}  // namespace ration
