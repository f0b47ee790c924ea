#include "ration/offload/engine.h"
#include "ration/base/timing.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <optional>
#include <future>
#include <thread>

#include <time.h>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/core/trace.h"
#include "ration/base/allocator.h"

#ifdef RATION_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ration::memory {
namespace {

using Clock = std::chrono::steady_clock;

bool ready(const std::shared_future<void>& f) {
  return f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// Set while a waiting compute thread runs a queued copy (Queue::help_until): its trace span goes on a
// track of its own, since it may overlap the queue thread's copy (a track's spans nest).
thread_local bool g_running_for_queue = false;
enum class Direction { Out, In };
const char* copy_track(Direction d) {
  if (g_running_for_queue) return d == Direction::Out ? "copy-out (waiting thread)" : "copy-in (waiting thread)";
  return d == Direction::Out ? "copy-out" : "copy-in";
}

// The whole storage of `t` as a flat byte tensor (shares memory; no copy).
at::Tensor storage_bytes_of(const at::Tensor& t) {
  const auto nbytes = static_cast<int64_t>(t.storage().nbytes());
  return at::empty({0}, t.options().dtype(at::kByte)).set_(t.storage(), 0, {nbytes}, {1});
}

}  // namespace

// ---- options and stats -------------------------------------------------------------------------

void validate(const OffloadOptions& o) {
  RATION_CHECK(o.tier == "disk" || o.tier == "host" || o.tier == "host+disk", "offload.tier: unknown tier '", o.tier,
               "' (expected disk, host or host+disk)");
  RATION_CHECK(o.t1 >= 0 && o.t2 >= 0 && o.t3 >= 0, "offload.t1/t2/t3: thresholds must be non-negative sizes");
  RATION_CHECK(o.t1 <= o.t2, "offload.t1 (", format_bytes(o.t1), ") must not exceed offload.t2 (",
               o.t2 == kNoLimit ? std::string("none") : format_bytes(o.t2),
               "): forward would pause before anything is copied out");
  RATION_CHECK(o.prefetch >= 0, "offload.prefetch: expected a number of backward nodes >= 0, got ", o.prefetch);
  RATION_CHECK(o.min_bytes >= 0, "offload.min_bytes: expected a size >= 0");
  RATION_CHECK(o.throttle_bytes_per_second >= 0, "offload.throttle: expected bytes per second >= 0");
}

std::unique_ptr<Tier> make_tier(const OffloadOptions& o) {
  validate(o);
  std::string dir = o.dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp && *tmp ? tmp : "/tmp";
  }
  std::unique_ptr<Tier> tier;
  if (o.tier == "disk") tier = std::make_unique<SpillTier>(dir, o.disk_limit_bytes);
  else if (o.tier == "host") tier = std::make_unique<HostTier>(o.host_limit_bytes);
  else tier = std::make_unique<ChainTier>(std::make_unique<HostTier>(o.host_limit_bytes),
                                          std::make_unique<SpillTier>(dir, o.disk_limit_bytes));
  if (o.throttle_bytes_per_second > 0 || o.fail_after_bytes > 0)
    tier = std::make_unique<ThrottledTier>(std::move(tier), o.throttle_bytes_per_second, o.fail_after_bytes);
  return tier;
}

namespace {

// A tier the measuring engine uses without owning it (the caller's engine keeps it).
class BorrowedTier : public Tier {
 public:
  explicit BorrowedTier(Tier& tier) : tier_(tier) {}
  std::string name() const override { return tier_.name(); }
  std::unique_ptr<Slot> write(const at::Tensor& src) override { return tier_.write(src); }
  void read(const Slot& slot, at::Tensor& dst) override { tier_.read(slot, dst); }
  int64_t used_bytes() const override { return tier_.used_bytes(); }
  int64_t free_bytes() const override { return tier_.free_bytes(); }

