// plan/simulator.h — the planner's model of one training step's memory: given a decision per saved
// storage (keep / recompute / offload) it predicts the live bytes at every node boundary of forward and
// backward, recompute transients and copies included, to the byte the executor will measure.
// Owns: the simulator's rules, which mirror SavedValue, Node::recompute and the engine exactly (what is
//       resident, what a recompute rebuilds and stores, what it frees, when an offloaded copy lands).
// Does not own: choosing decisions (plan/context.h, plan/strategies.cpp), the copy queues' timeline
//       (schedule_offloads in plan/simulator.cpp, declared in planner.h), executing a plan (budget_policy.h).
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "ration/plan/graph.h"
#include "ration/plan/planner.h"
#include "ration/plan/profile.h"

namespace ration::memory {

// The planner's forms of simulate, schedule_offloads and relax_deadlines (planner.h): the same over a
// profile's graph already built, so a plan reads its profile once.
Prediction simulate(const PlanGraph& graph, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule = nullptr);
// The same, stopped once the peak reaches `stop_at` (Simulator::stop_at); `*stopped` says whether it was.
// `fetched_on_demand`, if given (by storage, -1 filled by the caller): the backward step at which a re-run
// fetched an offloaded storage before its prefetch did.
Prediction simulate(const PlanGraph& graph, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule, int64_t stop_at,
                    bool* stopped, std::vector<int64_t>* fetched_on_demand = nullptr);
OffloadSchedule schedule_offloads(const PlanGraph& graph, const std::vector<Decision>& decision, const OffloadCosts& costs);
// The same timeline for the storages `offloaded` (any order), written into `schedule`, whose entries for
// every other storage must be -1 (deadline) and 0 (prefetch) already: a caller pricing many timelines
// resets only the entries it wrote.
void schedule_offloads(const PlanGraph& graph, const std::vector<int>& offloaded, const OffloadCosts& costs,
                       OffloadSchedule& schedule);
void relax_deadlines(const PlanGraph& graph, const std::vector<Decision>& decision,
                     const std::vector<int64_t>& forward_peaks, int64_t bound, OffloadSchedule& schedule);

// Per storage: the first forward ordinal whose node saves it and the last one (PlanGraph::span).
inline const SaveSpan& save_span(const PlanGraph& graph) { return graph.span; }

// A key is usable without recompute iff it is pinned, or saved and kept (until its last use), or
// restored by a recompute or a fetch (until its last use). Memory is counted by storage instance: the
// original (alive while a kept key holds it), a recomputed instance (alive while a restored key holds
// it), per-backward-node transients (freed when the node's recompute cache ends), and the outputs of
// transient re-runs (Plan::store_from), held only by the re-run that consumes them.
class Simulator {
 public:
  Simulator(const PlanGraph& g, const std::vector<Decision>& decision, int64_t extra,
            const OffloadSchedule* schedule = nullptr, const std::map<int64_t, int64_t>* store_from = nullptr);

  // Droppable: saved, and allocated by a recorded node.
  bool droppable(int64_t s) const {
    return s >= 0 && saved_at_[static_cast<size_t>(s)] >= 0 && storages_[static_cast<size_t>(s)].allocated_by >= 0;
  }
  bool offloaded(int64_t s) const {
    return s >= 0 && droppable(s) && decision_[static_cast<size_t>(s)] == Decision::Offload;
  }
  Prediction run();
  // Early stop: run() returns as soon as the peak reaches `bytes`, with a prediction that is complete
  // only up to there (its peak_bytes a lower bound of the plan's, >= bytes): enough for a caller that
  // only asks whether the peak stays below it. Below it the prediction is exact and whole.
  void stop_at(int64_t bytes) { stop_at_ = bytes; }
  bool stopped() const { return stopped_; }
  // Where given (by storage): the backward step at which a re-run fetched an offloaded storage on demand.
  void record_on_demand(std::vector<int64_t>* steps) { on_demand_ = steps; }
  // Bytes of the offloaded storages (known once run() has started, stopped or not).
  int64_t offloaded_bytes() const { return offloaded_bytes_; }

