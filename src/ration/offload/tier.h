// tier.h — where offloaded saved activations go (seed method M2), behind one interface.
// Owns: Tier (synchronous write/read of flat byte buffers; the offload engine runs them on its copy
//       queues, so a tier never needs threads of its own), and the tiers:
//   SpillTier     — a directory on disk: one anonymous file per stored buffer (O_TMPFILE, or a name
//                   unlinked at once), so spill files vanish after use and when the process exits or
//                   crashes; an optional byte limit; ENOSPC and the limit are reported as TierFull.
//                   GPU buffers pass through pinned host staging from the CUDA caching host allocator.
//                   A freed file is kept (open, anonymous) for the next write of the same size: its pages
//                   are still in the page cache, so that write copies into memory that exists instead of
//                   allocating and first-touching new page-cache pages (several times the copy's own
//                   cost on this project's machine). Kept files never exceed the most bytes the tier
//                   held at once, and count in the byte limit.
//   HostTier      — host memory outside the device budget: pinned memory on a GPU build, plain memory
//                   on CPU (where it stands in for the GPU's host tier in tests); an optional byte limit.
//   ChainTier     — first tier while it has room, then the second (device → host → disk).
//   ThrottledTier — wraps a tier and limits its bandwidth (shared by concurrent copies) / fails after N bytes: tests and benches use it
//                   to make back-pressure and full-disk behaviour deterministic.
// Does not own: when to offload or fetch (offload/engine.h).
#pragma once
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace ration::memory {

// A write did not fit (disk full, tier limit): the engine falls back to recompute for that value.
class TierFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Tier {
 public:
  // One stored buffer; destroying it frees the tier's space (closes/deletes the file, frees memory).
  struct Slot {
    virtual ~Slot() = default;
    int64_t bytes = 0;
    std::string where;  // tier name, for reports
  };
  virtual ~Tier() = default;
  virtual std::string name() const = 0;
  // Copy `src` (a contiguous 1-D uint8 tensor) into a new slot. Throws TierFull when it does not fit,
  // ration::Error on other I/O failures.
  virtual std::unique_ptr<Slot> write(const at::Tensor& src) = 0;
  // Copy a slot back into `dst` (contiguous 1-D uint8 of slot.bytes).
  virtual void read(const Slot& slot, at::Tensor& dst) = 0;
  // Bytes currently stored.
  virtual int64_t used_bytes() const { return used_.load(); }
  // Bytes that still fit now: the file system's free space and the tier's own limit, whichever is
  // smaller (kUnboundedTier when neither bounds it). The planner plans offload within it.
  virtual int64_t free_bytes() const { return kUnboundedTier; }
  static constexpr int64_t kUnboundedTier = std::numeric_limits<int64_t>::max();

 protected:
  std::atomic<int64_t> used_{0};
};

class SpillTier : public Tier {
 public:
  // `dir` must exist and be writable (checked now, with an error naming it); limit 0 = no limit.
  explicit SpillTier(std::string dir, int64_t limit_bytes = 0);
  std::string name() const override { return "disk:" + dir_; }
  std::unique_ptr<Slot> write(const at::Tensor& src) override;
  void read(const Slot& slot, at::Tensor& dst) override;
  int64_t free_bytes() const override;
  // A file in `dir` that no one else can open (anonymous); -1 with errno on failure.
  static int open_anonymous(const std::string& dir);
  // The freed files kept for reuse (see the file comment): their bytes, and how many writes reused one.
  int64_t pooled_bytes() const;
  int64_t reused_files() const;
  void release_pool();  // closes every kept file (their disk space and page cache are freed)

  struct FilePool;  // tier.cpp; shared with the slots, which hand their file back when freed

 private:
  std::string dir_;
  int64_t limit_;
  std::shared_ptr<FilePool> pool_;
};

class HostTier : public Tier {
 public:
  explicit HostTier(int64_t limit_bytes = 0);
  std::string name() const override;
  std::unique_ptr<Slot> write(const at::Tensor& src) override;
  void read(const Slot& slot, at::Tensor& dst) override;
  int64_t free_bytes() const override;

 private:
  int64_t limit_;
};

class ChainTier : public Tier {
 public:
  ChainTier(std::unique_ptr<Tier> first, std::unique_ptr<Tier> second);
  std::string name() const override { return first_->name() + " -> " + second_->name(); }
  std::unique_ptr<Slot> write(const at::Tensor& src) override;
  void read(const Slot& slot, at::Tensor& dst) override;
  int64_t used_bytes() const override { return first_->used_bytes() + second_->used_bytes(); }
  int64_t free_bytes() const override;
  Tier& first() { return *first_; }
  Tier& second() { return *second_; }

 private:
  std::unique_ptr<Tier> first_, second_;
};

class ThrottledTier : public Tier {
 public:
  // bytes_per_second 0 = unthrottled; fail_after_bytes 0 = never: writes beyond it throw TierFull.
  ThrottledTier(std::unique_ptr<Tier> inner, double bytes_per_second, int64_t fail_after_bytes = 0);
  std::string name() const override { return "throttled(" + inner_->name() + ")"; }
  std::unique_ptr<Slot> write(const at::Tensor& src) override;
  void read(const Slot& slot, at::Tensor& dst) override;
  int64_t used_bytes() const override { return inner_->used_bytes(); }
  int64_t free_bytes() const override;

 private:
  // Sleeps until the copy that started at `started` has used its share of the bandwidth: copies in one
  // direction running at once (the queue's thread and a waiting compute thread) share it, each after the
  // ones before; writes and reads are paced apart (each has the whole bandwidth, as before).
  void pace(int64_t bytes, std::chrono::steady_clock::time_point started,
            std::chrono::steady_clock::time_point& next_free) const;
  std::unique_ptr<Tier> inner_;
  double bytes_per_second_;
  mutable std::mutex pace_mu_;
  // When the write / read bandwidth is free again.
  mutable std::chrono::steady_clock::time_point writes_free_{}, reads_free_{};
  int64_t fail_after_;
  std::atomic<int64_t> written_{0};
};

}  // namespace ration::memory