 private:
  Tier& tier_;
};

// Matrix products on a thread of their own while copies are measured: the contention a step's compute
// puts on cores and memory bandwidth. Stops (and joins) when destroyed.
class ComputeBeside {
 public:
  ComputeBeside()
      : thread_([this] {
          at::Tensor a = at::rand({256, 256}), b = at::rand({256, 256});
          while (!stop_.load()) a = at::mm(a, b).div_(256);
        }) {}
  ~ComputeBeside() {
    stop_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One round trip of `sources` through `engine`, as a step drives it: offloaded after one forward node
// (with that node as their deadline), fetched back from one backward node.
struct RoundTrip {
  double write_ms = 0, read_ms = 0;  // wall: offload calls until every write is done; first read until the last fetch
  double compute_ms = 0;             // the compute thread's CPU time in offload() and fetch() (waits excluded)
  double queue_ms = 0;               // the queues' time in the tier (its fixed cost, for small buffers)
};
RoundTrip round_trip(OffloadEngine& engine, const std::vector<at::Tensor>& sources) {
  auto node = std::make_shared<Node>();
  node->spec.name = "offload_probe";
  node->seq = 1;
  std::vector<std::shared_ptr<SavedValue>> values;
  for (size_t i = 0; i < sources.size(); ++i) {
    values.push_back(std::make_shared<SavedValue>(node, static_cast<int>(i), sources[i].numel()));
    values.back()->save(sources[i]);
  }
  const OffloadStats before = engine.stats();
  RoundTrip r;
  engine.begin_step();
  auto t0 = Clock::now();
  double cpu0 = thread_cpu_ms();
  engine.begin_forward_node(*node, 0);
  for (auto& v : values) engine.offload(v, 0);
  r.compute_ms += thread_cpu_ms() - cpu0;
  engine.end_forward_node(0);  // waits for every write
  r.write_ms = ms_since(t0);
  t0 = Clock::now();
  cpu0 = thread_cpu_ms();
  engine.before_backward_node(0, nullptr);
  std::vector<at::Tensor> back;
  for (auto& v : values) back.push_back(engine.fetch(*v));
  r.read_ms = ms_since(t0);
  r.compute_ms += thread_cpu_ms() - cpu0;
  const OffloadStats after = engine.stats();
  r.queue_ms = (after.write_ms - before.write_ms) + (after.read_ms - before.read_ms);
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!back[i].defined()) throw TierFull("offload tier " + engine.tier().name() + " failed while measured");
    RATION_CHECK(at::equal(back[i], sources[i]), "offload tier ", engine.tier().name(),
                 " returned different bytes than were written (buffer ", i, " of ", sources.size(), ", ",
                 back[i].ne(sources[i]).sum().item<int64_t>(), " of ", sources[i].numel(), " bytes differ; sizes ",
                 back[i].sizes(), " vs ", sources[i].sizes(), ")");
  }
  engine.end_step();
  return r;
}

}  // namespace

