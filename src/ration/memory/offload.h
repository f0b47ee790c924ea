// offload.h — threshold-driven offload of saved activations (seed method M2).
// Owns: OffloadEngine (the four queues, thresholds T1/T2/T3, prefetch, back-pressure, fall-back to
//       recompute when a tier is full), OffloadPolicy (the seed's control loop as a MemoryPolicy) and
//       ration::OffloadScope, the RAII guard users wrap around forward + backward.
// Does not own: tiers (tier.h), or the joint keep/recompute/offload plan (planner.h chooses, and
//       BudgetPolicy executes planned offloads through an OffloadEngine).
//
// The four queues of the seed: Q1 is the forward compute (the caller's thread / CUDA stream), Q2 the
// copy-out queue (a thread of its own; on a GPU it also owns a copy stream and waits on an event
// recorded on the compute stream, so a copy starts only after the producer finished), Q3 the backward
// compute, Q4 the copy-in queue (another thread and stream). Backward uses a value only after its Q4
// copy finished (fetch() waits), and Q4 reads a buffer only after its Q2 write finished.
//
// Offload works per storage: views of one storage share one stored buffer, and each view is rebuilt
// with its own sizes/strides/offset over the restored storage, so bytes come back bitwise identical.
//
// Usage (`usage()`) is the measured device memory: the counting allocator's device bytes on CPU, the
// CUDA caching allocator's allocated bytes on a GPU.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ration/memory/planner.h"
#include "ration/memory/saved_value.h"
#include "ration/memory/tier.h"

namespace ration::memory {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

struct OffloadOptions {
  std::string tier = "disk";        // disk | host | host+disk (host first, overflow to disk)
  std::string dir;                  // spill directory; empty: $TMPDIR or /tmp
  int64_t host_limit_bytes = 0;     // host tier capacity (0: unlimited)
  int64_t disk_limit_bytes = 0;     // spill tier capacity (0: what the disk holds)
  int64_t t1 = 0;                   // copy a saved value out when usage exceeds T1 after its producer
  int64_t t2 = kNoLimit;            // forward pauses while usage exceeds T2 and copies are in flight
  int64_t t3 = kNoLimit;            // a prefetch waits while usage plus its bytes would exceed T3
  int64_t min_bytes = 64 * 1024;    // smaller saved values stay resident
  int prefetch = 2;                 // fetch back this many backward nodes before the value is needed
  double throttle_bytes_per_second = 0;  // slow the tier down (tests, benches); 0: as fast as it is
  int64_t fail_after_bytes = 0;     // inject a full tier after this many bytes (tests); 0: never
};

// Checks the options (thresholds ordered, prefetch ≥ 0, tier name); errors name the key.
void validate(const OffloadOptions& options);
std::unique_ptr<Tier> make_tier(const OffloadOptions& options);
// Measure the tier for the joint plan: write/read bandwidth on `probe_bytes` buffers (median of a few
// round trips) and the fixed cost of one small copy.
OffloadCosts measure_offload_costs(Tier& tier, const OffloadOptions& options, int64_t probe_bytes = 16 << 20);

struct OffloadStats {
  int64_t offloaded_values = 0;     // saved values sent to the tier
  int64_t offloaded_storages = 0;   // buffers written (views share one)
  int64_t written_bytes = 0, read_bytes = 0;
  int64_t prefetches = 0;           // reads started before backward asked
  int64_t demand_fetches = 0;       // reads started when backward asked (prefetch too late or deferred)
  int64_t deferred_prefetches = 0;  // prefetches held back by T3
  int64_t forward_pauses = 0;       // times forward waited on copies because usage exceeded T2
  int64_t deadline_waits = 0;       // planned offloads whose copy was not done by its deadline
  int64_t fallbacks = 0;            // values recomputed because the tier was full
  double write_ms = 0, read_ms = 0; // time the queues spent copying
  double forward_pause_ms = 0;      // forward blocked (T2 and deadlines)
  double fetch_wait_ms = 0;         // backward blocked waiting for Q4
  int64_t max_usage_bytes = 0;      // highest usage seen at a control point
  nlohmann::json to_json() const;
};

class OffloadEngine {
 public:
  OffloadEngine(std::unique_ptr<Tier> tier, OffloadOptions options);
  explicit OffloadEngine(const OffloadOptions& options);  // with the tier the options name (make_tier)
  ~OffloadEngine();  // drains both queues and frees every stored buffer
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  // ---- forward (Q1)
  // A node finished its forward: gives it the next ordinal of the step and notes it as a user of the
  // offloaded values it saves (for prefetch). Returns its ordinal.
  int64_t on_forward_node(Node& node);
  // Start copying `value` out (Q2). `deadline`: forward ordinal by whose end the copy must be done
  // (-1: none); `prefetch`: nodes ahead to fetch back (-1: the option). Returns false (and leaves the
  // value resident) for values that cannot be offloaded: pinned, too small, not a saved activation.
  bool offload(const std::shared_ptr<SavedValue>& value, int64_t deadline = -1, int prefetch = -1);
  // After a node's offloads were queued: wait for copies due by this ordinal, then T2 back-pressure.
  void forward_node_done(int64_t ordinal);

