// plan/offload_peak.h — the predicted peak of a plan with an offload tier, kept up to date as a descent
// releases single groups (offloaded or recomputed), so that a try costs a few range adds and one new copy
// timeline instead of a whole-step simulation (docs/METHODS.md, "Joint keep, recompute and offload
// planning", "Planning time with offload").
// Owns: what an offloaded group changes in the peaks — its bytes freed after its copy-out deadline in
//       forward, absent in backward until the step that fetches it back —, and which of its answers are
//       exact. Does not own: the keep/recompute peak (plan/incremental.h, which holds an offloaded group as
//       a kept one), the copy queues' timeline (schedule_offloads), the simulator's rules (plan/simulator.h).
//
// Model: with copy-ins into fresh buffers (CopyInMemory::Fresh), an offloaded group is, for every re-run,
// a kept one (its values usable, its producer never re-run for it); only its bytes differ: in forward it
// is freed after max(last forward use, copy deadline), in backward it is resident from the start of the
// step whose prefetch fetches it. So a try's peak is the committed peaks with range adds: the released
// group's, and those of the copies whose deadline or fetch step the new timeline moves.
// The simulator also fetches a value on demand when a re-run reads it before its prefetch step; that
// holds it longer than the model does, so the model's peaks are then lower bounds, step by step: its
// rejections hold, and its acceptances are marked inexact (the caller simulates that try) where a re-run
// reads a copy before the model holds it (in a step the try re-simulates), a step touches a copy whose fetch
// the try moves later before that fetch, or a prefetch moves to or before a fetch on demand. After such a try
// is taken the model is built again for the plan, with the simulator's fetches on demand: such a copy held
// from the next step on, the step's own figure the simulator's.
// With copy-ins into the engine's pool (CopyInMemory::Pooled) a fetched copy lives in a pool buffer of its size
// from its fetch (or the step that fetched it on demand) to its release in backward, and the pool keeps every
// buffer it made to the step's end: a backward step also holds, per size, its idle buffers (the most copies of
// that size in use at once so far, less those in use now). A try re-counts the sizes whose copies it moves (a
// sweep over the steps per size) and adds the change as ranges. The model's copies are held no longer than the
// simulator's, so per size its held and idle buffers together (the running maximum in use) are no more than the
// simulator's, and its peaks stay lower bounds. A fetch on demand takes or makes its buffer inside its step, so a
// try that changes that size's buffers at or before such a step is inexact.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "ration/plan/graph.h"
#include "ration/plan/incremental.h"
#include "ration/plan/planner.h"

namespace ration::memory {

class OffloadPeak {
 public:
  // `decisions` per group (`inc` holds them with every Offload as Keep). A plan with copies comes with the
  // simulator's prediction for it and the steps at which it fetched copies on demand (by storage, -1 none): each
  // such copy is held from the next step on, and the step takes the simulator's figure (the model's is below it:
  // the copy arrives inside the step).
  OffloadPeak(IncrementalPeak inc, const PlanGraph& g, const std::vector<Group>& groups, const OffloadCosts& costs,
              const std::vector<Decision>& decisions, const Prediction* simulated = nullptr,
              const std::vector<int64_t>* on_demand = nullptr);
  OffloadPeak(const OffloadPeak&) = delete;  // its peak watches reads through a pointer to held_
  OffloadPeak& operator=(const OffloadPeak&) = delete;
  // Whether every figure of the model is the simulator's (always, built without copies).
  bool in_step() const { return in_step_; }
  // Whether every forward and backward figure of `p` (the simulator's, for the committed plan) is the model's.
  bool matches(const Prediction& p) const { return inc_.matches(p); }

  int64_t peak() const { return inc_.peak(); }
  struct Price {
    int64_t peak = 0;  // below stop_at: the peak if `exact`, a lower bound of it if not; else >= stop_at
    bool exact = true;
  };
  // The peak if kept group `g` took decision `to` (Offload or Recompute); nothing changes. As
  // IncrementalPeak::peak_if, a value >= stop_at only says the peak reaches stop_at.
  Price price(size_t g, Decision to, int64_t stop_at);
  // Make group `g` take decision `to`: the last change priced, which was exact.
  void commit(size_t g, Decision to);

 private:
  // A range add on the committed peaks: forward nodes from `from` on, or backward steps [from, until).
  struct Shift {
    bool forward;
    size_t from, until;
    int64_t delta;
  };
  void apply(const std::vector<Shift>& shifts, int64_t sign);
  // Forward: the last node before its bytes are freed. Backward: the step whose prefetch fetches it.
  int64_t freed_after(size_t s, int64_t deadline) const;
  int64_t fetched_at(size_t s, int prefetch) const;
  // The constructor's last part: each copy's ranges, and the figures checked against the simulator's.
  void hold_copies(const Prediction& simulated, const std::vector<int64_t>& on_demand);
  // The shifts from the committed timeline to `tried_`, the released storage s among its copies; false
  // where a copy would be read before the model holds it (inexact).
  bool shifts_to_tried(size_t s);
  // Pooled copy-ins: the backward step from which copy t holds a pool buffer in the committed plan; the idle
  // pool bytes of one size by backward step, its copies (and `also`, -1 none) holding buffers from `start` to
  // their release; the
  // sizes whose copies the tried timeline (released storage s) moves, re-counted, their changes into shifts_.
  int64_t pool_start(size_t t) const;
  template <class Start>
  std::vector<int64_t> idle_bytes(int64_t bytes, const std::vector<int>& copies, int also, Start start) const;
  bool pool_shifts_to_tried(size_t s);  // false: inexact (a fetch on demand in or after a changed step)
  void add_idle(const std::vector<int64_t>& was, const std::vector<int64_t>& now);

  IncrementalPeak inc_;
  const PlanGraph& g_;
  const std::vector<Group>& groups_;
  const OffloadCosts& costs_;
  std::vector<Decision> by_storage_;  // the committed decisions
  OffloadSchedule schedule_;          // the committed timeline
  std::vector<int> offloaded_;        // the committed copies (storages)
  // By storage: a copy is held at the start of backward steps from held_ on (0 for the others, and for a copy
  // backward never reads); the step a re-run fetches it on demand, before its prefetch (-1: none).
  std::vector<int64_t> held_, demand_;
  std::vector<char> read_back_;       // by storage: backward reads it (a copy of it is fetched)
  bool in_step_ = true;
  // The last offload priced: its timeline (entries for the storages in written_ only) and shifts.
  OffloadSchedule tried_;
  std::vector<int> written_;
  std::vector<Shift> shifts_;
  // Pooled copy-ins (pooled()): by storage, the last backward step a copy of it is in use; by size, the
  // committed copies read back and the idle bytes by step; the last offload priced's idle bytes of the sizes
  // it changes.
  struct PoolSize {
    std::vector<int> copies;
    std::vector<int64_t> idle;
  };
  bool pooled() const { return costs_.copy_in == CopyInMemory::Pooled; }
  std::vector<int64_t> release_;
  std::map<int64_t, PoolSize> pool_;
  std::map<int64_t, std::vector<int64_t>> tried_idle_;
};

}  // namespace ration::memory
