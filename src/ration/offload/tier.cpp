#include "ration/offload/tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

#ifdef RATION_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ration::memory {
namespace {

// Copies run on the offload engine's queue threads; on a GPU the engine has made that queue's stream
// current, so a copy is enqueued there and waited for here (the compute stream never waits).
void sync_copy(const at::Tensor& t) {
#ifdef RATION_CUDA
  if (t.is_cuda()) c10::cuda::getCurrentCUDAStream(t.device().index()).synchronize();
#else
  (void)t;
#endif
}

// Host staging for a device buffer on its way to or from a spill file: pinned memory from the CUDA
// caching host allocator, which hands the same already-faulted, page-locked blocks back on every copy
// (a fresh pageable buffer per copy pays first-touch faults and a staged, synchronous transfer).
at::Tensor host_staging(int64_t bytes) {
#ifdef RATION_CUDA
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
#else
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
#endif
}

bool is_full_errno(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

}  // namespace

// Freed spill files kept open for the next write of their size (see tier.h). Shared by the tier and its
// slots, so a slot freed on a copy thread hands its file back under the pool's lock.
struct SpillTier::FilePool {
  ~FilePool() { shrink_to(0); }
  // A kept file of exactly `bytes`, or -1.
  int take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return -1;
    const int fd = it->second.back();
    it->second.pop_back();
    pooled_ -= bytes;
    ++reuses_;
    return fd;
  }
  // A freed file of `bytes` (`stored`: the tier's bytes in use without it): kept while kept and stored
  // bytes together stay within the most the tier held at once, else closed (its blocks are freed).
  void give(int fd, int64_t bytes, int64_t stored) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stored + pooled_ + bytes <= high_water_) {
        free_[bytes].push_back(fd);
        pooled_ += bytes;
        return;
      }
    }
    ::close(fd);
  }
  void note_stored(int64_t stored) {
    std::lock_guard<std::mutex> lock(mu_);
    high_water_ = std::max(high_water_, stored);
  }
  // Closes kept files, largest first, until at most `keep` bytes are kept; returns the bytes closed.
  int64_t shrink_to(int64_t keep) {
    std::vector<int> closing;
    int64_t closed = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.rbegin(); it != free_.rend() && pooled_ > keep; ++it) {
        while (!it->second.empty() && pooled_ > keep) {
          closing.push_back(it->second.back());
          it->second.pop_back();
          pooled_ -= it->first;
          closed += it->first;
        }
      }
    }
    for (int fd : closing) ::close(fd);
    return closed;
  }
  int64_t pooled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pooled_;
  }
  int64_t reuses() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reuses_;
  }

 private:
  mutable std::mutex mu_;
  std::map<int64_t, std::vector<int>> free_;  // file size -> kept files of that size
  int64_t pooled_ = 0, high_water_ = 0, reuses_ = 0;
};

namespace {

struct FileSlot : Tier::Slot {
  int fd = -1;
  std::atomic<int64_t>* used = nullptr;
  std::shared_ptr<SpillTier::FilePool> pool;  // set once the write succeeded: the file goes back there
  ~FileSlot() override {
    if (used) *used -= bytes;
    if (fd < 0) return;
    if (pool) pool->give(fd, bytes, used ? used->load() : 0);
    else ::close(fd);  // anonymous file: closing frees its blocks
  }
};

struct HostSlot : Tier::Slot {
  at::Tensor pinned;       // GPU builds: pinned host memory
  void* plain = nullptr;   // CPU: memory outside the counting allocator (not device memory)
  std::atomic<int64_t>* used = nullptr;
  ~HostSlot() override {
    std::free(plain);
    if (used) *used -= bytes;
  }
};

struct ChainSlot : Tier::Slot {
  std::unique_ptr<Tier::Slot> inner;
  bool in_first = true;
};

}  // namespace

// ---- SpillTier ---------------------------------------------------------------------------------

int SpillTier::open_anonymous(const std::string& dir) {
#ifdef O_TMPFILE
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return -1;
#endif
  // Filesystems without O_TMPFILE: a unique name, unlinked at once (the data lives while fd is open).
  std::string templ = dir + "/ration-spill-XXXXXX";
  int fd2 = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd2 >= 0) ::unlink(templ.c_str());
  return fd2;
}

