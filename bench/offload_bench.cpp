// offload_bench.cpp — what offload (seed method M2) costs on CPU, in two parts run in one invocation.
//
// 1. Copy throughput of the spill tier next to the raw bandwidth of the same directory, measured in the
//    same run. For each buffer size the same bytes (separate buffers adding up to --total-mib) go out
//    and come back through:
//      raw         plain POSIX: a fresh anonymous file per buffer (O_TMPFILE, as the tier makes them),
//                  write(), later pread() into a preallocated buffer, close(); no fsync
//      tier        memory::SpillTier::write() / read() into the same preallocated buffers, slot freed
//      engine      an OffloadEngine's copy queues (Q2 out, Q4 in), asynchronously: every buffer is
//                  submitted as a saved value, then forward waits once for all writes (and, waiting,
//                  runs queued copies itself: CopyWaits::RunQueuedCopies, the engine's default); backward
//                  issues every read at once and fetches each. One engine per buffer size for all passes,
//                  its copy-in pool reserved for these buffers (reserve_copy_in: made and faulted once),
//                  so reads land in memory the previous pass released
//      engine queue-only  the same engine settings, the waits only blocking (CopyWaits::Block): the
//                  queues' threads alone, what copies get beside compute
//      engine cold the same with the pool a training step has: none reserved, so this pass (which
//                  holds every value at once, nothing released to reuse) makes a buffer per read
//      raw new-dst raw, reading into buffers allocated just before each read (first-touch page faults)
//      raw+fsync   raw with fsync() after each file's write (reads then come from the page cache)
//      raw O_DIRECT  raw with O_DIRECT on 4 KiB-aligned buffers: the virtio disk itself, both ways
//    A "read" phase is read back + free the file, the same for every mode. After one unrecorded warm-up
//    pass, each repetition runs the modes in a different order (rotated, reversed every other pass),
//    each after a sync(); every mode frees its files, so each starts from the same page-cache state.
//    MB/s (10^6 B/s) are medians over the repetitions, wall time.
// 2. Step overhead vs peak saved on a model (default configs/gpt.toml): the plain engine step (no
//    policy) vs threshold offload (a StepRuntime with offload enabled, disk tier) at T1 settings that offload none, about a quarter, half
//    and all saved activations (min_bytes 64 KiB), each with prefetch 0 and 2. Plain and offload steps
//    alternate (and swap order every step) with the same RNG seed; the program checks that every
//    offload step's gradients equal the plain step's bitwise and exits 1 otherwise.
//    Peak: counting allocator, bytes above the pre-step baseline (max and median over steps). Time:
//    median wall and process-CPU ms; overhead: median over steps of offload/plain of the adjacent pair.
//
// usage: bench_offload [--dir DIR] [--steps N] [--reps R] [--total-mib M] [--out FILE.json]
//                      [--no-throughput] [--no-step] [CONFIG.toml] [--set k=v ...]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_setup.h"
#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/core/saved_value.h"
#include "ration/offload/tier.h"
#include "ration/runtime/budget.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

using namespace ration;

namespace {
using bench::median;
using bench::cpu_ms_now;
using bench::ms_since;

using Clock = std::chrono::steady_clock;

std::string mib(int64_t bytes) { return memory::format_bytes(bytes); }

// ---- part 1: raw POSIX I/O --------------------------------------------------------------------------

// A fresh file in `dir` that vanishes on close: O_TMPFILE (what SpillTier uses), or a name unlinked at once.
int open_fresh(const std::string& dir, int extra_flags) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | extra_flags, 0600);
  if (fd >= 0) return fd;
  std::string name = dir + "/bench-offload-XXXXXX";
  fd = ::mkostemp(name.data(), O_CLOEXEC | extra_flags);
  RATION_CHECK(fd >= 0, "--dir '", dir, "': cannot create a file there: ", std::strerror(errno));
  ::unlink(name.c_str());
  return fd;
}

