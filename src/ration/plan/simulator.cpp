#include "ration/plan/simulator.h"

#include <algorithm>

#include "ration/base/check.h"

namespace ration::memory {

Simulator::Simulator(const PlanGraph& g, const std::vector<Decision>& decision, int64_t extra,
                     const OffloadSchedule* schedule, const std::map<int64_t, int64_t>* store_from)
    : g_(g),
      storages_(g.profile.storages),
      decision_(decision),
      extra_(extra),
      schedule_(schedule),
      saved_at_(g.key_span.saved_at),
      first_use_(g.key_span.first_use),
      key_storage_(g.key_storage),
      pending_(g.backward_reads),
      store_from_(store_from) {
  RATION_ASSERT(g.saved_not_output < 0, "simulator: a saved value of node ", g.saved_not_output, " is not an output of its node");
  const size_t ns = g.storages, nn = g.nodes;
  fetched_.assign(ns, 0);
  cache_.assign(nn, 0);
  transient_.assign(ns, 0);
}

// One step: forward (run_forward), the key states backward starts from (start_backward), every backward
// step (run_backward), then where the peak is and the copy-in pool (finish).
Prediction Simulator::run() {
  Prediction pred;
  PeakAt at;
  if (run_forward(pred, at)) return pred;
  std::vector<int64_t> measured_holders(g_.storages, 0);
  start_backward(measured_holders);
  if (run_backward(pred, at, measured_holders)) return pred;
  finish(pred, at);
  return pred;
}

// Forward: measured peak minus saved storages the measured run held, plus what this plan holds. Events
// per node: storages allocated there (both runs hold them), dropped storages released after their last
// forward use (this plan only).
inline bool Simulator::run_forward(Prediction& pred, PeakAt& at) {
  const size_t ns = g_.storages, nn = g_.nodes;
  std::vector<int64_t> alloc_at(nn, 0), release_after(nn, 0);
  offloaded_bytes_ = 0;
  for (size_t s = 0; s < ns; ++s) {
    if (!droppable(static_cast<int64_t>(s))) continue;
    alloc_at[static_cast<size_t>(storages_[s].allocated_by)] += storages_[s].bytes;
    if (decision_[s] == Decision::Offload) offloaded_bytes_ += storages_[s].bytes;
    if (dropped(s)) {
      // Recomputed: freed when model code lets go. Offloaded: and when its copy is done.
      const int64_t copied = decision_[s] == Decision::Offload ? schedule_->deadline[s] : saved_at_[s];
      const int64_t last = std::max(g_.last_alive[s], copied);
      if (last < static_cast<int64_t>(nn)) release_after[static_cast<size_t>(last)] += storages_[s].bytes;
    }
  }
  int64_t measured_saved = 0, planned_saved = 0;
  pred.forward_peaks.reserve(nn);
  for (size_t k = 0; k < nn; ++k) {
    measured_saved += alloc_at[k];
    planned_saved += alloc_at[k];
    const int64_t peak = g_.peak_bytes[k] - measured_saved + planned_saved + extra_;
    pred.forward_peaks.push_back(peak);
    if (record_peak(pred, peak, /*backward=*/false, static_cast<int64_t>(k), at)) return true;
    planned_saved -= release_after[k];
  }
  return false;
}

// Every saved value's state as backward starts, the holders of each storage (this plan's and, in
// `measured_holders`, the measured run's), and the offloaded storages in the order prefetch fetches them.
inline void Simulator::start_backward(std::vector<int64_t>& measured_holders) {
  const size_t ns = g_.storages, nk = pending_.size();
  orig_holders_.assign(ns, 0);
  rec_holders_.assign(ns, 0);
  resident_ = 0;
  state_.assign(nk, KeyState::Absent);
  first_key_.assign(ns, -1);
  last_key_.assign(ns, -1);
  next_key_.assign(nk, -1);
  unfetched_.clear();
  for (size_t k = 0; k < nk; ++k) {  // every saved value, in key order
    if (pending_[k] == 0) continue;
    const int64_t s = key_storage_[k];
    if (!droppable(s)) {  // e.g. a view of a parameter: never dropped, its memory is not ours to plan
      state_[k] = KeyState::Kept;
      continue;
    }
    const auto su = static_cast<size_t>(s);
    measured_holders[su] += 1;
    if (!dropped(su)) {
      hold(orig_holders_, s, +1);
      state_[k] = KeyState::Kept;
    } else if (decision_[su] == Decision::Offload) {
      state_[k] = KeyState::Offloaded;
      if (first_key_[su] < 0) {
        unfetched_.push_back(s);
        first_key_[su] = static_cast<int>(k);
      } else {
        next_key_[static_cast<size_t>(last_key_[su])] = static_cast<int>(k);
      }
      last_key_[su] = static_cast<int>(k);
    } else {
      state_[k] = KeyState::Dropped;
    }
  }
  // Fetched at the first backward node whose ordinal is at most first use + prefetch distance: latest
  // such ordinal first, so that each step fetches a prefix of what is left (a step with a higher ordinal
  // than an earlier one finds its storages fetched already).
  std::sort(unfetched_.begin(), unfetched_.end(), [&](int64_t a, int64_t b) {
    return fetch_from(a) != fetch_from(b) ? fetch_from(a) > fetch_from(b) : a < b;
  });
}

inline bool Simulator::run_backward(Prediction& pred, PeakAt& at, std::vector<int64_t>& measured_holders) {
  const StepProfile& p = g_.profile;
  std::vector<int> measured_pending = pending_;
  size_t next_fetch = 0;
  // What the measured (keep-everything) run held: every saved storage until its last use.
  int64_t measured_resident = 0;
  for (size_t s = 0; s < g_.storages; ++s)
    if (measured_holders[s] > 0) measured_resident += storages_[s].bytes;
  pred.backward_peaks.reserve(g_.steps);
  for (size_t j = 0; j < g_.steps; ++j) {
    const int64_t ord = p.backward_order[j];
    const auto saved = g_.saved[static_cast<size_t>(ord)];
    // Measured in the keep-everything run: what the node needs beyond saved values (gradients,
    // its backward workspace) and what was live besides saved values as it started.
    const int64_t transient_other = p.backward_peak_bytes[j] - measured_resident;
    const int64_t start_other = p.backward_start_bytes[j] - measured_resident;
    ++stamp_;  // a new recompute cache: no re-runs, no transients
    transient_bytes_ = 0;
    // Prefetch: offloaded storages whose first use is within their distance are fetched back now.
    prefetching_ = true;
    for (; next_fetch < unfetched_.size() && fetch_from(unfetched_[next_fetch]) >= ord; ++next_fetch)
      fetch(unfetched_[next_fetch]);  // a no-op where fetched on demand meanwhile
    prefetching_ = false;
    frame_bytes_ = 0;
    step_ = static_cast<int64_t>(j);
    recompute_peak_ = resident_;
    for (const int k : saved) ensure(k, pred);
    // Two phases: rebuilding (producers' forward workspace on top of what is live), then the node's
    // own backward with rebuilt values held by the recompute cache.
    const int64_t peak = std::max(start_other + recompute_peak_, transient_other + resident_ + transient_bytes_) + extra_;
    pred.backward_peaks.push_back(peak);
    if (record_peak(pred, peak, /*backward=*/true, ord, at)) return true;
    release_saved(saved, measured_pending, measured_holders, measured_resident);
  }
  return false;
}

// Release after a backward node: pending uses of its saved keys, in this plan and in the measured run.
inline void Simulator::release_saved(plan_detail::Lists<int>::Span saved, std::vector<int>& measured_pending,
                              std::vector<int64_t>& measured_holders, int64_t& measured_resident) {
  for (const int id : saved) {
    const auto k = static_cast<size_t>(id);
    const int64_t s = key_storage_[k];
    if (--measured_pending[k] == 0 && droppable(s) && --measured_holders[static_cast<size_t>(s)] == 0)
      measured_resident -= storages_[static_cast<size_t>(s)].bytes;
    if (--pending_[k] > 0) continue;
    if (s < 0) continue;
    if (droppable(s) && state_[k] == KeyState::Kept) hold(orig_holders_, s, -1);
    if (droppable(s) && state_[k] == KeyState::Restored) hold(rec_holders_, s, -1);
    state_[k] = KeyState::Released;
  }
}

inline void Simulator::finish(Prediction& pred, const PeakAt& at) const {
  if (at.node >= 0)
    pred.peak_at = std::string(at.backward ? "backward " : "forward ") + g_.profile.nodes[static_cast<size_t>(at.node)].op +
                   "#" + std::to_string(at.node);
  for (const auto& [bytes, count] : pool_max_) {
    pred.copy_in_pool[bytes] = count;
    pred.copy_in_pool_bytes += bytes * count;
  }
}

// An offloaded storage comes back whole (one buffer); each of its keys holds it until its last use.
void Simulator::fetch(int64_t s) {
  if (fetched_[static_cast<size_t>(s)]) return;
  fetched_[static_cast<size_t>(s)] = 1;
  if (on_demand_ != nullptr && !prefetching_) (*on_demand_)[static_cast<size_t>(s)] = step_;
  for (int k = first_key_[static_cast<size_t>(s)]; k >= 0; k = next_key_[static_cast<size_t>(k)]) {
    if (state_[static_cast<size_t>(k)] != KeyState::Offloaded) continue;
    state_[static_cast<size_t>(k)] = KeyState::Restored;
    hold(rec_holders_, s, +1);
  }
}

// A storage instance is resident while it has holders; track the byte total incrementally.
void Simulator::hold(std::vector<int64_t>& holders, int64_t s, int delta) {
  int64_t& h = holders[static_cast<size_t>(s)];
  const bool before = h > 0;
  h += delta;
  const bool after = h > 0;
  if (before == after) return;
  const int64_t bytes = storages_[static_cast<size_t>(s)].bytes;
  if (&holders == &rec_holders_ && pooled(s)) {
    // A fetched storage lives in a copy-in pool buffer of its size: a new buffer only when every one made
    // this step is in use; a released one stays in the pool until the step ends (OffloadEngine::end_step).
    int64_t& in_use = pool_in_use_[bytes];
    int64_t& made = pool_max_[bytes];
    in_use += after ? 1 : -1;
    if (in_use > made) {
      made = in_use;
      resident_ += bytes;
    }
    return;
  }
  resident_ += (after ? 1 : -1) * bytes;
}

bool Simulator::usable(int k) const {
  const KeyState st = state(k);
  return st == KeyState::Kept || st == KeyState::Restored;
}

void Simulator::ensure(int k, Prediction& pred) {
  if (g_.is_leaf(k) || usable(k)) return;
  if (state(k) == KeyState::Offloaded) {
    fetch(key_storage_[static_cast<size_t>(k)]);  // needed before its prefetch point: fetched on demand
    return;
  }
  rerun(g_.producer(k), g_.output(k), /*store_required=*/true, pred);
}

// A re-run of `ord` made to feed another re-run during this backward step keeps nothing.
bool Simulator::transient(int64_t ord) const {
  if (store_from_ == nullptr) return false;
  auto it = store_from_->find(ord);
  return it != store_from_->end() && step_ < it->second;
}

// Re-run producer `ord` for its output `out`. A storing re-run (once per backward node) rebuilds
// non-usable inputs, allocates its storages (held by the recompute cache until the node ends) and
// stores outputs whose keys are dropped and still awaited; returns 0. A transient re-run (each time it
// is asked) stores and caches nothing; returns the bytes its caller then holds: output `out`'s fresh
// storage, or the held input it is a view of. Inputs from transient re-runs are held while it runs.
int64_t Simulator::rerun(int64_t ord, int out, bool store_required, Prediction& pred) {
  const auto o = static_cast<size_t>(ord);
  if (cache_[o] == stamp_) return 0;
  const bool is_transient = !store_required && transient(ord);
  if (!is_transient) cache_[o] = stamp_;
  std::vector<std::pair<int64_t, int64_t>> held;  // (storage, bytes) of inputs this re-run holds
  for (const auto& in : g_.inputs[o]) {
    if (in.producer < 0) continue;  // a leaf: always usable
    const int k = in.value;
    if (usable(k)) continue;
    if (state(k) == KeyState::Offloaded) {
      fetch(storage(in));  // as SavedValue::materialize: an offloaded input is fetched, not re-run
      continue;
    }
    const int64_t b = rerun(in.producer, in.output, /*store_required=*/false, pred);
    if (b > 0) {
      held.emplace_back(storage(in), b);
      frame_bytes_ += b;
    }
  }
  pred.recompute_ms += g_.forward_ms[o];
  pred.recomputed_nodes += 1;
  // The producer allocates its fresh storages; while it runs, its measured forward workspace comes on top.
  int64_t fresh = 0;
  const auto allocated = g_.allocated[o];
  for (const int st : allocated) {
    const auto su = static_cast<size_t>(st);
    if (is_transient) {
      fresh += storages_[su].bytes;
    } else if (transient_[su] != stamp_) {
      transient_[su] = stamp_;
      transient_bytes_ += storages_[su].bytes;
    }
  }
  const int64_t workspace = std::max<int64_t>(0, g_.peak_bytes[o] - g_.end_bytes[o]);
  recompute_peak_ = std::max(recompute_peak_, resident_ + transient_bytes_ + frame_bytes_ + fresh + workspace);
  for (const auto& h : held) frame_bytes_ -= h.second;
  const size_t first = g_.first_output(o), outputs = g_.first_output(o + 1) - first;
  if (is_transient) {
    RATION_CHECK(out >= 0 && static_cast<size_t>(out) < outputs, "simulator: node ", ord, " has no output ", out);
    const int64_t s = g_.storage[first + static_cast<size_t>(out)];
    if (std::find(allocated.begin(), allocated.end(), s) != allocated.end())
      return storages_[static_cast<size_t>(s)].bytes;
    for (const auto& h : held)
      if (h.first == s) return h.second;
    return 0;
  }
  // Outputs whose keys were dropped and are still awaited are stored: their storage instance moves
  // from the cache's transients to the resident set (a view restored later moves its base likewise).
  for (size_t j = 0; j < outputs; ++j) {
    KeyState& st = state_[first + j];
    if (st != KeyState::Dropped) continue;
    st = KeyState::Restored;
    const int64_t storage = g_.storage[first + j];
    if (storage < 0) continue;
    hold(rec_holders_, storage, +1);
    if (transient_[static_cast<size_t>(storage)] == stamp_) {
      transient_[static_cast<size_t>(storage)] = 0;
      transient_bytes_ -= storages_[static_cast<size_t>(storage)].bytes;
    }
  }
  return 0;
}

Prediction simulate(const StepProfile& profile, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const OffloadSchedule* schedule) {
  return simulate(profile, decision, extra_fixed_bytes, {}, schedule);
}

OffloadSchedule schedule_offloads(const StepProfile& profile, const std::vector<Decision>& decision, const OffloadCosts& c) {
  return schedule_offloads(PlanGraph(profile), decision, c);
}

OffloadSchedule schedule_offloads(const PlanGraph& g, const std::vector<Decision>& decision, const OffloadCosts& c) {
  OffloadSchedule sch;
  sch.deadline.assign(g.storages, -1);
  sch.prefetch.assign(g.storages, 0);
  std::vector<int> offloaded;
  for (size_t s = 0; s < g.storages; ++s)
    if (decision[s] == Decision::Offload) offloaded.push_back(static_cast<int>(s));
  schedule_offloads(g, offloaded, c, sch);
  return sch;
}

void schedule_offloads(const PlanGraph& g, const std::vector<int>& offloaded, const OffloadCosts& c, OffloadSchedule& sch) {
  const StepProfile& p = g.profile;
  const size_t nn = g.nodes;
  sch.copy_in = c.copy_in;
  sch.stall_ms = 0;
  if (nn == 0) return;
  const SaveSpan& span = save_span(g);
  const std::vector<int64_t>& saved_at = span.saved_at;
  const std::vector<int64_t>& first_use = span.first_use;
  auto bytes_of = [&](size_t s) { return static_cast<double>(p.storages[s].bytes); };
  // Forward: node k ends at end_f[k] (measured forward times); Q2 copies in order of saving (ties: storage).
  const std::vector<double>& end_f = g.forward_end;
  std::vector<size_t> order;
  for (const int s : offloaded)
    if (saved_at[static_cast<size_t>(s)] >= 0) order.push_back(static_cast<size_t>(s));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return saved_at[a] != saved_at[b] ? saved_at[a] < saved_at[b] : a < b; });
  // The queue at the measured bandwidth (its finish predicts the stall) and at 1/margin of it (where
  // each copy's deadline goes: a copy that slow still lands by the end of that node).
  double free_at = 0, slow_free_at = 0;
  const double margin = std::max(1.0, c.deadline_margin);
  for (size_t s : order) {
    const auto from = static_cast<size_t>(saved_at[s]);
    const double copy = c.per_copy_ms + bytes_of(s) / c.write_bytes_per_ms;
    free_at = std::max(end_f[from], free_at) + copy;
    slow_free_at = std::max(end_f[from], slow_free_at) + margin * copy;
    const auto k = static_cast<int64_t>(std::lower_bound(end_f.begin() + static_cast<std::ptrdiff_t>(from), end_f.end(),
                                                         slow_free_at) - end_f.begin());
    sch.deadline[s] = std::min<int64_t>(k, static_cast<int64_t>(nn) - 1);
  }
  sch.stall_ms += std::max(0.0, free_at - end_f[nn - 1]);
  // Backward: node j (execution order) starts at start_b[j]; a read for first use u issued with
  // distance d starts at the first node whose ordinal is <= u + d (the executor's rule).
  const auto& bo = p.backward_order;
  if (bo.empty()) return;
  const std::vector<double>& start_b = g.backward_start;
  std::vector<std::pair<size_t, size_t>> reads;  // (need index, storage)
  for (size_t s : order) reads.emplace_back(g.first_step_at_or_below(first_use[s]), s);
  std::stable_sort(reads.begin(), reads.end());
  double free_b = 0;
  for (const auto& [need_j, s] : reads) {
    const double need = start_b[need_j];
    const double copy = c.per_copy_ms + bytes_of(s) / c.read_bytes_per_ms;
    // The shortest distance from min_prefetch on whose read lands by `need`, or issues at the first
    // backward node, or exceeds the node count. A longer distance issues no later (the issuing step does
    // not increase with the ordinal, start_b does not decrease with the step), so each of the three holds
    // from some distance on: the first distance where one holds is found by bisection.
    auto issue_at = [&](int d) { return g.first_step_at_or_below(first_use[s] + d); };
    auto done_by = [&](size_t issue) { return std::max(start_b[issue], free_b) + copy; };
    auto enough = [&](int d) {
      if (d > static_cast<int>(nn)) return true;
      const size_t issue = issue_at(d);
      return issue == 0 || done_by(issue) <= need;
    };
    int lo = c.min_prefetch, hi = std::max(c.min_prefetch, static_cast<int>(nn) + 1);  // enough(hi) holds
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (enough(mid)) hi = mid;
      else lo = mid + 1;
    }
    const int d = lo;
    const double done = done_by(issue_at(d));
    sch.prefetch[s] = d;
    free_b = done;
    sch.stall_ms += std::max(0.0, done - need);
  }
}