OffloadCosts measure_offload_costs(Tier& tier, const OffloadOptions& options, int64_t probe_bytes) {
  OffloadCosts c;
  c.min_bytes = options.min_bytes;
  c.min_prefetch = options.prefetch;
  c.copy_in = CopyInMemory::Pooled;
  // Probe with at most a quarter of the tier's room, so measuring never fills it; a tier with less
  // than a useful probe's room is not offloaded to at all (capacity 0, bandwidths nominal).
  constexpr int64_t kSmallestProbe = 64 << 10;
  constexpr int kBuffers = 4;  // the probe goes as this many saved values, queued back to back
  constexpr int kSmall = 16;   // small copies per round trip, so one preemption does not make the figure
  const int64_t room = tier.free_bytes();
  probe_bytes = std::min(probe_bytes, room / 4) / kBuffers * kBuffers;
  auto unusable = [&] {
    c.capacity_bytes = 0;
    c.write_bytes_per_ms = c.read_bytes_per_ms = 1;
    return c;
  };
  if (probe_bytes < kSmallestProbe) return unusable();
  // What the plan may use: the room less a tenth for file-system overhead and other writers.
  c.capacity_bytes = room == Tier::kUnboundedTier ? room : room - room / 10;
  // Outside the device budget's accounting: these buffers, and the measuring engine's copy-in pool,
  // exist only while measuring. Saved as activations so the engine takes them, as in a step.
  OffloadOptions probe_options = options;
  probe_options.min_bytes = 0;
  probe_options.t1 = 0;
  probe_options.t2 = probe_options.t3 = kNoLimit;
  std::vector<at::Tensor> big, small;
  for (int i = 0; i < kBuffers; ++i) big.push_back(at::randint(0, 256, {probe_bytes / kBuffers}, at::kByte));
  for (int i = 0; i < kSmall; ++i) small.push_back(at::randint(0, 256, {4096}, at::kByte));
  std::vector<double> w, r, s;
  try {
    OffloadEngine engine(std::make_unique<BorrowedTier>(tier), probe_options);
    // The queues' own bandwidth: a step's copies run beside compute, which does not help them.
    engine.set_copy_waits(CopyWaits::Block);
    // Reads into reserved (faulted) pool buffers: in a step, most reads reuse a buffer backward released.
    engine.reserve_copy_in({{probe_bytes / kBuffers, kBuffers}, {4096, kSmall}});
    ComputeBeside compute;
    round_trip(engine, big);  // warm-up
    round_trip(engine, small);
    for (int rep = 0; rep < 3; ++rep) {
      const RoundTrip probe = round_trip(engine, big);
      w.push_back(probe.write_ms);
      r.push_back(probe.read_ms);
      // A small copy's fixed cost: the compute thread's part (queueing, rebuilding views) and the tier's
      // (a file, a system call), each per copy of the two.
      const RoundTrip tiny = round_trip(engine, small);
      s.push_back((tiny.compute_ms + tiny.queue_ms) / (2 * kSmall));
    }
    const OffloadStats st = engine.stats();
    if (st.fallbacks > 0) return unusable();  // the room reported was not there (another writer)
  } catch (const TierFull&) {
    return unusable();
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  c.write_bytes_per_ms = static_cast<double>(probe_bytes) / std::max(med(w), 1e-6);
  c.read_bytes_per_ms = static_cast<double>(probe_bytes) / std::max(med(r), 1e-6);
  c.per_copy_ms = med(s);
  return c;
}

// ---- the copy queues (Q2, Q4) -------------------------------------------------------------------

// A FIFO of copy jobs on a thread of its own. A thread that must wait for a job may run queued jobs
// itself meanwhile (help_until): it would sit idle otherwise, and two threads copy about twice as fast
// as one when compute is not running (a forward pause at a deadline, a fetch in backward).
class OffloadEngine::Queue {
 public:
  Queue() : thread_([this] { run(); }) {}
  ~Queue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Returns the job's place in the queue's order (increasing from 1).
  int64_t submit(std::function<void()> job) {
    int64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = ++submitted_;
      jobs_.push_back({seq, std::move(job)});
    }
    cv_.notify_one();
    return seq;
  }
  // Until `done` is ready: run the queued jobs submitted at or before `seq` (oldest first) on the calling
  // thread, then block. Later jobs are left to the queue's thread (running them could only delay the
  // caller past the moment `done` is ready).
  // Returns how many jobs it ran.
  int64_t help_until(const std::shared_future<void>& done, int64_t seq) {
    int64_t ran = 0;
    while (!ready(done)) {
      std::function<void()> job;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (jobs_.empty() || jobs_.front().seq > seq) break;
        job = std::move(jobs_.front().run);
        jobs_.pop_front();
      }
      g_running_for_queue = true;
      job();
      g_running_for_queue = false;
      ++ran;
    }
    done.wait();
    return ran;
  }

 private:
  struct Job {
    int64_t seq = 0;
    std::function<void()> run;
  };
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stop requested and drained
        job = std::move(jobs_.front().run);
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  int64_t submitted_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// ---- GPU stream order (nothing on CPU) ---------------------------------------------------------------
// A copy on a queue thread must start only after the compute stream produced its source (copy-out) and
// run on the queue's own stream. CopyOrder is captured by the copy job; CopyGuard, held while it copies,
// makes that so. On CPU both are empty and the copy runs at once.

#ifdef RATION_CUDA
struct OffloadEngine::CopyStreams {
  c10::cuda::CUDAStream out, in;
};
namespace {
struct CopyOrder {
  std::shared_ptr<at::cuda::CUDAEvent> produced;  // recorded on the compute stream (copy-out only)
  std::optional<c10::cuda::CUDAStream> stream;
};
class CopyGuard {
 public:
  explicit CopyGuard(const CopyOrder& order) {
    if (!order.stream) return;
    guard_.emplace(*order.stream);
    if (order.produced) order.produced->block(*order.stream);
  }

 private:
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
};
CopyOrder copy_order(std::unique_ptr<OffloadEngine::CopyStreams>& streams, const at::Tensor& t, bool out) {
  CopyOrder order;
  if (!t.is_cuda()) return order;
  if (!streams) {
    const auto index = t.device().index();
    streams.reset(new OffloadEngine::CopyStreams{c10::cuda::getStreamFromPool(false, index),
                                                 c10::cuda::getStreamFromPool(false, index)});
  }
  order.stream = out ? streams->out : streams->in;
  if (out) {
    order.produced = std::make_shared<at::cuda::CUDAEvent>();
    order.produced->record(c10::cuda::getCurrentCUDAStream(t.device().index()));
  }
  return order;
}
}  // namespace
#else
struct OffloadEngine::CopyStreams {};
namespace {
struct CopyOrder {};
struct CopyGuard {
  explicit CopyGuard(const CopyOrder&) {}
};
CopyOrder copy_order(std::unique_ptr<OffloadEngine::CopyStreams>&, const at::Tensor&, bool) { return {}; }
}  // namespace
#endif

