// offload/engine.h — offload of saved activations to another tier (docs/METHODS.md, "Threshold offload").
// Owns: OffloadEngine, the mechanism: the copy-out and copy-in queues, per-storage buffers rebuilt as
//       views, copy deadlines, prefetch, waits, and the fall-back when a tier fails (the value is marked
//       Dropped and SavedValue's normal recompute path rebuilds it); ThresholdPolicy, the threshold
//       decisions T1 (copy out above it), T2 (forward pauses above it while copies fly) and T3 (a
//       prefetch waits while it would exceed it).
// Does not own: tiers (tier.h); the joint keep/recompute/offload plan (planner.h chooses, BudgetPolicy
//       decides per value); step boundaries and node positions (train::StepRuntime drives the engine:
//       begin_step, begin_forward_node / end_forward_node around a policy's decisions, before_backward_node).
//
// The four queues: Q1 is the forward compute (the caller's thread / CUDA stream), Q2 the copy-out queue
// (a thread of its own; on a GPU it also owns a copy stream and waits on an event recorded on the compute
// stream, so a copy starts only after the producer finished), Q3 the backward compute, Q4 the copy-in
// queue (another thread and stream). Backward uses a value only after its Q4 copy finished (fetch()
// waits), and Q4 reads a buffer only after its Q2 write finished.
//
// Offload works per storage: views of one storage share one stored buffer, and each view is rebuilt
// with its own sizes/strides/offset over the restored storage, so bytes come back bitwise identical.
//
// Copy-in lands in the engine's CopyInPool: buffers kept between uses, so a read writes into memory
// whose pages are already faulted (a fresh buffer per read spends most of the copy on first-touch page
// faults). Within a step the pool grows to the most storages of each size resident at once, and a read
// reuses a buffer backward released; at the step's end the buffers beyond a reservation
// (reserve_copy_in, none by default) are freed, so forward never holds idle copy-in buffers (a plan's
// simulator counts each from the read that made it to the step's end: Prediction::copy_in_pool). O(1) per fetch: entries are found by value id,
// each holding its place in the step's list and its view's index.
//
// Usage (`usage()`) is the measured device memory: the counting allocator's device bytes on CPU, the
// CUDA caching allocator's allocated bytes on a GPU.
#pragma once
#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <list>
#include <map>
#include <unordered_map>
#include <vector>

#include "ration/plan/planner.h"
#include "ration/core/saved_value.h"
#include "ration/core/step_policy.h"
#include "ration/offload/tier.h"

namespace ration::memory {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

struct OffloadOptions {
  std::string tier = "disk";        // disk | host | host+disk (host first, overflow to disk)
  std::string dir;                  // spill directory; empty: $TMPDIR or /tmp
  int64_t host_limit_bytes = 0;     // host tier capacity (0: unlimited)
  int64_t disk_limit_bytes = 0;     // spill tier capacity (0: what the disk holds)
  // Thresholds of ThresholdPolicy (offload without a memory budget; a plan sets its own deadlines).
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
// Measure offload for the joint plan as a step sees it: copy-out and copy-in bandwidth through an
// OffloadEngine's queues over `tier` (copy-in into the engine's warm copy-in pool, as every step after
// the first), while a compute thread runs matrix products beside them (a step's contention for cores
// and memory bandwidth); medians of a few round trips of `probe_bytes` in four buffers (smaller when the
// tier has less room), the fixed cost of one small copy, and what the tier can hold
// (OffloadCosts::capacity_bytes). A tier too small to measure gets capacity 0: the planner then keeps or
// recomputes everything. copy_in is CopyInMemory::Pooled (the engine always reads into its pool).
OffloadCosts measure_offload_costs(Tier& tier, const OffloadOptions& options, int64_t probe_bytes = 16 << 20);

// The copy-in destinations (see the file comment). A buffer is in use while a tensor other than the
// pool's own references its storage (a restored value, its views, a read in flight); when backward
// releases the value it is free for the next read of the same size. Buffers are ordinary tensors of the
// counting allocator (saved_activations; on a GPU, the CUDA caching allocator's), so measured peaks
// include them; touched when made, so their pages are faulted once. Used by the compute thread only.
class CopyInPool {
 public:
  // A free buffer of exactly `bytes` (1-D uint8 on `device`), or a new one the pool keeps (a miss).
  at::Tensor acquire(int64_t bytes, const at::Device& device);
  // Hold exactly `buffers` (bytes -> count): frees the free buffers beyond it, makes the missing ones.
  void reserve(const std::map<int64_t, int64_t>& buffers, const at::Device& device);
  int64_t bytes() const { return bytes_; }
  int64_t misses() const { return misses_; }  // acquires that had to make a buffer