void relax_deadlines(const StepProfile& profile, const std::vector<Decision>& decision,
                     const std::vector<int64_t>& forward_peaks, int64_t bound, OffloadSchedule& sch) {
  relax_deadlines(PlanGraph(profile), decision, forward_peaks, bound, sch);
}

void relax_deadlines(const PlanGraph& g, const std::vector<Decision>& decision, const std::vector<int64_t>& forward_peaks,
                     int64_t bound, OffloadSchedule& sch) {
  const StepProfile& p = g.profile;
  const auto nn = static_cast<int64_t>(g.nodes);
  if (nn == 0 || static_cast<int64_t>(forward_peaks.size()) != nn) return;
  std::vector<int64_t> peaks = forward_peaks;  // with the storages held so far
  const SaveSpan& span = save_span(g);
  const std::vector<int64_t>& saved_at = span.saved_at;
  std::vector<size_t> order;  // Q2's order: saving order
  for (size_t s = 0; s < decision.size(); ++s)
    if (decision[s] == Decision::Offload && saved_at[s] >= 0 && sch.deadline[s] >= 0) order.push_back(s);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return saved_at[a] < saved_at[b]; });
  // One node at a time, round robin, so the copies that share headroom share it evenly. Holding a
  // storage through node k is counted as its bytes on top of k's peak (an upper bound: a storage model
  // code still holds there costs nothing more).
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t s : order) {
      const int64_t next = sch.deadline[s] + 1;
      if (next >= nn) continue;
      const int64_t bytes = p.storages[s].bytes;
      if (peaks[static_cast<size_t>(next)] + bytes > bound) continue;
      peaks[static_cast<size_t>(next)] += bytes;
      sch.deadline[s] = next;
      moved = true;
    }
  }
}