SpillTier::SpillTier(std::string dir, int64_t limit_bytes)
    : dir_(std::move(dir)), limit_(limit_bytes), pool_(std::make_shared<FilePool>()) {
  RATION_CHECK(!dir_.empty(), "offload.dir: empty path (expected a writable directory for spill files)");
  struct stat st{};
  RATION_CHECK(::stat(dir_.c_str(), &st) == 0, "offload.dir '", dir_, "': ", std::strerror(errno),
               " (expected an existing writable directory for spill files)");
  RATION_CHECK(S_ISDIR(st.st_mode), "offload.dir '", dir_, "' is not a directory (expected a writable directory "
               "for spill files)");
  const int fd = open_anonymous(dir_);
  RATION_CHECK(fd >= 0, "offload.dir '", dir_, "': cannot create spill files there: ", std::strerror(errno),
               " (expected a writable directory)");
  ::close(fd);
}

std::unique_ptr<Tier::Slot> SpillTier::write(const at::Tensor& src_in) {
  at::Tensor src = src_in;
  if (!src_in.is_cpu()) {  // on the engine's copy-out stream: stage through pinned memory
    src = host_staging(src_in.numel());
    src.copy_(src_in, /*non_blocking=*/true);
    sync_copy(src_in);
  }
  const int64_t n = src.numel();
  if (limit_ > 0 && used_.load() + n > limit_)
    throw TierFull("spill directory " + dir_ + " holds " + format_bytes(used_.load()) + " of its limit " +
                   format_bytes(limit_) + "; " + format_bytes(n) + " more do not fit");
  auto slot = std::make_unique<FileSlot>();
  slot->fd = pool_->take(n);  // a kept file of this size: its page-cache pages are reused
  if (slot->fd < 0) {
    if (limit_ > 0) pool_->shrink_to(std::max<int64_t>(0, limit_ - used_.load() - n));  // kept files count in the limit
    slot->fd = open_anonymous(dir_);
  }
  RATION_CHECK(slot->fd >= 0, "offload.dir '", dir_, "': cannot create a spill file: ", std::strerror(errno));
  const auto* p = static_cast<const char*>(src.data_ptr());
  int64_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(slot->fd, p + done, static_cast<size_t>(n - done), done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && is_full_errno(errno) && pool_->shrink_to(0) > 0) continue;  // the kept files' space first
    if (w < 0 && is_full_errno(errno))
      throw TierFull("spill directory " + dir_ + ": " + std::strerror(errno) + " after " + format_bytes(done) +
                     " of " + format_bytes(n));
    RATION_CHECK(w > 0, "offload.dir '", dir_, "': writing a spill file failed: ", std::strerror(errno));
    done += w;
  }
  slot->bytes = n;
  slot->where = "disk";
  slot->used = &used_;
  slot->pool = pool_;
  pool_->note_stored(used_ += n);
  return slot;
}

int64_t SpillTier::free_bytes() const {
  struct statvfs fs{};
  int64_t free = kUnboundedTier;
  if (::statvfs(dir_.c_str(), &fs) == 0)  // kept files are the tier's room too
    free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) + pool_->pooled();
  if (limit_ > 0) free = std::min(free, std::max<int64_t>(0, limit_ - used_.load()));
  return free;
}

int64_t SpillTier::pooled_bytes() const { return pool_->pooled(); }
int64_t SpillTier::reused_files() const { return pool_->reuses(); }
void SpillTier::release_pool() { pool_->shrink_to(0); }

void SpillTier::read(const Slot& slot_in, at::Tensor& dst) {
  const auto& slot = dynamic_cast<const FileSlot&>(slot_in);
  RATION_ASSERT(dst.numel() == slot.bytes, "spill read of ", slot.bytes, " bytes into ", dst.numel());
  at::Tensor host = dst.is_cpu() ? dst : host_staging(slot.bytes);
  auto* p = static_cast<char*>(host.data_ptr());
  int64_t done = 0;
  while (done < slot.bytes) {
    const ssize_t r = ::pread(slot.fd, p + done, static_cast<size_t>(slot.bytes - done), done);
    if (r < 0 && errno == EINTR) continue;
    RATION_CHECK(r > 0, "offload.dir '", dir_, "': reading a spill file back failed after ", done, " of ",
                 slot.bytes, " bytes: ", r == 0 ? "unexpected end of file" : std::strerror(errno));
    done += r;
  }
  if (!dst.is_cpu()) {
    dst.copy_(host, /*non_blocking=*/true);
    sync_copy(dst);
  }
}

// ---- HostTier ----------------------------------------------------------------------------------

HostTier::HostTier(int64_t limit_bytes) : limit_(limit_bytes) {}

std::string HostTier::name() const {
#ifdef RATION_CUDA
  return "pinned-host";
#else
  return "host";
#endif
}

