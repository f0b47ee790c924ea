// allocator.h — measured memory: a counting ATen CPU allocator (and CUDA caching-allocator stats).
// Owns: byte counters per category, current and peak, and the breakdown at the moment of the peak.
// Every allocation is tagged with the category active on its thread (CategoryGuard); retag() moves an
// existing storage to another category (a gradient stolen from backward, a value saved for backward).
// Cost: no global lock per allocation — atomic counters (exact totals and peaks) and a sharded map of
// live blocks; the breakdown at the peak is copied under a lock only when an allocation sets a new peak.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>

namespace ration::memory {

enum class Category : int {
  Other = 0,
  Parameters,
  Gradients,
  Optimizer,
  SavedActivations,
  Workspace,
  Data,
  kCount
};
constexpr int kNumCategories = static_cast<int>(Category::kCount);
const char* to_string(Category c);

struct Stats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;
  std::array<int64_t, kNumCategories> current{};  // by category, now
  std::array<int64_t, kNumCategories> at_peak{};  // by category, when the peak was reached
  std::array<int64_t, kNumCategories> peak{};     // each category's own peak
  int64_t device_peak = 0;  // peak of everything but Category::Data (its own maximum, not read off the total's)
};

// Replace ATen's CPU allocator with the counting one (idempotent). Tensors allocated before this
// call are not counted; install first thing in main() / test setup.
void install_counting_allocator();
bool counting_allocator_installed();

Stats stats();
// Device memory in the budget's sense: everything counted except Category::Data, the dataset a loader
// keeps in host memory and the batches it cuts from it (a batch prefetched during a step included).
int64_t device_peak_bytes(const Stats& s);
int64_t device_current_bytes(const Stats& s);
// The same on `device`: the counting allocator's less the dataset on CPU, the CUDA caching allocator's for
// a GPU (what a step's baseline and the offload thresholds read).
int64_t device_current_bytes(const at::Device& device);
void reset_peak();  // peak := current (per category too)
// Device bytes' high-water mark since the previous call (the first call: since start), then restarts it
// from the current bytes. Independent of reset_peak(), so a sampler (the trace's memory counter) sees
// every peak even while policies reset theirs; meant for one sampler at a time.
int64_t take_interval_peak();
int64_t current_bytes();

// Device memory (CUDA caching allocator) for the given device when built with RATION_CUDA; on CPU
// tensors this is the counting allocator's view.
Stats device_stats(const at::Device& device);
// device_stats' peak restarts from its current bytes (reset_peak() on CPU).
void reset_device_peak(const at::Device& device);
// Waits for the work queued on a GPU (a step's wall time ends when its kernels do); nothing on CPU.
void synchronize(const at::Device& device);

class CategoryGuard {
 public:
  explicit CategoryGuard(Category c);
  ~CategoryGuard();
  CategoryGuard(const CategoryGuard&) = delete;
  CategoryGuard& operator=(const CategoryGuard&) = delete;

 private:
  Category prev_;
};

// The category of t's storage; Other for storages the counting allocator did not make.
Category category_of(const at::Tensor& t);
// Move the bytes of t's storage to category c (no-op for storages the counting allocator did not make).
void retag(const at::Tensor& t, Category c);

// Human-readable bytes: "1.50 GiB".
std::string format_bytes(int64_t bytes);
// Parse "123", "512MiB", "2GiB", "1.5G", "300k": throws ration::Error naming `what` on bad input.
int64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace ration::memory
