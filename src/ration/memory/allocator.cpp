#include "ration/memory/allocator.h"

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

#include "ration/core/check.h"

#ifdef RATION_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ration::memory {
namespace {

std::mutex g_mu;
Stats g_stats;
// g_stats.current_bytes, mirrored for the machine-size check so that it takes no lock per allocation.
std::atomic<int64_t> g_held_bytes{0};
int64_t g_interval_peak = 0;  // device bytes high-water since the last take_interval_peak()
bool g_installed = false;
thread_local Category t_category = Category::Other;

void account(int64_t delta, Category c) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int ci = static_cast<int>(c);
  g_stats.current_bytes += delta;
  g_held_bytes.store(g_stats.current_bytes, std::memory_order_relaxed);
  g_stats.current[ci] += delta;
  if (delta > 0) {
    ++g_stats.allocations;
    if (g_stats.current[ci] > g_stats.peak[ci]) g_stats.peak[ci] = g_stats.current[ci];
    if (g_stats.current_bytes > g_stats.peak_bytes) {
      g_stats.peak_bytes = g_stats.current_bytes;
      g_stats.at_peak = g_stats.current;
    }
    g_interval_peak = std::max(g_interval_peak, device_current_bytes(g_stats));
  }
}

// Live allocations by address. ATen's raw_allocate() requires DataPtr context == data pointer, so
// the per-allocation record lives here rather than in the context.
struct Block {
  c10::DataPtr inner;  // the base allocator's pointer; destroying it frees the memory
  int64_t size;
  Category category;
};
std::unordered_map<void*, Block>& blocks() {
  static auto* map = new std::unordered_map<void*, Block>();
  return *map;
}

void delete_block(void* ptr) {
  c10::DataPtr inner;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = blocks().find(ptr);
    if (it == blocks().end()) return;
    inner = std::move(it->second.inner);
    const int64_t size = it->second.size;
    const Category c = it->second.category;
    blocks().erase(it);
    g_stats.current_bytes -= size;
    g_stats.current[static_cast<int>(c)] -= size;
  }
  // `inner` frees the memory here, outside the lock.
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
  const int64_t held = g_held_bytes.load(std::memory_order_relaxed);
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

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) RATION_ALLOCATE_CONST override {
    refuse_beyond_machine(static_cast<int64_t>(n));
    c10::DataPtr inner = base_->allocate(n);
    void* ptr = inner.get();
    const c10::Device device = inner.device();
    if (ptr == nullptr) return inner;  // zero-size allocation
    const Category c = t_category;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      blocks().emplace(ptr, Block{std::move(inner), static_cast<int64_t>(n), c});
    }
    account(static_cast<int64_t>(n), c);
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
  std::lock_guard<std::mutex> lock(g_mu);
  if (allocator == nullptr) {
    allocator = new CountingAllocator(c10::GetDefaultCPUAllocator());
    // Priority above the default so later default registrations do not replace it.
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    g_installed = true;
  }
}

bool counting_allocator_installed() { return g_installed; }

Stats stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

int64_t device_peak_bytes(const Stats& s) { return s.peak_bytes - s.at_peak[static_cast<int>(Category::Data)]; }
int64_t device_current_bytes(const Stats& s) { return s.current_bytes - s.current[static_cast<int>(Category::Data)]; }

int64_t take_interval_peak() {
  std::lock_guard<std::mutex> lock(g_mu);
  const int64_t now = device_current_bytes(g_stats);
  const int64_t peak = std::max(g_interval_peak, now);
  g_interval_peak = now;
  return peak;
}

int64_t current_bytes() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats.current_bytes;
}

void reset_peak() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.peak_bytes = g_stats.current_bytes;
  g_stats.at_peak = g_stats.current;
  g_stats.peak = g_stats.current;
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
    out.allocations = s.allocation[agg].allocated;
    return out;
  }
#endif
  (void)device;
  return stats();
}

CategoryGuard::CategoryGuard(Category c) : prev_(t_category) { t_category = c; }
CategoryGuard::~CategoryGuard() { t_category = prev_; }

Category category_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return Category::Other;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_block) return Category::Other;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = blocks().find(dp.get());
  return it == blocks().end() ? Category::Other : it->second.category;
}

void retag(const at::Tensor& t, Category c) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_block) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = blocks().find(dp.get());
  if (it == blocks().end() || it->second.category == c) return;
  Block& block = it->second;
  g_stats.current[static_cast<int>(block.category)] -= block.size;
  g_stats.current[static_cast<int>(c)] += block.size;
  const int ci = static_cast<int>(c);
  if (g_stats.current[ci] > g_stats.peak[ci]) g_stats.peak[ci] = g_stats.current[ci];
  block.category = c;
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