 private:
  static bool in_use(const at::Tensor& buffer) { return buffer.storage().use_count() > 1; }
  at::Tensor make(int64_t bytes, const at::Device& device);
  std::map<int64_t, std::vector<at::Tensor>> by_size_;  // bytes -> buffers, each (bytes,) uint8
  int64_t bytes_ = 0, misses_ = 0;
};

struct OffloadStats {
  int64_t offloaded_values = 0;     // saved values sent to the tier
  int64_t offloaded_storages = 0;   // buffers written (views share one)
  int64_t written_bytes = 0, read_bytes = 0;
  int64_t prefetches = 0;           // reads started before backward asked
  int64_t demand_fetches = 0;       // reads started when backward asked (prefetch too late or deferred)
  int64_t deferred_prefetches = 0;  // prefetches held back by T3
  int64_t forward_pauses = 0;       // times forward waited on copies because usage exceeded T2
  int64_t deadline_waits = 0;       // planned offloads whose copy was not done by its deadline
  int64_t fallbacks = 0;            // values whose write did not fit: recomputed (plan) or kept (thresholds)
  double write_ms = 0, read_ms = 0; // time the queues spent copying
  double forward_pause_ms = 0;      // forward blocked (T2 and deadlines)
  double fetch_wait_ms = 0;         // backward blocked waiting for Q4
  int64_t pool_reads = 0;           // copy-ins into a free copy-in pool buffer (already faulted)
  int64_t pool_misses = 0;          // copy-ins that had to add a buffer to the pool
  int64_t copies_by_waiter = 0;     // copies a waiting compute thread ran itself (CopyWaits)
  int64_t max_usage_bytes = 0;      // highest usage seen at a control point
};

// What a value whose copy-out did not fit becomes. The threshold loop keeps it resident (so offloading
// into a full tier never needs more memory than not offloading) and stops offloading once the tier has
// been full; a plan recomputes it (the plan counted on its memory being free).
enum class WhenTierFull { KeepResident, Recompute };

// What the compute thread does while it waits for a copy (a forward deadline or T2 pause, a fetch):
// RunQueuedCopies takes the queued copies up to the awaited one off the queue and runs them itself (it
// is idle anyway; two threads copy faster than one), Block only waits. Measuring the queues' own
// bandwidth (measure_offload_costs: what copies get while compute runs) blocks.
enum class CopyWaits { RunQueuedCopies, Block };

class OffloadEngine {
 public:
  OffloadEngine(std::unique_ptr<Tier> tier, OffloadOptions options);
  explicit OffloadEngine(const OffloadOptions& options);  // with the tier the options name (make_tier)
  ~OffloadEngine();  // drains both queues and frees every stored buffer
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  // ---- step boundaries (the step runtime)
  void begin_step();  // frees the buffers a previous step left behind (values never fetched, now dead)
  void end_step();    // the same, right after backward
  // Micro-batches whose forward and backward interleave (a pipeline stage): their nodes share forward
  // ordinals, so each entry belongs to the micro-batch selected when it was offloaded, and deadlines and
  // prefetches look at the selected micro-batch's entries only. Selecting one (its forward or its
  // backward begins) also frees the idle copy-in buffers beyond the reservation: a plan of one micro-batch
  // counts its pool from its own reads to its own end, not another micro-batch's buffers (docs/METHODS.md,
  // "Distributed training", pipeline stages with offload). A step without micro-batches is micro-batch 0
  // throughout.
  void select_micro_batch(int64_t index);

  // ---- forward (Q1), per node: begin_forward_node, the policy's offload() calls, end_forward_node
  // `node` (at step position `ordinal`) finished its forward: it is now a user of the offloaded values it
  // saves again (their prefetch is timed from their last forward user, the first backward one).
  void begin_forward_node(const Node& node, int64_t ordinal);
  // Start copying `value` out (Q2). `deadline`: forward ordinal by whose end the copy must be done
  // (-1: none); `prefetch`: nodes ahead to fetch back (-1: the option). Returns false (and leaves the
  // value resident) for values that cannot be offloaded: pinned, too small, not a saved activation.
  // `when_full`: what the value becomes if its copy-out does not fit (see WhenTierFull).
  bool offload(const std::shared_ptr<SavedValue>& value, int64_t deadline = -1, int prefetch = -1,
               WhenTierFull when_full = WhenTierFull::Recompute);
  // Wait for the copies whose deadline is `ordinal` or earlier; note the usage.
  void end_forward_node(int64_t ordinal);
  // The device of the values being saved: usage() reads its memory (the CUDA caching allocator for a
  // GPU), and the copy-in pool lives there. Set from each value offloaded, and by a threshold policy
  // before its first T1 check (or a GPU step would compare host bytes with T1 and offload nothing).
  void use_device(const at::Device& device);
  // Back-pressure: wait for the oldest copy-out still in flight. False when none is in flight.
  bool wait_oldest_copy_out();