std::unique_ptr<Tier::Slot> HostTier::write(const at::Tensor& src) {
  const int64_t n = src.numel();
  if (limit_ > 0 && used_.load() + n > limit_)
    throw TierFull("host tier holds " + format_bytes(used_.load()) + " of its limit " + format_bytes(limit_));
  auto slot = std::make_unique<HostSlot>();
  if (src.is_cpu()) {
    slot->plain = std::malloc(static_cast<size_t>(std::max<int64_t>(n, 1)));
    RATION_CHECK(slot->plain != nullptr, "host tier: cannot allocate ", format_bytes(n));
    std::memcpy(slot->plain, src.data_ptr(), static_cast<size_t>(n));
  } else {
    slot->pinned = at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    slot->pinned.copy_(src, /*non_blocking=*/true);
    sync_copy(src);
  }
  slot->bytes = n;
  slot->where = "host";
  slot->used = &used_;
  used_ += n;
  return slot;
}

int64_t HostTier::free_bytes() const {
  return limit_ > 0 ? std::max<int64_t>(0, limit_ - used_.load()) : kUnboundedTier;
}

void HostTier::read(const Slot& slot_in, at::Tensor& dst) {
  const auto& slot = dynamic_cast<const HostSlot&>(slot_in);
  RATION_ASSERT(dst.numel() == slot.bytes, "host read of ", slot.bytes, " bytes into ", dst.numel());
  if (slot.plain != nullptr) {
    RATION_ASSERT(dst.is_cpu(), "host tier: a CPU-stored buffer read into ", dst.device());
    std::memcpy(dst.data_ptr(), slot.plain, static_cast<size_t>(slot.bytes));
  } else {
    dst.copy_(slot.pinned, /*non_blocking=*/true);
    sync_copy(dst);
  }
}

// ---- ChainTier ---------------------------------------------------------------------------------

ChainTier::ChainTier(std::unique_ptr<Tier> first, std::unique_ptr<Tier> second)
    : first_(std::move(first)), second_(std::move(second)) {}

std::unique_ptr<Tier::Slot> ChainTier::write(const at::Tensor& src) {
  auto slot = std::make_unique<ChainSlot>();
  try {
    slot->inner = first_->write(src);
  } catch (const TierFull&) {
    slot->inner = second_->write(src);  // a TierFull here propagates: both are full
    slot->in_first = false;
  }
  slot->bytes = slot->inner->bytes;
  slot->where = slot->inner->where;
  return slot;
}

int64_t ChainTier::free_bytes() const {
  const int64_t a = first_->free_bytes(), b = second_->free_bytes();
  return a > kUnboundedTier - b ? kUnboundedTier : a + b;
}

void ChainTier::read(const Slot& slot_in, at::Tensor& dst) {
  const auto& slot = dynamic_cast<const ChainSlot&>(slot_in);
  (slot.in_first ? first_ : second_)->read(*slot.inner, dst);
}

// ---- ThrottledTier -----------------------------------------------------------------------------

ThrottledTier::ThrottledTier(std::unique_ptr<Tier> inner, double bytes_per_second, int64_t fail_after_bytes)
    : inner_(std::move(inner)), bytes_per_second_(bytes_per_second), fail_after_(fail_after_bytes) {}

void ThrottledTier::pace(int64_t bytes, std::chrono::steady_clock::time_point started,
                         std::chrono::steady_clock::time_point& next_free) const {
  if (bytes_per_second_ <= 0) return;
  const auto need = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_second_));
  std::chrono::steady_clock::time_point until;
  {
    std::lock_guard<std::mutex> lock(pace_mu_);
    until = std::max(started, next_free) + need;
    next_free = until;
  }
  std::this_thread::sleep_until(until);
}

std::unique_ptr<Tier::Slot> ThrottledTier::write(const at::Tensor& src) {
  if (fail_after_ > 0 && written_.load() + src.numel() > fail_after_)
    throw TierFull("throttled tier: injected full device after " + format_bytes(written_.load()));
  const auto t0 = std::chrono::steady_clock::now();
  auto slot = inner_->write(src);
  written_ += src.numel();
  pace(src.numel(), t0, writes_free_);
  return slot;
}

int64_t ThrottledTier::free_bytes() const {
  const int64_t inner = inner_->free_bytes();
  return fail_after_ > 0 ? std::min(inner, std::max<int64_t>(0, fail_after_ - written_.load())) : inner;
}

void ThrottledTier::read(const Slot& slot, at::Tensor& dst) {
  const auto t0 = std::chrono::steady_clock::now();
  inner_->read(slot, dst);
  pace(slot.bytes, t0, reads_free_);
}

}  // namespace ration::memory