// One stored storage and the saved values (views) that will be rebuilt from it.
struct OffloadEngine::Entry {
  // Where the entry is, changed by the compute thread only.
  enum class Phase {
    CopyingOut,  // Q2 copy queued or done; no read yet
    Deferred,    // a prefetch was due but held back (may_prefetch said no); read on demand or later
    CopyingIn,   // Q4 read queued or done
  };
  // What went wrong, set by a queue thread before it fulfils its future (read after waiting on it).
  enum class Fault { None, Write, Read };

  int64_t storage_bytes = 0;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;  // identity of the original while it lives
  struct View {
    uint64_t value_id = 0;
    std::weak_ptr<SavedValue> value;
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    at::TensorOptions options;
    std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> original;  // for the in-place modification check
    uint32_t version = 0;
    bool fetched = false;
  };
  std::vector<View> views;
  // Q2 writes the slot; `written` is ready after, read after.
  std::unique_ptr<Tier::Slot> slot;
  Phase phase = Phase::CopyingOut;
  Fault fault = Fault::None;
  std::string error;
  WhenTierFull when_full = WhenTierFull::Recompute;
  at::Tensor kept;  // a failed write under KeepResident: the storage, still in memory (set by Q2 before `written`)
  std::shared_future<void> written, loaded;
  int64_t out_seq = 0, in_seq = 0;  // the copy jobs' places in Q2 / Q4 (Queue::help_until)
  at::Tensor buffer;    // Q4 destination: the whole storage, or this process's shard
  at::Tensor restored;  // the whole storage, bytes
  int64_t first_use = -1;  // highest forward ordinal of a node that saves it (first in backward)
  int64_t deadline = -1;   // forward ordinal by whose end the write must be done (-1: none, or met)
  // A planned copy's source, held by the compute thread until its deadline: the plan frees the storage
  // at the deadline, so a copy that finishes early (a fast tier, a loaded machine) does not free it
  // sooner and the measured peak is the predicted one whatever the copies' speed.
  at::Tensor held_until_deadline;
  int prefetch = 0;
  int64_t micro_batch = 0;  // the micro-batch that offloaded it (select_micro_batch)
  std::shared_ptr<ReplicaGroup> replicas;  // sharded: this process stores 1/n
  int64_t shard_bytes = 0;
  const void* storage_key = nullptr;                   // its key in by_storage_
  std::list<std::shared_ptr<Entry>>::iterator place;  // its place in entries_

  bool done() const {
    for (const auto& v : views)
      if (!v.fetched && !v.value.expired()) return false;
    return true;
  }
};

// ---- the engine -----------------------------------------------------------------------------------

OffloadEngine::OffloadEngine(std::unique_ptr<Tier> tier, OffloadOptions options)
    : tier_(std::move(tier)), options_(std::move(options)) {
  validate(options_);
  copy_out_ = std::make_unique<Queue>();
  copy_in_ = std::make_unique<Queue>();
}

OffloadEngine::OffloadEngine(const OffloadOptions& options) : OffloadEngine(make_tier(options), options) {}

OffloadEngine::~OffloadEngine() {
  // Drain the queues (their jobs hold entries), then free every stored buffer.
  copy_out_.reset();
  copy_in_.reset();
  entries_.clear();
  by_value_.clear();
  by_storage_.clear();
}

int64_t OffloadEngine::usage() const { return device_current_bytes(device_); }

OffloadStats OffloadEngine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void OffloadEngine::count(int64_t OffloadStats::*counter, int64_t n) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.*counter += n;
}

int64_t OffloadEngine::pending_entries() const { return static_cast<int64_t>(entries_.size()); }

void OffloadEngine::reserve_copy_in(const std::map<int64_t, int64_t>& buffers) {
  pool_plan_ = buffers;
  pool_.reserve(buffers, device_);
}

// ---- the copy-in pool ------------------------------------------------------------------------------