void write_all(int fd, const char* p, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, static_cast<size_t>(n - done));
    if (w < 0 && errno == EINTR) continue;
    RATION_CHECK(w > 0, "write failed after ", done, " of ", n, " bytes: ", std::strerror(errno));
    done += w;
  }
}

void pread_all(int fd, char* p, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, static_cast<size_t>(n - done), done);
    if (r < 0 && errno == EINTR) continue;
    RATION_CHECK(r > 0, "pread failed after ", done, " of ", n, " bytes: ",
                 r == 0 ? "unexpected end of file" : std::strerror(errno));
    done += r;
  }
}

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<char, FreeDeleter>;

AlignedBytes aligned_bytes(int64_t n) {
  void* p = nullptr;
  RATION_CHECK(::posix_memalign(&p, 4096, static_cast<size_t>(n)) == 0, "cannot allocate ", mib(n), " aligned");
  return AlignedBytes(static_cast<char*>(p));
}

// One buffer size: `count` separate source buffers (separate storages, so the engine stores each on its
// own) and as many preallocated, touched destinations.
struct BufferSet {
  int64_t size = 0, count = 0;
  std::vector<at::Tensor> src, dst;  // (size,) uint8 each
  AlignedBytes src_aligned, dst_aligned;  // count * size, for O_DIRECT
};

struct Phase {
  double write_ms = 0, read_ms = 0, write_cpu_ms = 0, read_cpu_ms = 0;
  double queue_write_ms = 0, queue_read_ms = 0;  // engine only: time its queues spent copying
  int64_t pool_misses = 0;                         // engine only: reads that had to make a pool buffer
  int64_t copies_by_waiter = 0;                    // engine only: copies the waiting thread ran itself
  bool equal = true;
};

// `fresh_dst`: read into buffers allocated (untouched) just before each read, as the engine does.
Phase run_raw(BufferSet& b, const std::string& dir, bool fsync_each, bool direct, bool fresh_dst = false) {
  Phase ph;
  std::vector<int> fds;
  fds.reserve(static_cast<size_t>(b.count));
  auto t0 = Clock::now();
  double c0 = cpu_ms_now();
  for (int64_t i = 0; i < b.count; ++i) {
    const int fd = open_fresh(dir, direct ? O_DIRECT : 0);
    const char* p = direct ? b.src_aligned.get() + i * b.size : static_cast<const char*>(b.src[i].data_ptr());
    write_all(fd, p, b.size);
    if (fsync_each) RATION_CHECK(::fsync(fd) == 0, "fsync: ", std::strerror(errno));
    fds.push_back(fd);
  }
  ph.write_ms = ms_since(t0);
  ph.write_cpu_ms = cpu_ms_now() - c0;
  std::vector<at::Tensor> fresh(fresh_dst ? static_cast<size_t>(b.count) : 0);
  t0 = Clock::now();
  c0 = cpu_ms_now();
  for (int64_t i = 0; i < b.count; ++i) {
    if (fresh_dst) fresh[static_cast<size_t>(i)] = at::empty({b.size}, at::kByte);
    char* p = direct      ? b.dst_aligned.get() + i * b.size
              : fresh_dst ? static_cast<char*>(fresh[static_cast<size_t>(i)].data_ptr())
                          : static_cast<char*>(b.dst[i].data_ptr());
    pread_all(fds[static_cast<size_t>(i)], p, b.size);
    ::close(fds[static_cast<size_t>(i)]);
  }
  ph.read_ms = ms_since(t0);
  ph.read_cpu_ms = cpu_ms_now() - c0;
  if (fresh_dst) {
    for (int64_t i = 0; i < b.count && ph.equal; ++i) ph.equal = at::equal(b.src[i], fresh[static_cast<size_t>(i)]);
  } else if (direct) {
    ph.equal = std::memcmp(b.src_aligned.get(), b.dst_aligned.get(), static_cast<size_t>(b.count * b.size)) == 0;
  } else {
    for (int64_t i = 0; i < b.count && ph.equal; ++i) ph.equal = at::equal(b.src[i], b.dst[i]);
    for (auto& d : b.dst) d.zero_();  // the next mode must really fill them
  }
  return ph;
}

