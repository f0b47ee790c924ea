// host_malloc.cpp — see host_malloc.h.
#include "ration/base/host_malloc.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "ration/base/check.h"

namespace ration::memory {
namespace {
std::atomic<bool> g_from_malloc{false};
constexpr uintptr_t kAlignment = 64;  // c10's gAlignment for CPU tensors
}  // namespace

bool host_blocks_from_malloc() { return g_from_malloc.load(std::memory_order_relaxed); }

void* host_block_alloc(std::size_t n, void** raw) {
  void* p = std::malloc(n + kAlignment - 1);
  if (p == nullptr) throw std::bad_alloc();
  *raw = p;
  return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + kAlignment - 1) & ~(kAlignment - 1));
}

void host_block_free(void* raw) { std::free(raw); }

bool keep_freed_host_memory(int64_t bytes) {
  RATION_CHECK(bytes >= 0, "keep_freed_host_memory: bytes must be >= 0; got ", bytes);
#if defined(__GLIBC__)
  constexpr int64_t kLargestMmapThreshold = int64_t{32} << 20;  // glibc refuses more (HEAP_MAX_SIZE / 2)
  constexpr int64_t kIntMax = 0x7fffffff;                       // mallopt takes an int
  const bool trim = mallopt(M_TRIM_THRESHOLD, static_cast<int>(std::min(bytes, kIntMax))) == 1;
  const bool map = mallopt(M_MMAP_THRESHOLD, static_cast<int>(std::min(bytes, kLargestMmapThreshold))) == 1;
  if (trim && map) g_from_malloc.store(true, std::memory_order_relaxed);
  return trim && map;
#else
  return false;
#endif
}

}  // namespace ration::memory