at::Tensor CopyInPool::make(int64_t bytes, const at::Device& device) {
  CategoryGuard cat(Category::SavedActivations);
  at::Tensor buffer = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  // Host memory: fault every page now, not during the first read into it. Device memory has no first-
  // touch faults (and a fill on the compute stream would race the copy-in stream's read).
  if (buffer.is_cpu()) buffer.zero_();
  bytes_ += bytes;
  return buffer;
}

at::Tensor CopyInPool::acquire(int64_t bytes, const at::Device& device) {
  std::vector<at::Tensor>& buffers = by_size_[bytes];
  // Handed out as a tensor of its own over the buffer's storage, so holding it marks the buffer in use.
  for (const at::Tensor& b : buffers)
    if (!in_use(b) && b.device() == device) return b.alias();
  ++misses_;
  buffers.push_back(make(bytes, device));
  return buffers.back().alias();
}

void CopyInPool::reserve(const std::map<int64_t, int64_t>& wanted, const at::Device& device) {
  for (auto& [bytes, buffers] : by_size_) {  // free what the plan does not hold (in-use buffers stay)
    const auto it = wanted.find(bytes);
    auto keep = static_cast<size_t>(it == wanted.end() ? 0 : it->second);
    std::vector<at::Tensor> kept;
    for (at::Tensor& b : buffers) {
      if ((in_use(b) || kept.size() < keep) && b.device() == device) kept.push_back(std::move(b));
      else if (in_use(b)) kept.push_back(std::move(b));
      else bytes_ -= bytes;
    }
    buffers.swap(kept);
  }
  for (const auto& [bytes, n] : wanted) {
    std::vector<at::Tensor>& buffers = by_size_[bytes];
    while (static_cast<int64_t>(buffers.size()) < n) buffers.push_back(make(bytes, device));
  }
}

bool OffloadEngine::offloadable(const SavedValue& v) const {
  if (v.pinned() || v.state() != SavedState::Resident) return false;
  const at::Tensor& t = v.data();
  if (!t.defined() || !t.has_storage()) return false;
  if (static_cast<int64_t>(t.storage().nbytes()) < std::max<int64_t>(options_.min_bytes, 1)) return false;
  // On CPU only saved activations: a view of a parameter frees nothing when copied out.
  if (t.is_cpu() && category_of(t) != Category::SavedActivations) return false;
  return true;
}

void OffloadEngine::forget(const std::shared_ptr<Entry>& e) {
  for (const auto& v : e->views) {
    auto it = by_value_.find(v.value_id);
    if (it != by_value_.end() && it->second.entry == e) by_value_.erase(it);
  }
  if (auto it = by_storage_.find(e->storage_key); it != by_storage_.end() && it->second == e) by_storage_.erase(it);
  entries_.erase(e->place);
}

void OffloadEngine::sweep() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    std::shared_ptr<Entry> e = *it++;  // forget() erases e's place
    if (!e->done()) continue;
    if (e->written.valid()) e->written.wait();
    if (e->loaded.valid()) e->loaded.wait();
    forget(e);
  }
}

void OffloadEngine::begin_step() {
  forward_ordinal_ = -1;
  micro_batch_ = 0;
  sweep();
}

void OffloadEngine::select_micro_batch(int64_t index) {
  micro_batch_ = index;
  forward_ordinal_ = -1;
  pool_.reserve(pool_plan_ ? *pool_plan_ : std::map<int64_t, int64_t>{}, device_);
}

void OffloadEngine::end_step() {
  sweep();
  // What backward made beyond the reservation goes now: forward never holds idle copy-in buffers (a
  // plan's simulator counts them until here; the threshold loop never peaks above not offloading).
  pool_.reserve(pool_plan_ ? *pool_plan_ : std::map<int64_t, int64_t>{}, device_);
}

void OffloadEngine::begin_forward_node(const Node& node, int64_t ordinal) {
  forward_ordinal_ = ordinal;
  for (const auto& ref : node.saved) {
    auto it = by_value_.find(ref.value->id());
    if (it != by_value_.end()) it->second.entry->first_use = std::max(it->second.entry->first_use, ordinal);
  }
}

void OffloadEngine::use_device(const at::Device& device) {
  if (device == device_) return;
  device_ = device;
  if (pool_plan_) pool_.reserve(*pool_plan_, device_);  // the plan's pool, on the values' device
}

