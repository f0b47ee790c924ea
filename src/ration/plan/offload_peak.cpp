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
  by_storage_.assign(g.storages, Decision::Keep);
  held_.assign(g.storages, 0);
  demand_.assign(g.storages, -1);
  read_back_.assign(g.storages, 0);
  for (size_t v = 0; v < g.key_storage.size(); ++v)
    if (g.backward_reads[v] > 0 && g.key_storage[v] >= 0) read_back_[static_cast<size_t>(g.key_storage[v])] = 1;
  if (pooled()) {
    release_.assign(g.storages, -1);
    for (size_t s = 0; s < g.storages; ++s)
      if (read_back_[s]) release_[s] = inc_.last_release(s);
  }
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
    if (pooled() && release_[t] >= 0) pool_[b].copies.push_back(ti);
  }
  for (auto& [bytes, size] : pool_) {  // each size's idle buffers
    size.idle = idle_bytes(bytes, size.copies, -1, [&](size_t t) { return pool_start(t); });
    shifts_.clear();
    add_idle(std::vector<int64_t>(g_.steps, 0), size.idle);
    apply(shifts_, 1);
  }
  shifts_.clear();
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
    if (sh.forward) inc_.add_forward(sh.from, sign * sh.delta);
    else inc_.add_backward(sh.from, sh.until, sign * sh.delta);
  }
}

// A copy fetched on demand holds its buffer from inside that step (the model holds its bytes from the next).
int64_t OffloadPeak::pool_start(size_t t) const {
  return demand_[t] >= 0 ? std::min(demand_[t], held_[t]) : held_[t];
}

// As the simulator's pool: a buffer made where every one of its size is in use, kept to the step's end.
template <class Start>
std::vector<int64_t> OffloadPeak::idle_bytes(int64_t bytes, const std::vector<int>& copies, int also, Start start) const {
  std::vector<int64_t> change(g_.steps + 1, 0), idle(g_.steps, 0);
  auto hold = [&](size_t t) {
    const int64_t from = start(t);
    if (from > release_[t]) return;
    ++change[static_cast<size_t>(from)];
    --change[static_cast<size_t>(release_[t]) + 1];
  };
  for (const int t : copies) hold(static_cast<size_t>(t));
  if (also >= 0) hold(static_cast<size_t>(also));
  int64_t in_use = 0, made = 0;
  for (size_t j = 0; j < g_.steps; ++j) {
    in_use += change[j];
    made = std::max(made, in_use);
    idle[j] = bytes * (made - in_use);
  }
  return idle;
}

// The change from `was` to `now`, as ranges of equal change.
void OffloadPeak::add_idle(const std::vector<int64_t>& was, const std::vector<int64_t>& now) {
  for (size_t j = 0; j < now.size();) {
    const int64_t delta = now[j] - was[j];
    size_t k = j + 1;
    while (k < now.size() && now[k] - was[k] == delta) ++k;
    if (delta != 0) shifts_.push_back({false, j, k, delta});
    j = k;
  }
}

bool OffloadPeak::pool_shifts_to_tried(size_t s) {
  tried_idle_.clear();
  std::map<int64_t, int64_t> first_change;  // by re-counted size: the first step whose buffers the try changes
  auto changes = [&](int64_t bytes, int64_t step) {
    auto [it, fresh] = first_change.emplace(bytes, step);
    if (!fresh) it->second = std::min(it->second, step);
  };
  // Each copy's buffer in the tried timeline: moved with its prefetch, or kept where a fetch on demand comes first.
  auto start = [&](size_t t) {
    if (t == s) return fetched_at(s, tried_.prefetch[s]);
    if (tried_.prefetch[t] == schedule_.prefetch[t]) return pool_start(t);
    const int64_t now = fetched_at(t, tried_.prefetch[t]);
    return demand_[t] >= 0 && now > demand_[t] ? pool_start(t) : now;
  };
  const int64_t bs = g_.profile.storages[s].bytes;
  if (release_[s] >= 0) changes(bs, start(s));
  for (const int ti : offloaded_) {
    const auto t = static_cast<size_t>(ti);
    if (release_[t] >= 0 && start(t) != pool_start(t))
      changes(g_.profile.storages[t].bytes, std::min(start(t), pool_start(t)));
  }
  bool exact = true;
  for (const auto& [bytes, first] : first_change) {
    std::vector<int64_t>& idle = tried_idle_[bytes];
    PoolSize& committed = pool_[bytes];  // a size new to the pool: no copies, nothing idle
    if (committed.idle.empty()) committed.idle.assign(g_.steps, 0);
    // A fetch on demand takes or makes its buffer inside its step, after the step's start: where the try changes
    // this size's buffers before or at that step, the step's figure changes unevenly (inexact).
    for (const int t : committed.copies) exact = exact && demand_[static_cast<size_t>(t)] < first;
    idle = idle_bytes(bytes, committed.copies, bytes == bs && release_[s] >= 0 ? static_cast<int>(s) : -1, start);
    add_idle(committed.idle, idle);
  }
  return exact;
}

bool OffloadPeak::shifts_to_tried(size_t s) {
  shifts_.clear();
  bool exact = true;
  const auto nn = static_cast<int64_t>(g_.nodes);
  auto forward = [&](int64_t after, int64_t delta) {
    if (after + 1 < nn) shifts_.push_back({true, static_cast<size_t>(after + 1), 0, delta});
  };
  auto backward = [&](int64_t until, int64_t delta) {
    if (until > 0) shifts_.push_back({false, 0, static_cast<size_t>(until), delta});
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
  if (pooled() && !pool_shifts_to_tried(s)) exact = false;
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
  const int64_t bs = g_.profile.storages[s].bytes;
  if (pooled() && release_[s] >= 0) pool_[bs].copies.push_back(static_cast<int>(s));
  for (auto& [bytes, idle] : tried_idle_) pool_[bytes].idle = std::move(idle);
  tried_idle_.clear();
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