Prediction simulate(const StepProfile& profile, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule) {
  return simulate(PlanGraph(profile), decision, extra_fixed_bytes, store_from, schedule);
}

Prediction simulate(const PlanGraph& g, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule) {
  return simulate(g, decision, extra_fixed_bytes, store_from, schedule, std::numeric_limits<int64_t>::max(), nullptr);
}

Prediction simulate(const PlanGraph& g, const std::vector<Decision>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule, int64_t stop_at,
                    bool* stopped, std::vector<int64_t>* fetched_on_demand) {
  const StepProfile& profile = g.profile;
  RATION_ASSERT(decision.size() == profile.storages.size(), "decision vector size mismatch");
  const bool any_offload = std::find(decision.begin(), decision.end(), Decision::Offload) != decision.end();
  RATION_ASSERT(!any_offload || schedule != nullptr, "offloaded storages need a schedule");
  Simulator sim(g, decision, extra_fixed_bytes, schedule, store_from.empty() ? nullptr : &store_from);
  sim.stop_at(stop_at);
  sim.record_on_demand(fetched_on_demand);
  Prediction pred = sim.run();
  if (stopped != nullptr) *stopped = sim.stopped();
  if (any_offload) {
    pred.offload_stall_ms = schedule->stall_ms;
    pred.offloaded_bytes = sim.offloaded_bytes();
  }
  return pred;
}

}  // namespace ration::memory