bool OffloadEngine::offload(const std::shared_ptr<SavedValue>& handle, int64_t deadline, int prefetch,
                            WhenTierFull when_full) {
  SavedValue& value = *handle;
  if (!offloadable(value)) return false;
  if (when_full == WhenTierFull::KeepResident && tier_was_full_.load()) return false;
  const at::Tensor t = value.data();
  use_device(t.device());
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  std::shared_ptr<Entry> e;
  if (auto it = by_storage_.find(impl); it != by_storage_.end() && !it->second->storage->expired() &&
                                        it->second->phase != Entry::Phase::CopyingIn) {
    e = it->second;  // another view of a storage already on its way out
  } else {
    e = std::make_shared<Entry>();
    e->storage_bytes = static_cast<int64_t>(t.storage().nbytes());
    e->storage = t.storage().getWeakStorageImpl();
    e->prefetch = prefetch >= 0 ? prefetch : options_.prefetch;
    e->micro_batch = micro_batch_;
    e->when_full = when_full;
    e->replicas = value.replicas() && value.replicas()->size() > 1 ? value.replicas() : nullptr;
    at::Tensor source = storage_bytes_of(t);
    if (e->replicas) {
      const int64_t n = e->replicas->size();
      e->shard_bytes = (e->storage_bytes + n - 1) / n;
      const int64_t begin = std::min(e->storage_bytes, e->replicas->rank() * e->shard_bytes);
      const int64_t len = std::min(e->shard_bytes, e->storage_bytes - begin);
      CategoryGuard cat(Category::SavedActivations);
      at::Tensor shard = at::zeros({e->shard_bytes}, source.options());
      if (len > 0) shard.narrow(0, 0, len).copy_(source.narrow(0, begin, len));
      source = shard;
    }
    auto promise = std::make_shared<std::promise<void>>();
    e->written = promise->get_future().share();
    const int64_t bytes = source.numel();
    e->out_seq = copy_out_->submit([this, e, source, promise, bytes, order = copy_order(streams_, t, /*out=*/true)]() mutable {
      TraceRegion span(copy_track(Direction::Out), "copy", [&] { return "write " + format_bytes(bytes); });
      const auto t0 = Clock::now();
      try {
        CopyGuard on_copy_stream(order);  // Q2 starts after Q1 produced the value
        e->slot = tier_->write(source);
      } catch (const std::exception& x) {
        e->fault = Entry::Fault::Write;
        e->error = x.what();
        tier_was_full_.store(true);
        if (e->when_full == WhenTierFull::KeepResident && !e->replicas) e->kept = source;  // stays in memory
      }
      source = at::Tensor();  // the device copy is no longer ours to hold: usage falls here
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.write_ms += ms_since(t0);
        if (e->fault == Entry::Fault::None) stats_.written_bytes += bytes;
      }
      promise->set_value();
    });
    by_storage_[impl] = e;
    e->storage_key = impl;
    e->place = entries_.insert(entries_.end(), e);
    count(&OffloadStats::offloaded_storages);
  }
  if (deadline >= 0) {
    e->deadline = e->deadline < 0 ? deadline : std::min(e->deadline, deadline);
    if (!e->replicas && !e->held_until_deadline.defined()) e->held_until_deadline = storage_bytes_of(t);
  }
  Entry::View view;
  view.value_id = value.id();
  view.value = handle;
  view.sizes = t.sizes().vec();
  view.strides = t.strides().vec();
  view.offset = t.storage_offset();
  view.options = t.options();
  view.original = c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr());
  view.version = t._version();
  e->first_use = std::max<int64_t>(e->first_use, forward_ordinal_);
  by_value_[value.id()] = ViewRef{e, e->views.size()};
  e->views.push_back(std::move(view));
  value.mark_offloaded();
  count(&OffloadStats::offloaded_values);
  return true;
}

void OffloadEngine::wait_written(Entry& e) {
  if (ready(e.written)) return;
  const auto t0 = Clock::now();
  int64_t ran = 0;
  if (copy_waits_ == CopyWaits::RunQueuedCopies) ran = copy_out_->help_until(e.written, e.out_seq);
  else e.written.wait();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.forward_pause_ms += ms_since(t0);
  stats_.copies_by_waiter += ran;
}

