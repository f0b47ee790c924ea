#include "ration/base/allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/csrc/api/include/torch/version.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unistd.h>
#include <unordered_map>

#include "ration/base/check.h"
#include "ration/base/host_malloc.h"

#ifdef RATION_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ration::memory {
namespace {

// The counters. The hot path (every allocation and free) takes no global lock: one atomic add on the
// total, one on the category, one on the device total (everything but Category::Data), and a
// compare-exchange maximum on each's peak. The totals are exact: each fetch_add returns one point of a
// single sequence of totals, and the peak is the maximum over that sequence. The breakdown at the peak
// (Stats::at_peak) is copied under g_peak_mu only when an allocation sets a new peak.
struct Counters {
  std::atomic<int64_t> current{0}, peak{0}, allocations{0};
  std::atomic<int64_t> device_current{0}, device_peak{0}, interval_peak{0};  // device: all but Category::Data
  std::array<std::atomic<int64_t>, kNumCategories> cat_current{}, cat_peak{}, at_peak{};
};
Counters g_counters;
std::mutex g_peak_mu;  // the at_peak copy and reset_peak
bool g_installed = false;
thread_local Category t_category = Category::Other;

void raise_to(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Raises the total's peak to `now`; true when this call set a new peak.
bool raise_total(int64_t now) {
  int64_t seen = g_counters.peak.load(std::memory_order_relaxed);
  while (now > seen) {
    if (g_counters.peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) return true;
  }
  return false;
}

void account(int64_t delta, Category c) {
  Counters& k = g_counters;
  const int ci = static_cast<int>(c);
  const int64_t now = k.current.fetch_add(delta, std::memory_order_relaxed) + delta;
  const int64_t cat_now = k.cat_current[ci].fetch_add(delta, std::memory_order_relaxed) + delta;
  const int64_t dev_now = c == Category::Data ? k.device_current.load(std::memory_order_relaxed)
                                              : k.device_current.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta <= 0) return;
  k.allocations.fetch_add(1, std::memory_order_relaxed);
  raise_to(k.cat_peak[ci], cat_now);
  raise_to(k.interval_peak, dev_now);
  raise_to(k.device_peak, dev_now);
  if (raise_total(now)) {
    std::lock_guard<std::mutex> lock(g_peak_mu);
    if (k.peak.load(std::memory_order_relaxed) == now)
      for (int i = 0; i < kNumCategories; ++i)
        k.at_peak[i].store(k.cat_current[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

// Live allocations by address, in shards with a lock each (so frees and allocations on different
// threads rarely meet). ATen's raw_allocate() requires DataPtr context == data pointer, so the
// per-allocation record lives here rather than in the context.
struct Block {
  c10::DataPtr inner;  // the base allocator's pointer; destroying it frees the memory
  int64_t size;
  Category category;
  void* raw = nullptr;  // or, for a host_block_alloc block (inner empty), what host_block_free takes
};
struct Shard {
  std::mutex mu;
  std::unordered_map<void*, Block> blocks;
};
constexpr int kShards = 64;
Shard& shard_of(const void* ptr) {
  static auto* shards = new std::array<Shard, kShards>();
  const auto h = (reinterpret_cast<uintptr_t>(ptr) >> 6) * 0x9E3779B97F4A7C15ull;
  return (*shards)[h >> 58];
}

void delete_block(void* ptr) {
  c10::DataPtr inner;
  void* raw = nullptr;
  int64_t size = 0;
  Category c = Category::Other;
  {
    Shard& shard = shard_of(ptr);
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.blocks.find(ptr);
    if (it == shard.blocks.end()) return;
    inner = std::move(it->second.inner);
    raw = it->second.raw;
    size = it->second.size;
    c = it->second.category;
    shard.blocks.erase(it);
  }
  account(-size, c);
  if (raw != nullptr) host_block_free(raw);
  // `inner` (when set) frees the memory here, outside the lock.
}

// The machine's physical memory (0 if unknown).
int64_t machine_memory_bytes() {
  static const int64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{0};
  }();
  return bytes;
}

// Checked before asking the system: an allocation that would take what ration holds past the machine's
// physical memory fails at once with sizes a user can act on, instead of a 100 GB malloc attempt (or
// an overcommitted one that ends in the OOM killer).
void refuse_beyond_machine(int64_t n) {
  const int64_t machine = machine_memory_bytes();
  if (machine <= 0) return;
  const int64_t held = g_counters.current.load(std::memory_order_relaxed);
  RATION_CHECK(held + n <= machine, "allocating ", format_bytes(n), " (", to_string(t_category), ") on top of the ",
               format_bytes(held), " ration holds needs more than this machine's ", format_bytes(machine),
               " of memory; hint: lower the model sizes (model.n_embd, hidden sizes, n_layer) or train.batch_size");
}

// PyTorch 2.3 dropped `const` from Allocator::allocate and made copy_data pure virtual.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define RATION_ALLOCATE_CONST
#define RATION_COPY_DATA_OVERRIDE override
#else
#define RATION_ALLOCATE_CONST const
#define RATION_COPY_DATA_OVERRIDE
#endif

void record(void* ptr, Block block) {
  const int64_t n = block.size;
  const Category c = block.category;
  {
    Shard& shard = shard_of(ptr);
    std::lock_guard<std::mutex> lock(shard.mu);
    shard.blocks.emplace(ptr, std::move(block));
  }
  account(n, c);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) RATION_ALLOCATE_CONST override {
    refuse_beyond_machine(static_cast<int64_t>(n));
    if (n > 0 && host_blocks_from_malloc()) {  // see base/host_malloc.h
      void* raw = nullptr;
      void* ptr = host_block_alloc(n, &raw);
      record(ptr, Block{c10::DataPtr(), static_cast<int64_t>(n), t_category, raw});
      return {ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CPU)};
    }
    c10::DataPtr inner = base_->allocate(n);
    void* ptr = inner.get();
    const c10::Device device = inner.device();
    if (ptr == nullptr) return inner;  // zero-size allocation
    record(ptr, Block{std::move(inner), static_cast<int64_t>(n), t_category});
    return {ptr, ptr, &delete_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const RATION_COPY_DATA_OVERRIDE {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

const char* to_string(Category c) {
  switch (c) {
    case Category::Other: return "other";
    case Category::Parameters: return "parameters";
    case Category::Gradients: return "gradients";
    case Category::Optimizer: return "optimizer";
    case Category::SavedActivations: return "saved_activations";
    case Category::Workspace: return "workspace";
    case Category::Data: return "data";
    case Category::kCount: break;
  }
  return "?";
}

void install_counting_allocator() {
  static CountingAllocator* allocator = nullptr;
  static std::mutex install_mu;
  std::lock_guard<std::mutex> lock(install_mu);
  if (allocator == nullptr) {
    allocator = new CountingAllocator(c10::GetDefaultCPUAllocator());
    // Priority above the default so later default registrations do not replace it.
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    g_installed = true;
  }
}

bool counting_allocator_installed() { return g_installed; }

Stats stats() {
  const Counters& k = g_counters;
  Stats s;
  std::lock_guard<std::mutex> lock(g_peak_mu);  // at_peak consistent with peak
  s.current_bytes = k.current.load(std::memory_order_relaxed);
  s.peak_bytes = k.peak.load(std::memory_order_relaxed);
  s.allocations = k.allocations.load(std::memory_order_relaxed);
  s.device_peak = k.device_peak.load(std::memory_order_relaxed);
  for (int i = 0; i < kNumCategories; ++i) {
    s.current[i] = k.cat_current[i].load(std::memory_order_relaxed);
    s.peak[i] = k.cat_peak[i].load(std::memory_order_relaxed);
    s.at_peak[i] = k.at_peak[i].load(std::memory_order_relaxed);
  }
  return s;
}

int64_t device_peak_bytes(const Stats& s) { return s.device_peak; }
int64_t device_current_bytes(const Stats& s) { return s.current_bytes - s.current[static_cast<int>(Category::Data)]; }

int64_t take_interval_peak() {
  const int64_t now = g_counters.device_current.load(std::memory_order_relaxed);
  return std::max(g_counters.interval_peak.exchange(now, std::memory_order_relaxed), now);
}

int64_t current_bytes() { return g_counters.current.load(std::memory_order_relaxed); }

void reset_peak() {
  Counters& k = g_counters;
  std::lock_guard<std::mutex> lock(g_peak_mu);
  k.peak.store(k.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  k.device_peak.store(k.device_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  for (int i = 0; i < kNumCategories; ++i) {
    const int64_t c = k.cat_current[i].load(std::memory_order_relaxed);
    k.at_peak[i].store(c, std::memory_order_relaxed);
    k.cat_peak[i].store(c, std::memory_order_relaxed);
  }
}

Stats device_stats(const at::Device& device) {
#ifdef RATION_CUDA
  if (device.is_cuda()) {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index()
                                                                                : c10::cuda::current_device());
    Stats out;
    constexpr size_t agg = 0;  // StatType::AGGREGATE in every version (the enum moved namespaces in 2.5)
    out.current_bytes = s.allocated_bytes[agg].current;
    out.peak_bytes = s.allocated_bytes[agg].peak;
    out.device_peak = out.peak_bytes;
    out.allocations = s.allocation[agg].allocated;
    return out;
  }
#endif
  (void)device;
  return stats();
}

int64_t device_current_bytes(const at::Device& device) {
  return device.is_cuda() ? device_stats(device).current_bytes : device_current_bytes(stats());
}

void reset_device_peak(const at::Device& device) {
#ifdef RATION_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : c10::cuda::current_device());
    return;
  }
#endif
  (void)device;
  reset_peak();
}

void synchronize(const at::Device& device) {
#ifdef RATION_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

CategoryGuard::CategoryGuard(Category c) : prev_(t_category) { t_category = c; }
CategoryGuard::~CategoryGuard() { t_category = prev_; }

Category category_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return Category::Other;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_block) return Category::Other;
  Shard& shard = shard_of(dp.get());
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.blocks.find(dp.get());
  return it == shard.blocks.end() ? Category::Other : it->second.category;
}

void retag(const at::Tensor& t, Category c) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_block) return;
  int64_t size = 0;
  Category from = c;
  {
    Shard& shard = shard_of(dp.get());
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.blocks.find(dp.get());
    if (it == shard.blocks.end() || it->second.category == c) return;
    size = it->second.size;
    from = it->second.category;
    it->second.category = c;
  }
  Counters& k = g_counters;
  k.cat_current[static_cast<int>(from)].fetch_sub(size, std::memory_order_relaxed);
  raise_to(k.cat_peak[static_cast<int>(c)],
           k.cat_current[static_cast<int>(c)].fetch_add(size, std::memory_order_relaxed) + size);
  if (from == Category::Data) {
    const int64_t dev_now = k.device_current.fetch_add(size, std::memory_order_relaxed) + size;
    raise_to(k.interval_peak, dev_now);
    raise_to(k.device_peak, dev_now);
  }
  if (c == Category::Data) k.device_current.fetch_sub(size, std::memory_order_relaxed);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  const std::string hint = " (expected a size such as 123, 300k, 512MiB, 2GiB or 1.5G)";
  size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (const std::exception&) {
    RATION_CHECK(false, what, ": cannot read '", text, "' as a size", hint);
  }
  std::string unit = text.substr(pos);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 1;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else RATION_CHECK(false, what, ": unknown unit '", unit, "' in '", text, "'", hint);
  RATION_CHECK(number >= 0 && std::isfinite(number), what, ": size must be non-negative, got '", text, "'", hint);
  // 2^62 bytes (4 EiB): far above any machine, and still exact to round into int64.
  constexpr double kLargestSize = 4.0 * 1024 * 1024 * 1024 * 1024 * 1024 * 1024;
  RATION_CHECK(number * scale <= kLargestSize, what, ": '", text, "' is ", number * scale,
               " bytes, larger than any machine (at most 4 EiB)", hint);
  return static_cast<int64_t>(std::llround(number * scale));
}

}  // namespace ration::memory