  // ---- backward (Q3)
  void before_backward_node(Node& node);  // prefetch window and deferred prefetches (T3)
  at::Tensor fetch(SavedValue& value);    // waits for Q4; falls back to recompute if the tier was full

  bool offloadable(const SavedValue& value) const;
  int64_t usage() const;
  const OffloadOptions& options() const { return options_; }
  Tier& tier() { return *tier_; }
  OffloadStats stats() const;
  void reset_stats();
  int64_t pending_entries() const;  // stored buffers not yet fetched back and freed

 private:
  struct Entry;
  class Queue;
  void issue_read(const std::shared_ptr<Entry>& e, bool demand);
  void wait_written(Entry& e);
  void new_step_if_needed();
  void sweep();

  std::unique_ptr<Tier> tier_;
  OffloadOptions options_;
  std::unique_ptr<Queue> copy_out_, copy_in_;
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> by_value_;       // SavedValue id -> entry
  std::unordered_map<const void*, std::shared_ptr<Entry>> by_storage_;  // StorageImpl -> entry
  std::vector<std::shared_ptr<Entry>> entries_;                         // this step, in offload order
  std::vector<uint64_t> seqs_;                                          // node seq by ordinal, this step
  bool in_backward_ = false;
  at::Device device_ = at::kCPU;
  mutable std::mutex stats_mu_;
  OffloadStats stats_;
#ifdef RATION_CUDA
  struct Streams;
  std::unique_ptr<Streams> streams_;
#endif
};

// The seed's control loop: every saved value of at least min_bytes is copied out after its producer
// when usage exceeds T1, with T2/T3 back-pressure and prefetch. Values replicated over a process group
// (tensor parallel; marked when saved, see OpSpec::replicas) are offloaded regardless of T1 and stored
// 1/n per process (all-gather on fetch), so every process makes the same decisions.
class OffloadPolicy : public MemoryPolicy {
 public:
  explicit OffloadPolicy(OffloadEngine& engine) : engine_(engine) {}
  void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) override;
  void before_backward_node(Node& node) override { engine_.before_backward_node(node); }
  at::Tensor fetch(SavedValue& value) override { return engine_.fetch(value); }

 private:
  OffloadEngine& engine_;
};

}  // namespace ration::memory

namespace ration {

// RAII: saved activations produced while the scope is alive are offloaded per `options`; keep it alive
// until backward has finished. The model code does not change.
//   { ration::OffloadScope offload(opts); auto loss = model(x); loss.backward(); }
class OffloadScope {
 public:
  explicit OffloadScope(const memory::OffloadOptions& options = {});
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;
  memory::OffloadEngine& engine() { return *engine_; }
  memory::OffloadStats stats() const { return engine_->stats(); }

 private:
  std::unique_ptr<memory::OffloadEngine> engine_;
  std::unique_ptr<memory::OffloadPolicy> policy_;
  std::unique_ptr<PolicyScope> scope_;
};

}  // namespace ration