Phase run_tier(BufferSet& b, const std::string& dir) {
  Phase ph;
  memory::SpillTier tier(dir);
  std::vector<std::unique_ptr<memory::Tier::Slot>> slots;
  slots.reserve(static_cast<size_t>(b.count));
  auto t0 = Clock::now();
  double c0 = cpu_ms_now();
  for (int64_t i = 0; i < b.count; ++i) slots.push_back(tier.write(b.src[i]));
  ph.write_ms = ms_since(t0);
  ph.write_cpu_ms = cpu_ms_now() - c0;
  t0 = Clock::now();
  c0 = cpu_ms_now();
  for (int64_t i = 0; i < b.count; ++i) {
    tier.read(*slots[static_cast<size_t>(i)], b.dst[i]);
    slots[static_cast<size_t>(i)].reset();  // closes the anonymous file: its blocks are freed
  }
  ph.read_ms = ms_since(t0);
  ph.read_cpu_ms = cpu_ms_now() - c0;
  for (int64_t i = 0; i < b.count && ph.equal; ++i) ph.equal = at::equal(b.src[i], b.dst[i]);
  for (auto& d : b.dst) d.zero_();
  return ph;
}

// Through the engine's public API, as a forward/backward would drive it: one producer node saving
// `count` values, all offloaded with that node as their deadline (end_forward_node waits for every
// write), then one backward node whose prefetch window issues every read at once, then a fetch each.
memory::OffloadOptions engine_options(const std::string& dir) {
  memory::OffloadOptions o;
  o.tier = "disk";
  o.dir = dir;
  o.min_bytes = 0;
  o.prefetch = 0;
  return o;
}

Phase run_engine(BufferSet& b, memory::OffloadEngine& engine) {
  Phase ph;
  const memory::OffloadStats before = engine.stats();
  auto node = std::make_shared<Node>();
  node->spec.name = "bench_buffer";
  node->seq = 1;
  std::vector<std::shared_ptr<SavedValue>> values;
  for (int64_t i = 0; i < b.count; ++i) {
    values.push_back(std::make_shared<SavedValue>(node, static_cast<int>(i), b.size));
    values.back()->save(b.src[i]);  // tags it as a saved activation, as a forward op would
  }
  std::vector<at::Tensor> back(static_cast<size_t>(b.count));
  auto t0 = Clock::now();
  double c0 = cpu_ms_now();
  const int64_t ordinal = 0;  // the step's only node
  engine.begin_step();
  engine.begin_forward_node(*node, ordinal);
  for (auto& v : values) RATION_CHECK(engine.offload(v, ordinal), "the engine refused to offload ", v->label());
  engine.end_forward_node(ordinal);  // waits for every copy due by this node: all of them
  ph.write_ms = ms_since(t0);
  ph.write_cpu_ms = cpu_ms_now() - c0;
  t0 = Clock::now();
  c0 = cpu_ms_now();
  engine.before_backward_node(ordinal, nullptr);  // every value is needed by this node: all reads issued now
  for (int64_t i = 0; i < b.count; ++i) back[static_cast<size_t>(i)] = engine.fetch(*values[static_cast<size_t>(i)]);
  ph.read_ms = ms_since(t0);
  ph.read_cpu_ms = cpu_ms_now() - c0;
  engine.end_step();
  memory::OffloadStats s = engine.stats();
  s.write_ms -= before.write_ms;
  s.read_ms -= before.read_ms;
  s.written_bytes -= before.written_bytes;
  s.read_bytes -= before.read_bytes;
  s.fallbacks -= before.fallbacks;
  ph.queue_write_ms = s.write_ms;
  ph.queue_read_ms = s.read_ms;
  ph.pool_misses = s.pool_misses - before.pool_misses;
  ph.copies_by_waiter = s.copies_by_waiter - before.copies_by_waiter;
  RATION_CHECK(s.written_bytes == b.count * b.size && s.read_bytes == b.count * b.size && s.fallbacks == 0,
               "engine moved ", s.written_bytes, " / ", s.read_bytes, " bytes of ", b.count * b.size, " (", s.fallbacks,
               " fallbacks)");
  for (int64_t i = 0; i < b.count && ph.equal; ++i) ph.equal = at::equal(b.src[i], back[static_cast<size_t>(i)]);
  return ph;
}

