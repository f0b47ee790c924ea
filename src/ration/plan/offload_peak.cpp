#include "ration/plan/offload_peak.h"

#include <algorithm>
#include <utility>

#include "ration/base/check.h"
#include "ration/plan/simulator.h"

namespace ration::memory {

OffloadPeak::OffloadPeak(IncrementalPeak inc, const PlanGraph& g, const std::vector<Group>& groups,
                         const OffloadCosts& costs, const std::vector<Decision>& decisions, const Prediction* simulated,
                         const std::vector<int64_t>* on_demand)
    : inc_(std::move(inc)), g_(g), groups_(groups), costs_(costs) {
  RATION_ASSERT(costs.copy_in == CopyInMemory::Fresh, "offload peak: copy-ins into the pool are simulated");
  by_storage_.assign(g.storages, Decision::Keep);
  held_.assign(g.storages, 0);
  demand_.assign(g.storages, -1);
  read_back_.assign(g.storages, 0);
  for (size_t v = 0; v < g.key_storage.size(); ++v)
    if (g.backward_reads[v] > 0 && g.key_storage[v] >= 0) read_back_[static_cast<size_t>(g.key_storage[v])] = 1;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto s = static_cast<size_t>(groups[i].storage);
    by_storage_[s] = decisions[i];
    if (decisions[i] != Decision::Offload) continue;
    inc_.mark_offloaded(i);
    offloaded_.push_back(static_cast<int>(s));
  }
  inc_.watch_reads(&held_);
  schedule_ = schedule_offloads(g, by_storage_, costs);
  tried_ = schedule_;
  written_ = offloaded_;
  if (offloaded_.empty()) return;
  RATION_ASSERT(simulated != nullptr && on_demand != nullptr, "offload peak: a plan with copies needs its simulation");
  hold_copies(*simulated, *on_demand);
}

// Each copy freed in forward after its deadline, held in backward from its prefetch step or the step after
// its fetch on demand; a step that fetches on demand takes the simulator's figure. Every other figure must
// be the simulator's already (in_step_).
void OffloadPeak::hold_copies(const Prediction& p, const std::vector<int64_t>& on_demand) {
  std::vector<char> demand_step(g_.steps, 0);
  for (const int ti : offloaded_) {
    const auto t = static_cast<size_t>(ti);
    const int64_t b = g_.profile.storages[t].bytes;
    inc_.add_forward(static_cast<size_t>(freed_after(t, schedule_.deadline[t]) + 1), -b);
    if (!read_back_[t]) continue;
    demand_[t] = on_demand[t];
    held_[t] = demand_[t] >= 0 ? demand_[t] + 1 : fetched_at(t, schedule_.prefetch[t]);
    if (demand_[t] >= 0) demand_step[static_cast<size_t>(demand_[t])] = 1;
    inc_.add_backward(0, static_cast<size_t>(held_[t]), -b);
  }
  in_step_ = p.forward_peaks.size() == g_.nodes && p.backward_peaks.size() == g_.steps;
  for (size_t k = 0; in_step_ && k < g_.nodes; ++k) in_step_ = inc_.forward_value(k) == p.forward_peaks[k];
  for (size_t j = 0; in_step_ && j < g_.steps; ++j) {
    const int64_t v = inc_.backward_value(j);
    if (v == p.backward_peaks[j]) continue;
    in_step_ = demand_step[j] && v < p.backward_peaks[j];
    if (in_step_) inc_.set_backward_value(j, p.backward_peaks[j]);
  }
}

// As the simulator: a copy is freed after the later of its last forward use and its deadline.
int64_t OffloadPeak::freed_after(size_t s, int64_t deadline) const { return std::max(g_.last_alive[s], deadline); }

// As the simulator's prefetch: fetched at the first backward step whose ordinal is at most its first use
// plus its prefetch distance (or a step before it that ran a lower ordinal).
int64_t OffloadPeak::fetched_at(size_t s, int prefetch) const {
  if (!read_back_[s]) return 0;
  return static_cast<int64_t>(g_.first_step_at_or_below(g_.key_span.first_use[s] + prefetch));
}

void OffloadPeak::apply(const std::vector<Shift>& shifts, int64_t sign) {
  for (const Shift& sh : shifts) {
    if (sh.forward) inc_.add_forward(sh.at, sign * sh.delta);
    else inc_.add_backward(0, sh.at, sign * sh.delta);
  }
}