  // ---- backward (Q3)
  // Backward is about to run the node at step position `ordinal`: start the copy-ins due within each
  // value's prefetch distance, soonest needed first. A prefetch (not yet needed) starts only when
  // `may_prefetch(storage bytes)` says so; a value this node needs is fetched regardless.
  void before_backward_node(int64_t ordinal, const std::function<bool(int64_t bytes)>& may_prefetch);
  // The value, resident again (waits for Q4). If the tier failed to store it under KeepResident, the
  // value is rebuilt from its storage, which never left memory. Otherwise, if the tier failed to store
  // or return it, the value is marked Dropped (SavedValue::offload_failed) and an undefined tensor
  // returned: the caller rebuilds it by recompute.
  at::Tensor fetch(SavedValue& value);

  bool offloadable(const SavedValue& value) const;
  int64_t usage() const;
  const OffloadOptions& options() const { return options_; }
  Tier& tier() { return *tier_; }
  const Tier& tier() const { return *tier_; }
  OffloadStats stats() const;  // totals since the engine was built
  int64_t pending_entries() const;  // stored buffers not yet fetched back and freed
  // Hold `buffers` (bytes -> count) across steps, made (and faulted) now; whatever else the pool makes
  // is freed at every step's end. Training reserves none (a plan's memory counts no idle buffer in
  // forward); a caller that knows its sizes may. Made on the device of the values offloaded so far
  // (the CPU before any; remade if it changes).
  void reserve_copy_in(const std::map<int64_t, int64_t>& buffers);
  void set_copy_waits(CopyWaits waits) { copy_waits_ = waits; }
  int64_t copy_in_pool_bytes() const { return pool_.bytes(); }

  struct CopyStreams;  // the GPU copy-out / copy-in streams (offload/engine.cpp; empty without RATION_CUDA)

 private:
  struct Entry;
  class Queue;
  void issue_read(const std::shared_ptr<Entry>& e, bool demand);
  void wait_written(Entry& e);
  void forget(const std::shared_ptr<Entry>& e);
  void sweep();
  void count(int64_t OffloadStats::*counter, int64_t n = 1);

  std::unique_ptr<Tier> tier_;
  OffloadOptions options_;
  std::unique_ptr<Queue> copy_out_, copy_in_;
  struct ViewRef {
    std::shared_ptr<Entry> entry;
    size_t view = 0;  // index into entry->views
  };
  std::unordered_map<uint64_t, ViewRef> by_value_;                      // SavedValue id -> its entry and view
  std::unordered_map<const void*, std::shared_ptr<Entry>> by_storage_;  // StorageImpl -> entry
  std::list<std::shared_ptr<Entry>> entries_;                           // this step, in offload order
  CopyInPool pool_;                                                     // copy-in destinations
  std::optional<std::map<int64_t, int64_t>> pool_plan_;                 // reserve_copy_in's (none: empty)
  int64_t forward_ordinal_ = -1;                                        // the node whose saves are offloaded now
  int64_t micro_batch_ = 0;                                             // select_micro_batch's
  CopyWaits copy_waits_ = CopyWaits::RunQueuedCopies;
  std::atomic<bool> tier_was_full_{false};  // a copy-out failed: KeepResident offloads stop
  at::Device device_ = at::kCPU;
  mutable std::mutex stats_mu_;
  OffloadStats stats_;
  std::unique_ptr<CopyStreams> streams_;  // GPU copy streams (RATION_CUDA), created on first use
};

// The threshold loop (docs/METHODS.md, "Threshold offload"): every saved value of at least min_bytes is
// copied out after its producer when usage exceeds T1; forward pauses while usage exceeds T2 and copies
// are in flight (oldest first); a prefetch waits while usage plus its bytes would exceed T3. Values
// replicated over a process group (tensor parallel; marked when saved, see OpSpec::replicas) are
// offloaded regardless of T1 and stored 1/n per process (all-gather on fetch), so every process makes
// the same decisions.
class ThresholdPolicy : public StepPolicy {
 public:
  explicit ThresholdPolicy(OffloadEngine& engine) : engine_(engine) {}
  void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) override;
  bool may_prefetch(int64_t bytes) override;

 private:
  OffloadEngine& engine_;
};

}  // namespace ration::memory
