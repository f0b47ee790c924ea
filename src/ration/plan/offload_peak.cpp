#include "ration/plan/offload_peak.h"

#include <algorithm>
#include <utility>

#include "ration/base/check.h"
#include "ration/plan/simulator.h"

namespace ration::memory {

OffloadPeak::OffloadPeak(IncrementalPeak inc, const PlanGraph& g, const std::vector<Group>& groups,
                         const OffloadCosts& costs, const std::vector<Decision>& decisions)
    : inc_(std::move(inc)), g_(g), groups_(groups), costs_(costs) {
  RATION_ASSERT(costs.copy_in == CopyInMemory::Fresh, "offload peak: copy-ins into the pool are simulated");
  by_storage_.assign(g.storages, Decision::Keep);
  for (size_t i = 0; i < groups.size(); ++i) {
    RATION_ASSERT(decisions[i] != Decision::Offload, "offload peak: starts from a keep/recompute plan");
    by_storage_[static_cast<size_t>(groups[i].storage)] = decisions[i];
  }
  schedule_ = schedule_offloads(g, by_storage_, costs);
  fetch_.assign(g.storages, 0);
  read_back_.assign(g.storages, 0);
  for (size_t v = 0; v < g.key_storage.size(); ++v)
    if (g.backward_reads[v] > 0 && g.key_storage[v] >= 0) read_back_[static_cast<size_t>(g.key_storage[v])] = 1;
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
    else inc_.add_backward(sh.at, sign * sh.delta);
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
    if (tried_.prefetch[t] != schedule_.prefetch[t] && read_back_[t]) {
      const int64_t now = fetched_at(t, tried_.prefetch[t]);
      if (now != fetch_[t]) {
        backward(fetch_[t], bt);
        backward(now, -bt);
        // Fetched later: a re-run reading it in between would fetch it on demand.
        exact = exact && (now < fetch_[t] || inc_.first_touch(t) >= now);
      }
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
    p.exact = p.peak >= stop_at || !inc_.last_touches_before(fetch_);
    return p;
  }
  by_storage_[s] = Decision::Offload;
  tried_ = schedule_offloads(g_, by_storage_, costs_);
  by_storage_[s] = Decision::Keep;
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
  schedule_ = std::move(tried_);
  for (const int t : offloaded_) fetch_[static_cast<size_t>(t)] = fetched_at(static_cast<size_t>(t), schedule_.prefetch[static_cast<size_t>(t)]);
}

}  // namespace ration::memory