// ---- part 2: training steps ---------------------------------------------------------------------------

struct StepOut {
  double wall_ms = 0, cpu_ms = 0;
  int64_t peak_above = 0;      // counting allocator, above the pre-step baseline
  int64_t forward_above = 0;   // usage above baseline when forward finished
  memory::OffloadStats stats;
  std::vector<at::Tensor> grads;
};

// `t1_above`: T1 relative to this step's baseline (so grads kept between steps do not move it);
// kNoLimit offloads nothing, 0 everything.
StepOut step_once(models::Model& model, const data::Batch& batch, const memory::OffloadOptions* options,
                  int64_t t1_above, uint64_t seed) {
  train::MemorySettings settings;
  if (options) {
    const int64_t base = memory::device_current_bytes(memory::stats());  // the step's baseline
    settings.offload.enabled = true;
    settings.offload.options = *options;
    settings.offload.options.t1 = t1_above >= memory::kNoLimit - base ? memory::kNoLimit : base + t1_above;
  }
  train::StepRuntime runtime(settings);
  train::StepStats st = runtime.measure_step(model, batch, train::StepOptions::collecting(seed));
  StepOut r;
  r.wall_ms = st.ms;
  r.cpu_ms = st.cpu_ms;
  r.peak_above = st.peak_above_baseline();
  r.forward_above = st.forward_end_bytes - st.baseline_bytes;
  r.stats = st.offload;
  for (auto& [name, g] : st.gradients) r.grads.push_back(std::move(g));
  return r;
}

// The first parameter whose gradient differs bitwise, or -1.
int first_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return static_cast<int>(i);
    if (a[i].defined() && !at::equal(a[i], b[i])) return static_cast<int>(i);
  }
  return -1;
}

struct Point {
  std::string label;
  double target_fraction = 0;  // of all offloadable bytes
  int64_t t1_above = 0;
  int prefetch = 0;
  std::vector<double> wall, cpu, plain_wall, plain_cpu, peaks;
  int64_t peak_above = 0, plain_peak_above = 0;
  std::vector<memory::OffloadStats> stats;
  bool bitwise_equal = true;
};