bool OffloadPeak::shifts_to_tried(size_t s) {
  shifts_.clear();
  bool exact = true;
  const auto nn = static_cast<int64_t>(g_.nodes);
  auto forward = [&](int64_t after, int64_t delta) {
    if (after + 1 < nn) shifts_.push_back({true, static_cast<size_t>(after + 1), delta});
  };
  auto backward = [&](int64_t until, int64_t delta) {
    if (until > 0) shifts_.push_back({false, static_cast<size_t>(until), delta});
  };
  const int64_t b = g_.profile.storages[s].bytes;
  forward(freed_after(s, tried_.deadline[s]), -b);
  if (read_back_[s]) {
    const int64_t at = fetched_at(s, tried_.prefetch[s]);
    backward(at, -b);
    exact = exact && inc_.first_touch(s) >= at;
  }
  for (const int ti : offloaded_) {
    const auto t = static_cast<size_t>(ti);
    const int64_t bt = g_.profile.storages[t].bytes;
    if (tried_.deadline[t] != schedule_.deadline[t]) {
      const int64_t was = freed_after(t, schedule_.deadline[t]), now = freed_after(t, tried_.deadline[t]);
      if (was != now) {
        forward(was, bt);
        forward(now, -bt);
      }
    }
    if (tried_.prefetch[t] == schedule_.prefetch[t] || !read_back_[t]) continue;
    const int64_t now = fetched_at(t, tried_.prefetch[t]);
    if (demand_[t] >= 0) {
      // Fetched on demand at demand_[t]: a prefetch still later changes nothing. One at or before that step
      // holds it from the step's start instead (not modelled: inexact): held from `now`, the step itself left
      // at the simulator's figure (which holds it from inside the step), a lower bound.
      if (now > demand_[t]) continue;
      exact = false;
      backward(demand_[t], bt);
      backward(now, -bt);
      continue;
    }
    // Fetched later: a re-run reading it in between would fetch it on demand.
    exact = exact && (now < held_[t] || inc_.first_touch(t) >= now);
    if (now != held_[t]) {
      backward(held_[t], bt);
      backward(now, -bt);
    }
  }
  return exact;
}

OffloadPeak::Price OffloadPeak::price(size_t g, Decision to, int64_t stop_at) {
  const auto s = static_cast<size_t>(groups_[g].storage);
  RATION_ASSERT(by_storage_[s] == Decision::Keep && to != Decision::Keep, "offload peak: prices releases of kept groups");
  Price p;
  if (to == Decision::Recompute) {
    p.peak = inc_.peak_if(g, Decision::Recompute, stop_at);
    p.exact = p.peak >= stop_at || !inc_.last_read_early();
    return p;
  }
  // The timeline with s among the copies, in tried_ (only the entries the last timeline wrote are reset).
  for (const int t : written_) {
    tried_.deadline[static_cast<size_t>(t)] = -1;
    tried_.prefetch[static_cast<size_t>(t)] = 0;
  }
  written_ = offloaded_;
  written_.push_back(static_cast<int>(s));
  schedule_offloads(g_, written_, costs_, tried_);
  p.exact = shifts_to_tried(s);
  apply(shifts_, 1);
  p.peak = inc_.peak();
  apply(shifts_, -1);
  p.exact = p.exact || p.peak >= stop_at;
  return p;
}

void OffloadPeak::commit(size_t g, Decision to) {
  const auto s = static_cast<size_t>(groups_[g].storage);
  by_storage_[s] = to;
  if (to == Decision::Recompute) {
    inc_.set(g, Decision::Recompute);
    return;
  }
  apply(shifts_, 1);
  inc_.mark_offloaded(g);
  offloaded_.push_back(static_cast<int>(s));
  std::swap(schedule_, tried_);  // tried_ now holds the entries of the copies before s: written_ minus s
  // The shifts moved each copy's held range as priced: to its new prefetch step, or kept where a fetch on
  // demand comes first.
  for (const int ti : offloaded_) {
    const auto t = static_cast<size_t>(ti);
    const int64_t now = fetched_at(t, schedule_.prefetch[t]);
    if (demand_[t] < 0 || now <= demand_[t]) held_[t] = now;
  }
}

}  // namespace ration::memory