void OffloadEngine::end_forward_node(int64_t ordinal) {
  std::vector<Entry*> late;  // due now, not yet written
  std::vector<Entry*> due;
  for (auto& e : entries_) {
    if (e->micro_batch != micro_batch_ || e->deadline < 0 || e->deadline > ordinal) continue;
    e->deadline = -1;  // met (now or below)
    due.push_back(e.get());
    if (!ready(e->written)) late.push_back(e.get());
  }
  if (!late.empty()) {
    count(&OffloadStats::deadline_waits, static_cast<int64_t>(late.size()));
    TraceRegion stall("stalls", "stall", "deadline: wait for copy-out");
    // The latest first: waiting for it runs every queued copy due now on this thread too; the earlier
    // ones are then done or on the queue's thread.
    std::stable_sort(late.begin(), late.end(), [](const Entry* a, const Entry* b) { return a->out_seq > b->out_seq; });
    for (Entry* e : late) wait_written(*e);
  }
  for (Entry* e : due) e->held_until_deadline = at::Tensor();  // freed where the plan frees it
  const int64_t now = usage();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.max_usage_bytes = std::max(stats_.max_usage_bytes, now);
}

bool OffloadEngine::wait_oldest_copy_out() {
  for (auto& e : entries_) {
    if (ready(e->written)) continue;
    count(&OffloadStats::forward_pauses);
    TraceRegion stall("stalls", "stall", "T2 pause: wait for copy-out");
    wait_written(*e);
    return true;
  }
  return false;
}