 private:
  // Absent: not a saved value (no state; never usable unless a leaf).
  enum class KeyState : uint8_t { Absent, Kept, Dropped, Offloaded, Restored, Released };
  bool dropped(size_t s) const { return decision_[s] != Decision::Keep; }
  int64_t first_use(int64_t s) const { return first_use_[static_cast<size_t>(s)]; }
  // Values are numbered as the graph numbers them (plan/graph.h): the saved leaves first (in key order),
  // then every node output by position, so walking ids in order walks keys in ValueKey order. An input
  // with id -1 (an output index past its node's outputs) has the storage the profile records for it.
  int64_t storage(const PlanGraph::Input& in) const {
    return in.value >= 0 ? key_storage_[static_cast<size_t>(in.value)] : g_.storage_of(in);
  }
  KeyState state(int k) const { return k >= 0 ? state_[static_cast<size_t>(k)] : KeyState::Absent; }
  void fetch(int64_t s);
  bool pooled(int64_t s) const {  // fetched into the engine's copy-in pool (CopyInMemory::Pooled)
    return schedule_ != nullptr && schedule_->copy_in == CopyInMemory::Pooled && offloaded(s);
  }
  void hold(std::vector<int64_t>& holders, int64_t s, int delta);
  // run()'s steps. Where the peak is, named once at the end: the first node reaching it.
  struct PeakAt {
    bool backward = false;
    int64_t node = -1;  // its ordinal; -1: none
  };
  // Each returns true where the run stopped (stop_at). Inline: defined in simulator.cpp and used there only.
  inline bool run_forward(Prediction& pred, PeakAt& at);
  inline void start_backward(std::vector<int64_t>& measured_holders);  // key states, holders, fetch order
  inline bool run_backward(Prediction& pred, PeakAt& at, std::vector<int64_t>& measured_holders);
  inline void release_saved(plan_detail::Lists<int>::Span saved, std::vector<int>& measured_pending,
                            std::vector<int64_t>& measured_holders, int64_t& measured_resident);
  inline void finish(Prediction& pred, const PeakAt& at) const;
  // A step's peak `peak` at node `node`: recorded where it is the highest so far; true where it stops the run.
  bool record_peak(Prediction& pred, int64_t peak, bool backward, int64_t node, PeakAt& at) {
    if (peak <= pred.peak_bytes) return false;
    pred.peak_bytes = peak;
    at.backward = backward;
    at.node = node;
    if (peak < stop_at_) return false;
    stopped_ = true;
    return true;
  }
  // Offloaded storage s is fetched at the first backward node whose ordinal is at most this.
  int64_t fetch_from(int64_t s) const { return first_use(s) + schedule_->prefetch[static_cast<size_t>(s)]; }
  bool usable(int k) const;  // k: a node output's id (leaves are always usable)
  void ensure(int k, Prediction& pred);
  bool transient(int64_t ord) const;
  int64_t rerun(int64_t ord, int out, bool store_required, Prediction& pred);

  const PlanGraph& g_;
  const std::vector<ProfiledStorage>& storages_;
  const std::vector<Decision>& decision_;
  int64_t extra_;
  const OffloadSchedule* schedule_;
  const std::vector<int64_t>& saved_at_;     // by storage (PlanGraph::key_span)
  const std::vector<int64_t>& first_use_;
  const std::vector<int64_t>& key_storage_;  // by id
  std::vector<int> pending_;                // by id: backward reads still to come
  std::vector<KeyState> state_;             // by id
  // An offloaded storage's saved keys, in key order: its first and last (by storage, -1 none) and each
  // one's next (by key, -1 the last).
  std::vector<int> first_key_, last_key_, next_key_;
  int64_t offloaded_bytes_ = 0;
  std::vector<int64_t> unfetched_;          // offloaded storages with saved keys, by when prefetch fetches them
  std::vector<char> fetched_;               // by storage
  std::vector<int64_t> orig_holders_, rec_holders_;
  // This backward step's re-runs (by node) and transient storage instances held only by the recompute
  // cache (by storage): present where the entry equals the step's stamp.
  std::vector<uint32_t> cache_, transient_;
  uint32_t stamp_ = 0;
  int64_t transient_bytes_ = 0, recompute_peak_ = 0;
  const std::map<int64_t, int64_t>* store_from_ = nullptr;
  int64_t step_ = 0;         // index of the backward node being simulated
  int64_t frame_bytes_ = 0;  // outputs of transient re-runs held by the re-runs consuming them
  int64_t resident_ = 0;     // bytes of storage instances that have holders
  int64_t stop_at_ = std::numeric_limits<int64_t>::max();
  bool stopped_ = false;
  std::map<int64_t, int64_t> pool_in_use_, pool_max_;  // copy-in pool buffers by bytes: in use now, made
  std::vector<int64_t>* on_demand_ = nullptr;
  bool prefetching_ = false;
};

}  // namespace ration::memory