double stat_median(const std::vector<memory::OffloadStats>& v, const std::function<double(const memory::OffloadStats&)>& f) {
  std::vector<double> xs;
  for (const auto& s : v) xs.push_back(f(s));
  return median(xs);
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  int steps = 5, reps = 3;
  int64_t total_mib = 512;
  bool do_throughput = true, do_step = true;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = tmp && *tmp ? tmp : "/tmp";
  std::string out = "bench/results/offload.json", config = "configs/gpt.toml";
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--total-mib" && i + 1 < argc) total_mib = std::stoll(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else if (a == "--no-throughput") do_throughput = false;
    else if (a == "--no-step") do_step = false;
    else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "bench_offload: unknown flag %s\n", a.c_str());
      return 2;
    } else config = a;
  }
  bool all_ok = true;
  nlohmann::json result{{"benchmark", "offload"}, {"dir", dir}};

  // ---- part 1 ----
  if (do_throughput) {
    const int64_t total = total_mib << 20;
    const std::vector<int64_t> sizes = {int64_t{256} << 10, int64_t{4} << 20, int64_t{64} << 20};
    const std::vector<std::string> modes = {"raw",         "tier",      "engine",       "engine queue-only", "engine cold",
                                            "raw new-dst", "raw+fsync", "raw O_DIRECT"};
    std::printf("spill directory %s; %s per buffer size; %d repetitions (rotated order), medians; MB/s = 1e6 B/s\n",
                dir.c_str(), mib(total).c_str(), reps);
    at::manual_seed(0);
    const at::Tensor pattern = at::randint(0, 256, {total}, at::kByte);  // (total,) the bytes every mode moves
    nlohmann::json rows = nlohmann::json::array();
    std::printf("\n%-9s %-17s %6s %11s %11s %10s %10s %9s %9s\n", "buffer", "mode", "files", "write MB/s", "read MB/s",
                "write/raw", "read/raw", "wr cpu ms", "rd cpu ms");
    for (const int64_t size : sizes) {
      BufferSet b;
      b.size = size;
      b.count = std::max<int64_t>(1, total / size);
      for (int64_t i = 0; i < b.count; ++i) {
        b.src.push_back(pattern.narrow(0, i * size, size).clone());
        b.dst.push_back(at::zeros({size}, at::kByte));
      }
      b.src_aligned = aligned_bytes(b.count * size);
      b.dst_aligned = aligned_bytes(b.count * size);
      std::memcpy(b.src_aligned.get(), pattern.data_ptr(), static_cast<size_t>(b.count * size));
      std::memset(b.dst_aligned.get(), 0, static_cast<size_t>(b.count * size));
      std::vector<std::vector<Phase>> by_mode(modes.size());
      auto engine = std::make_unique<memory::OffloadEngine>(engine_options(dir));  // every pass of this size
      engine->reserve_copy_in({{size, b.count}});
      auto queue_only = std::make_unique<memory::OffloadEngine>(engine_options(dir));
      queue_only->reserve_copy_in({{size, b.count}});
      queue_only->set_copy_waits(memory::CopyWaits::Block);
      for (int r = -1; r < reps; ++r) {  // r = -1: warm-up pass, not recorded
        for (size_t k = 0; k < modes.size(); ++k) {
          // Rotated, and reversed every other pass, so no mode always follows the same one.
          const size_t n = modes.size(), j = (k + static_cast<size_t>(r + 1)) % n;
          const size_t m = r % 2 ? n - 1 - j : j;
          // Let the disk settle: fsync'd and O_DIRECT files freed by the previous mode are discarded at
          // the next journal commit (the filesystem is mounted with discard), which would land on this mode.
          ::sync();
          Phase ph;
          if (modes[m] == "raw") ph = run_raw(b, dir, false, false);
          else if (modes[m] == "tier") ph = run_tier(b, dir);
          else if (modes[m] == "engine") ph = run_engine(b, *engine);
          else if (modes[m] == "engine queue-only") ph = run_engine(b, *queue_only);
          else if (modes[m] == "engine cold") {
            memory::OffloadEngine cold(engine_options(dir));
            ph = run_engine(b, cold);
          }
          else if (modes[m] == "raw new-dst") ph = run_raw(b, dir, false, false, /*fresh_dst=*/true);
          else if (modes[m] == "raw+fsync") ph = run_raw(b, dir, true, false);
          else ph = run_raw(b, dir, false, true);
          if (!ph.equal) {
            std::printf("FAIL: %s, %s buffers: bytes read back differ from those written\n", modes[m].c_str(),
                        mib(size).c_str());
            all_ok = false;
          }
          if (r >= 0) by_mode[m].push_back(ph);
        }
      }
      const double bytes = static_cast<double>(b.count * size);
      auto mbps = [&](const std::vector<Phase>& v, double Phase::*field) {
        std::vector<double> xs;
        for (const auto& p : v) xs.push_back(bytes / 1e6 / ((p.*field) / 1e3));
        return median(xs);
      };
      auto med = [&](const std::vector<Phase>& v, double Phase::*field) {
        std::vector<double> xs;
        for (const auto& p : v) xs.push_back(p.*field);
        return median(xs);
      };
      const double raw_w = mbps(by_mode[0], &Phase::write_ms), raw_r = mbps(by_mode[0], &Phase::read_ms);
      for (size_t m = 0; m < modes.size(); ++m) {
        const double w = mbps(by_mode[m], &Phase::write_ms), rd = mbps(by_mode[m], &Phase::read_ms);
        std::printf("%-9s %-17s %6lld %11.0f %11.0f %10.2f %10.2f %9.1f %9.1f\n", mib(size).c_str(), modes[m].c_str(),
                    static_cast<long long>(b.count), w, rd, w / raw_w, rd / raw_r, med(by_mode[m], &Phase::write_cpu_ms),
                    med(by_mode[m], &Phase::read_cpu_ms));
        nlohmann::json row{{"buffer_bytes", size},
                           {"buffers", b.count},
                           {"mode", modes[m]},
                           {"write_mb_per_s_median", w},
                           {"read_mb_per_s_median", rd},
                           {"write_vs_raw", w / raw_w},
                           {"read_vs_raw", rd / raw_r},
                           {"write_ms", nlohmann::json::array()},
                           {"read_ms", nlohmann::json::array()},
                           {"write_cpu_ms_median", med(by_mode[m], &Phase::write_cpu_ms)},
                           {"read_cpu_ms_median", med(by_mode[m], &Phase::read_cpu_ms)}};
        for (const auto& p : by_mode[m]) {
          row["write_ms"].push_back(p.write_ms);
          row["read_ms"].push_back(p.read_ms);
        }
        if (modes[m].rfind("engine", 0) == 0) {
          row["queue_write_ms_median"] = med(by_mode[m], &Phase::queue_write_ms);
          row["queue_read_ms_median"] = med(by_mode[m], &Phase::queue_read_ms);
          int64_t misses = 0;
          for (const auto& p : by_mode[m]) misses += p.pool_misses;
          row["copy_in_pool_misses"] = misses;  // engine: 0 once the warm-up pass made the pool
          int64_t by_waiter = 0;
          for (const auto& p : by_mode[m]) by_waiter += p.copies_by_waiter;
          row["copies_by_waiting_thread"] = by_waiter;  // over all recorded passes
        }
        rows.push_back(row);
      }
    }
    std::printf("(raw: write() to a fresh O_TMPFILE file per buffer, no fsync, then pread() + close(); tier: "
                "SpillTier::write/read; engine: OffloadEngine queues, all submitted then waited on, reads into its "
                "copy-in pool, reserved for these buffers, the waiting thread running queued copies too; engine queue-only: "
                "the same, waits only blocking (the queues' threads alone); engine cold: a new engine per pass, no pool reserved (as in "
                "training; all values held at once, so nothing to reuse); raw new-dst: raw reading into buffers allocated just before each read; ratios vs raw)\n");
    result["throughput"] = {{"total_bytes_per_size", total}, {"repetitions", reps}, {"rows", rows}};
  }

  // ---- part 2 ----
  if (do_step) {
    const bench::ModelBench mb = bench::load_model_bench(config, overrides);
    const train::Setup& setup = mb.setup;
    models::Model& model = mb.model();
    const data::Batch& batch = mb.batch;

    // The plain step's usage: forward's end sets the T1 points.
    (void)step_once(model, batch, nullptr, 0, 99);  // warm-up
    const StepOut probe = step_once(model, batch, nullptr, 0, 99);
    const int64_t fwd = probe.forward_above;
    std::printf("\n%s, batch %lld: plain step peak %s above baseline, %s held when forward ends\n", config.c_str(),
                static_cast<long long>(setup.batch_size), mib(probe.peak_above).c_str(), mib(fwd).c_str());

    memory::OffloadOptions base_options;
    base_options.tier = "disk";
    base_options.dir = dir;
    base_options.min_bytes = 64 << 10;
    std::vector<Point> points;
    auto add = [&](const std::string& label, double fraction, int64_t t1_above, int prefetch) {
      Point p;
      p.label = label;
      p.target_fraction = fraction;
      p.t1_above = t1_above;
      p.prefetch = prefetch;
      points.push_back(p);
    };
    // Offloading starts once usage passes T1 after a producer, and every value kept below T1 stays: T1 at
    // (1 - f) of forward's usage sends roughly the last fraction f of forward's saved bytes out.
    add("none", 0, memory::kNoLimit, 2);
    for (int pf : {0, 2}) {
      add("quarter", 0.25, static_cast<int64_t>(0.75 * static_cast<double>(fwd)), pf);
      add("half", 0.5, static_cast<int64_t>(0.5 * static_cast<double>(fwd)), pf);
      add("all", 1, 0, pf);
    }
    for (auto& p : points) {
      memory::OffloadOptions o = base_options;
      o.prefetch = p.prefetch;
      for (int s = 0; s < steps + 1; ++s) {
        const uint64_t seed = 100 + static_cast<uint64_t>(s);
        StepOut plain, off;
        if (s % 2 == 0) {
          plain = step_once(model, batch, nullptr, 0, seed);
          off = step_once(model, batch, &o, p.t1_above, seed);
        } else {
          off = step_once(model, batch, &o, p.t1_above, seed);
          plain = step_once(model, batch, nullptr, 0, seed);
        }
        const int diff = first_difference(plain.grads, off.grads);
        if (diff >= 0) {
          std::printf("FAIL: offload point %s (prefetch %d), step %d: gradient of parameter %s differs from the plain "
                      "step's\n", p.label.c_str(), p.prefetch, s, model.named_parameters()[static_cast<size_t>(diff)].first.c_str());
          p.bitwise_equal = false;
          all_ok = false;
        }
        if (s == 0) continue;  // warm-up
        p.wall.push_back(off.wall_ms);
        p.cpu.push_back(off.cpu_ms);
        p.plain_wall.push_back(plain.wall_ms);
        p.plain_cpu.push_back(plain.cpu_ms);
        p.peak_above = std::max(p.peak_above, off.peak_above);
        p.peaks.push_back(static_cast<double>(off.peak_above));
        p.plain_peak_above = std::max(p.plain_peak_above, plain.peak_above);
        p.stats.push_back(off.stats);
      }
    }

    const double all_written = stat_median(points.back().stats, [](const auto& s) { return double(s.written_bytes); });
    std::vector<double> plain_wall, plain_cpu;
    int64_t plain_peak = 0;
    for (const auto& p : points) {
      plain_wall.insert(plain_wall.end(), p.plain_wall.begin(), p.plain_wall.end());
      plain_cpu.insert(plain_cpu.end(), p.plain_cpu.begin(), p.plain_cpu.end());
      plain_peak = std::max(plain_peak, p.plain_peak_above);
    }
    std::printf("\n%-8s %3s %11s %11s %11s %10s %7s %8s %8s %8s %8s %10s %8s %8s %5s %5s %6s\n", "offload", "pf",
                "T1-base", "peak max", "peak med", "saved", "saved%", "wall ms", "cpu ms", "wall ovh", "cpu ovh", "written", "fwd wait", "bwd wait",
                "pre", "dem", "bitwise");
    std::printf("%-8s %3s %11s %11s %11s %10s %7s %8.1f %8.1f %8s %8s %10s %8s %8s %5s %5s %6s\n", "plain", "-", "-",
                mib(plain_peak).c_str(), "-", "-", "-", median(plain_wall), median(plain_cpu), "-", "-", "-", "-", "-", "-", "-",
                "-");
    nlohmann::json jpoints = nlohmann::json::array();
    for (const auto& p : points) {
      const double wall = median(p.wall), cpu = median(p.cpu);
      std::vector<double> wall_ratio, cpu_ratio;  // each offload step against the plain step beside it
      for (size_t i = 0; i < p.wall.size(); ++i) {
        wall_ratio.push_back(p.wall[i] / p.plain_wall[i]);
        cpu_ratio.push_back(p.cpu[i] / p.plain_cpu[i]);
      }
      const double wall_ovh = median(wall_ratio) - 1, cpu_ovh = median(cpu_ratio) - 1;
      const auto peak_med = static_cast<int64_t>(median(p.peaks));
      const int64_t saved = p.plain_peak_above - p.peak_above;
      const double written = stat_median(p.stats, [](const auto& s) { return double(s.written_bytes); });
      const double pause = stat_median(p.stats, [](const auto& s) { return s.forward_pause_ms; });
      const double wait = stat_median(p.stats, [](const auto& s) { return s.fetch_wait_ms; });
      const double pre = stat_median(p.stats, [](const auto& s) { return double(s.prefetches); });
      const double dem = stat_median(p.stats, [](const auto& s) { return double(s.demand_fetches); });
      const std::string t1 = p.t1_above == memory::kNoLimit ? "none" : mib(p.t1_above);
      std::printf("%-8s %3d %11s %11s %11s %10s %6.1f%% %8.1f %8.1f %7.1f%% %7.1f%% %10s %8.1f %8.1f %5.0f %5.0f %6s\n",
                  p.label.c_str(), p.prefetch, t1.c_str(), mib(p.peak_above).c_str(), mib(peak_med).c_str(), mib(saved).c_str(),
                  100.0 * static_cast<double>(saved) / static_cast<double>(p.plain_peak_above), wall, cpu, 100 * wall_ovh,
                  100 * cpu_ovh, mib(static_cast<int64_t>(written)).c_str(), pause, wait, pre, dem,
                  p.bitwise_equal ? "yes" : "NO");
      nlohmann::json per_step = nlohmann::json::array();
      for (const auto& s : p.stats) per_step.push_back(train::offload_stats_json(s));
      jpoints.push_back({{"offload", p.label},
                         {"target_fraction", p.target_fraction},
                         {"offloaded_fraction_of_all", all_written > 0 ? written / all_written : 0.0},
                         {"t1_above_baseline_bytes", p.t1_above == memory::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(p.t1_above)},
                         {"prefetch", p.prefetch},
                         {"peak_above_baseline_bytes", p.peak_above},
                         {"peak_above_baseline_bytes_median", peak_med},
                         {"plain_peak_above_baseline_bytes", p.plain_peak_above},
                         {"peak_saved_bytes", saved},
                         {"step_ms_median", wall},
                         {"step_cpu_ms_median", cpu},
                         {"plain_step_ms_median", median(p.plain_wall)},
                         {"plain_step_cpu_ms_median", median(p.plain_cpu)},
                         {"overhead_wall", wall_ovh},
                         {"overhead_cpu", cpu_ovh},
                         {"written_bytes_median", written},
                         {"forward_pause_ms_median", pause},
                         {"fetch_wait_ms_median", wait},
                         {"prefetches_median", pre},
                         {"demand_fetches_median", dem},
                         {"bitwise_equal_gradients", p.bitwise_equal},
                         {"stats_per_step", per_step}});
    }
    std::printf("(peak: bytes above the pre-step baseline, max / median over steps; saved: max vs max of the plain "
                "steps interleaved with that point; ovh: median of offload/plain over adjacent pairs; written: median bytes sent to the spill tier per step; "
                "fwd wait = forward_pause_ms, bwd wait = fetch_wait_ms; pre/dem = prefetches / demand fetches)\n");
    result["step"] = {{"config", config},
                      {"batch_size", setup.batch_size},
                      {"steps", steps},
                      {"min_bytes", base_options.min_bytes},
                      {"plain_forward_end_above_baseline_bytes", fwd},
                      {"plain_peak_above_baseline_bytes", plain_peak},
                      {"plain_step_ms_median", median(plain_wall)},
                      {"plain_step_cpu_ms_median", median(plain_cpu)},
                      {"points", jpoints}};
  }

  result["all_checks_passed"] = all_ok;
  bench::write_json(out, result);
  std::printf("wrote %s\n", out.c_str());
  if (!all_ok) {
    std::printf("FAIL: see the lines above\n");
    return 1;
  }
  return 0;
}