void OffloadEngine::issue_read(const std::shared_ptr<Entry>& e, bool demand) {
  e->phase = Entry::Phase::CopyingIn;
  if (ready(e->written) && e->fault == Entry::Fault::Write) {  // nothing to read back: no buffer
    std::promise<void> nothing;
    nothing.set_value();
    e->loaded = nothing.get_future().share();
    return;
  }
  if (e->replicas) {  // a shard: the all-gather makes the whole storage anew, so no pool buffer
    CategoryGuard cat(Category::SavedActivations);
    e->buffer = at::empty({e->shard_bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
  } else {
    const int64_t misses = pool_.misses();
    e->buffer = pool_.acquire(e->storage_bytes, device_);
    count(pool_.misses() > misses ? &OffloadStats::pool_misses : &OffloadStats::pool_reads);
  }
  auto promise = std::make_shared<std::promise<void>>();
  e->loaded = promise->get_future().share();
  e->in_seq = copy_in_->submit([this, e, promise, dst = e->buffer, order = copy_order(streams_, e->buffer, /*out=*/false)]() mutable {
    e->written.wait();  // Q4 reads only what Q2 finished writing
    TraceRegion span(copy_track(Direction::In), "copy", [&] { return "read " + format_bytes(dst.numel()); });
    const auto t0 = Clock::now();
    if (e->fault == Entry::Fault::None) {
      try {
        CopyGuard on_copy_stream(order);
        tier_->read(*e->slot, dst);
      } catch (const std::exception& x) {
        e->fault = Entry::Fault::Read;
        e->error = x.what();
      }
    }
    dst = at::Tensor();
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.read_ms += ms_since(t0);
      if (e->fault == Entry::Fault::None) stats_.read_bytes += e->replicas ? e->shard_bytes : e->storage_bytes;
    }
    promise->set_value();
  });
  count(demand ? &OffloadStats::demand_fetches : &OffloadStats::prefetches);
}

void OffloadEngine::before_backward_node(int64_t pos, const std::function<bool(int64_t bytes)>& may_prefetch) {
  if (pos < 0) return;  // a node outside the step (nothing of this step is due)
  std::vector<std::shared_ptr<Entry>> due;
  for (auto& e : entries_)
    if (e->micro_batch == micro_batch_ && e->phase != Entry::Phase::CopyingIn && e->first_use >= pos - e->prefetch)
      due.push_back(e);
  // Soonest needed first: the copy-in queue is FIFO.
  std::stable_sort(due.begin(), due.end(), [](const auto& a, const auto& b) { return a->first_use > b->first_use; });
  for (auto& e : due) {
    const bool demand = e->first_use >= pos;
    if (!demand && may_prefetch && !may_prefetch(e->storage_bytes)) {
      if (e->phase != Entry::Phase::Deferred) {
        e->phase = Entry::Phase::Deferred;
        count(&OffloadStats::deferred_prefetches);
        trace_instant("stalls", "stall", [&] { return "T3 hold: prefetch of " + format_bytes(e->storage_bytes); });
      }
      continue;
    }
    issue_read(e, demand);
  }
}

at::Tensor OffloadEngine::fetch(SavedValue& value) {
  auto found = by_value_.find(value.id());
  RATION_CHECK(found != by_value_.end(), "offloaded value ", value.label(),
               " is unknown to this offload engine (was it offloaded under another OffloadScope?)");
  std::shared_ptr<Entry> e = found->second.entry;
  Entry::View* const view = &e->views[found->second.view];
  RATION_ASSERT(view->value_id == value.id(), "offload entry lost the view of ", value.label());
  if (e->phase != Entry::Phase::CopyingIn) issue_read(e, /*demand=*/true);
  if (!ready(e->loaded)) {
    TraceRegion stall("stalls", "stall", "wait for copy-in");
    const auto t0 = Clock::now();
    int64_t ran = 0;
    if (copy_waits_ == CopyWaits::RunQueuedCopies) ran = copy_in_->help_until(e->loaded, e->in_seq);
    else e->loaded.wait();
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.copies_by_waiter += ran;
    stats_.fetch_wait_ms += ms_since(t0);
  }
  view->fetched = true;
  at::Tensor result;
  if (e->kept.defined()) {  // a failed write under KeepResident: the storage never left memory
    e->restored = e->kept;
    e->kept = at::Tensor();
    e->buffer = at::Tensor();
    count(&OffloadStats::fallbacks);
  }
  if (e->fault != Entry::Fault::None && !e->restored.defined()) {
    e->buffer = at::Tensor();  // a read issued before the write failed: its buffer is of no use
    RATION_CHECK(!e->replicas, "sharded offload of ", value.label(), " failed on this process: ", e->error,
                 " (sharded values cannot fall back to recompute alone: the other processes wait in all-gather)");
    static bool warned = false;
    if (!warned) {
      warned = true;
      std::fprintf(stderr, "ration: offload tier failed (%s); recomputing the affected values instead\n",
                   e->error.c_str());
    }
    count(&OffloadStats::fallbacks);
    value.offload_failed();  // Dropped: the caller's recompute path rebuilds it
  } else {
    if (!e->restored.defined()) {
      if (e->replicas) {
        at::Tensor full = e->replicas->all_gather(e->buffer);  // collective: same order on every process
        e->restored = full.narrow(0, 0, e->storage_bytes);
      } else {
        e->restored = e->buffer;
      }
      retag(e->restored, Category::SavedActivations);
      e->buffer = at::Tensor();
    }
    if (auto original = view->original ? view->original->lock() : c10::intrusive_ptr<c10::TensorImpl>()) {
      RATION_CHECK(original->version_counter().current_version() == view->version, "a tensor saved for backward (",
                   value.label(), ") was modified in place after it was saved and offloaded. Use an out-of-place "
                   "op or clone before modifying.");
    }
    result = at::empty({0}, view->options).set_(e->restored.storage(), view->offset, view->sizes, view->strides);
    // set_ counts as an in-place change; the rebuilt tensor carries the version it was saved with.
    result.unsafeGetTensorImpl()->set_version_counter(c10::VariableVersion(view->version));
  }
  by_value_.erase(found);
  if (e->done()) {  // every view rebuilt: free the stored buffer (a spill file disappears here)
    e->slot.reset();
    e->restored = at::Tensor();
    e->buffer = at::Tensor();
    forget(e);
  }
  return result;
}

// ---- the threshold loop --------------------------------------------------------------------------

namespace {
bool replicated(const SavedValue& v) { return v.replicas() && v.replicas()->size() > 1; }
}  // namespace

void ThresholdPolicy::after_forward_node(Node& node, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&) {
  const OffloadOptions& o = engine_.options();
  for (const auto& ref : node.saved) {
    if (ref.value->state() != SavedState::Resident) continue;
    if (const at::Tensor t = ref.value->data(); t.defined()) {
      engine_.use_device(t.device());  // T1 compares the memory of the device the values live on
      break;
    }
  }
  const bool over_t1 = engine_.usage() > o.t1;  // T1: copy out
  for (auto& ref : node.saved) {
    // Refuses what cannot go. A value that does not fit stays resident and offloading stops, so a full
    // tier never peaks above not offloading; replicated values keep the plan's rule on every process
    // alike (all of them take part in the all-gather).
    const WhenTierFull when_full = replicated(*ref.value) ? WhenTierFull::Recompute : WhenTierFull::KeepResident;
    if (over_t1 || replicated(*ref.value)) engine_.offload(ref.value, -1, -1, when_full);
  }
  // T2: forward pauses while usage exceeds it and copies are in flight (oldest first).
  while (engine_.usage() > o.t2 && engine_.wait_oldest_copy_out()) {
  }
}

bool ThresholdPolicy::may_prefetch(int64_t bytes) { return engine_.usage() + bytes <= engine_.options().t3; }

}  // namespace ration::memory
