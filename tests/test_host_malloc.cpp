// Host malloc between steps (BENCHMARKS.md, "Host malloc"): memory::keep_freed_host_memory keeps freed heap for the next
// allocation, so a step that frees and re-allocates the same large blocks does not page-fault them in
// again; train.malloc_keep_freed is read and checked by train::build_setup.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <vector>

#include "ration/config/config.h"
#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/base/host_malloc.h"
#include "ration/train/trainer.h"

namespace ration {
namespace {

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// One "step": four 12 MiB activations live at once (48 MiB, more than glibc's default trim threshold
// once its dynamic mmap threshold has risen to 12 MiB), every page written, then all freed.
void one_step() {
  std::vector<at::Tensor> live;
  for (int i = 0; i < 4; ++i) live.push_back(at::empty({3 << 20}, at::kFloat).fill_(1.0f));
  EXPECT_EQ(live[3][(3 << 20) - 1].item<float>(), 1.0f);
}

TEST(HostMalloc, KeptHeapIsNotFaultedInAgainEachStep) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "keep_freed_host_memory sets glibc's malloc thresholds";
#endif
  ASSERT_TRUE(memory::keep_freed_host_memory(int64_t{1} << 30));
  one_step();  // the heap grows once
  one_step();
  const int64_t before = minor_faults();
  constexpr int kSteps = 5;
  for (int s = 0; s < kSteps; ++s) one_step();
  const int64_t faults = minor_faults() - before;
  // The blocks now come from malloc, aligned by hand as c10 aligns them, and are counted to the byte.
  ASSERT_TRUE(memory::host_blocks_from_malloc());
  memory::install_counting_allocator();
  const int64_t counted = memory::current_bytes();
  {
    const at::Tensor t = at::empty({1001}, at::kFloat);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
    EXPECT_EQ(memory::current_bytes() - counted, 1001 * 4);
  }
  EXPECT_EQ(memory::current_bytes(), counted);
  // Faulting the 48 MiB in again each step would be 5 * 12288 = 61440 faults (glibc's default trims the
  // freed top of the heap after every step of this size); kept, only stray small blocks fault.
  EXPECT_LT(faults, kSteps * 12288 / 20) << faults << " minor page faults over " << kSteps << " steps";
}

TEST(HostMalloc, NegativeSizeAndBadConfigValueAreErrors) {
  EXPECT_THROW(memory::keep_freed_host_memory(-1), Error);
  Config cfg = Config::from_string("[train]\nmalloc_keep_freed = \"lots\"\n", "host.toml");
  try {
    train::build_setup(std::move(cfg));
    FAIL() << "a size that is not a size was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("host.toml"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.malloc_keep_freed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lots"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ration
