#include "ration/memory/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <unordered_set>

#include "ration/core/check.h"
#include "ration/memory/allocator.h"

namespace ration::memory {
namespace {

bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// ---- the simulator ------------------------------------------------------------------------------
// Mirrors SavedValue/Node::recompute/engine: a key is usable without recompute iff it is pinned, or saved
// and kept (until its last use), or restored by a recompute (until its last use). Memory is counted by
// storage instance: the original (alive while a kept key holds it), a recomputed instance (alive while a
// restored key holds it), per-backward-node transients (freed when the node's recompute cache ends), and
// the outputs of transient re-runs (Plan::store_from), held only by the re-run that consumes them.
class Simulator {
 public:
  Simulator(const StepProfile& p, const std::vector<char>& dropped, int64_t extra,
            const OffloadSchedule* schedule = nullptr, const std::map<int64_t, int64_t>* store_from = nullptr)
      : p_(p), dropped_(dropped), extra_(extra), schedule_(schedule), store_from_(store_from) {
    const size_t ns = p.storages.size();
    saved_at_.assign(ns, -1);
    first_use_.assign(ns, -1);
    // A dropped storage is freed once no Value held by model code refers to it: the latest
    // "last alive" of the values on it (held past forward = never freed in forward).
    last_alive_.assign(ns, -1);
    const int64_t past_forward = static_cast<int64_t>(p.nodes.size());
    for (const auto& [key, s] : p.value_storage) {
      if (s < 0 || key.first < 0) continue;
      auto it = p.value_last_alive.find(key);
      const int64_t last = it == p.value_last_alive.end() ? past_forward : it->second;
      last_alive_[static_cast<size_t>(s)] = std::max(last_alive_[static_cast<size_t>(s)], last);
    }
    for (size_t k = 0; k < p.nodes.size(); ++k) {
      for (const auto& key : p.nodes[k].saved) {
        ++pending_[key];
        const int64_t s = p.storage_of(key);
        if (s >= 0 && saved_at_[static_cast<size_t>(s)] < 0) saved_at_[static_cast<size_t>(s)] = static_cast<int64_t>(k);
        if (s >= 0) first_use_[static_cast<size_t>(s)] = static_cast<int64_t>(k);
      }
    }
  }

  // Droppable: saved, and allocated by a recorded node.
  bool droppable(int64_t s) const {
    return s >= 0 && saved_at_[static_cast<size_t>(s)] >= 0 && p_.storages[static_cast<size_t>(s)].allocated_by >= 0;
  }
  bool offloaded(int64_t s) const { return s >= 0 && droppable(s) && dropped_[static_cast<size_t>(s)] == kOffload; }
  int64_t saved_at(int64_t s) const { return saved_at_[static_cast<size_t>(s)]; }
  int64_t first_use(int64_t s) const { return first_use_[static_cast<size_t>(s)]; }

  Prediction run() {
    Prediction pred;
    const size_t ns = p_.storages.size();
    // ---- forward: measured peak minus saved storages the measured run held, plus what this plan holds.
    // Events per node: storages allocated there (both runs hold them), dropped storages released after
    // their last forward use (this plan only).
    std::vector<int64_t> alloc_at(p_.nodes.size(), 0), release_after(p_.nodes.size(), 0);
    for (size_t s = 0; s < ns; ++s) {
      if (!droppable(static_cast<int64_t>(s))) continue;
      alloc_at[static_cast<size_t>(p_.storages[s].allocated_by)] += p_.storages[s].bytes;
      if (dropped_[s]) {
        // Recomputed: freed when model code lets go. Offloaded: and when its copy is done.
        const int64_t copied = dropped_[s] == kOffload ? schedule_->deadline[s] : saved_at_[s];
        const int64_t last = std::max(last_alive_[s], copied);
        if (last < static_cast<int64_t>(p_.nodes.size())) release_after[static_cast<size_t>(last)] += p_.storages[s].bytes;
      }
    }
    int64_t measured_saved = 0, planned_saved = 0;
    for (size_t k = 0; k < p_.nodes.size(); ++k) {
      measured_saved += alloc_at[k];
      planned_saved += alloc_at[k];
      const int64_t peak = p_.nodes[k].peak_bytes - measured_saved + planned_saved + extra_;
      pred.forward_peaks.push_back(peak);
      if (peak > pred.peak_bytes) {
        pred.peak_bytes = peak;
        pred.peak_at = "forward " + p_.nodes[k].op + "#" + std::to_string(k);
      }
      planned_saved -= release_after[k];
    }
    // ---- backward.
    orig_holders_.assign(ns, 0);
    rec_holders_.assign(ns, 0);
    std::map<ValueKey, int> measured_pending = pending_;
    std::vector<int64_t> measured_holders(ns, 0);
    resident_ = 0;
    for (const auto& [key, n] : pending_) {
      const int64_t s = p_.storage_of(key);
      if (!droppable(s)) {  // e.g. a view of a parameter: never dropped, its memory is not ours to plan
        state_[key] = KeyState::Kept;
        continue;
      }
      measured_holders[static_cast<size_t>(s)] += 1;
      if (!dropped_[static_cast<size_t>(s)]) {
        hold(orig_holders_, s, +1);
        state_[key] = KeyState::Kept;
      } else if (dropped_[static_cast<size_t>(s)] == kOffload) {
        state_[key] = KeyState::Offloaded;
        storage_keys_[s].push_back(key);
      } else {
        state_[key] = KeyState::Dropped;
      }
    }
    // What the measured (keep-everything) run held: every saved storage until its last use.
    int64_t measured_resident = 0;
    for (size_t s = 0; s < ns; ++s)
      if (measured_holders[s] > 0) measured_resident += p_.storages[s].bytes;
    for (size_t j = 0; j < p_.backward_order.size(); ++j) {
      const int64_t ord = p_.backward_order[j];
      const ProfiledNode& node = p_.nodes[static_cast<size_t>(ord)];
      // Measured in the keep-everything run: what the node needs beyond saved values (gradients,
      // its backward workspace) and what was live besides saved values as it started.
      const int64_t transient_other = p_.backward_peak_bytes[j] - measured_resident;
      const int64_t start_other = p_.backward_start_bytes[j] - measured_resident;
      cache_.clear();
      transient_.clear();
      transient_bytes_ = 0;
      // Prefetch: offloaded storages whose first use is within their distance are fetched back now.
      for (auto& [s, keys] : storage_keys_)
        if (!fetched_.count(s) && first_use(s) >= ord - schedule_->prefetch[static_cast<size_t>(s)]) fetch(s);
      frame_bytes_ = 0;
      step_ = static_cast<int64_t>(j);
      recompute_peak_ = resident_;
      for (const auto& key : node.saved) ensure(key, pred);
      // Two phases: rebuilding (producers' forward workspace on top of what is live), then the node's
      // own backward with rebuilt values held by the recompute cache.
      const int64_t peak = std::max(start_other + recompute_peak_, transient_other + resident_ + transient_bytes_) + extra_;
      pred.backward_peaks.push_back(peak);
      if (peak > pred.peak_bytes) {
        pred.peak_bytes = peak;
        pred.peak_at = "backward " + node.op + "#" + std::to_string(ord);
      }
      // Release after the node: pending uses of its saved keys.
      for (const auto& key : node.saved) {
        const int64_t s = p_.storage_of(key);
        if (--measured_pending[key] == 0 && droppable(s) && --measured_holders[static_cast<size_t>(s)] == 0)
          measured_resident -= p_.storages[static_cast<size_t>(s)].bytes;
        auto& n = pending_[key];
        if (--n > 0) continue;
        auto st = state_.find(key);
        if (st == state_.end() || s < 0) continue;
        if (droppable(s) && st->second == KeyState::Kept) hold(orig_holders_, s, -1);
        if (droppable(s) && st->second == KeyState::Restored) hold(rec_holders_, s, -1);
        st->second = KeyState::Released;
      }
    }
    return pred;
  }

 private:
  enum class KeyState { Kept, Dropped, Offloaded, Restored, Released };

  // An offloaded storage comes back whole (one buffer); each of its keys holds it until its last use.
  void fetch(int64_t s) {
    if (!fetched_.insert(s).second) return;
    for (const auto& key : storage_keys_[s]) {
      auto st = state_.find(key);
      if (st == state_.end() || st->second != KeyState::Offloaded) continue;
      st->second = KeyState::Restored;
      hold(rec_holders_, s, +1);
    }
  }

  int64_t resident_bytes() const { return resident_; }
  // A storage instance is resident while it has holders; track the byte total incrementally.
  void hold(std::vector<int64_t>& holders, int64_t s, int delta) {
    int64_t& h = holders[static_cast<size_t>(s)];
    const bool before = h > 0;
    h += delta;
    const bool after = h > 0;
    if (before != after) resident_ += (after ? 1 : -1) * p_.storages[static_cast<size_t>(s)].bytes;
  }

  bool usable(const ValueKey& key) const {
    if (key.first < 0) return true;
    auto it = state_.find(key);
    return it != state_.end() && (it->second == KeyState::Kept || it->second == KeyState::Restored);
  }

  void ensure(const ValueKey& key, Prediction& pred) {
    if (usable(key)) return;
    if (auto st = state_.find(key); st != state_.end() && st->second == KeyState::Offloaded) {
      fetch(p_.storage_of(key));  // needed before its prefetch point: fetched on demand
      return;
    }
    rerun(key.first, key.second, /*store_required=*/true, pred);
  }

  // A re-run of `ord` made to feed another re-run during this backward step keeps nothing.
  bool transient(int64_t ord) const {
    if (store_from_ == nullptr) return false;
    auto it = store_from_->find(ord);
    return it != store_from_->end() && step_ < it->second;
  }

  // Re-run producer `ord` for its output `out`. A storing re-run (once per backward node) rebuilds
  // non-usable inputs, allocates its storages (held by the recompute cache until the node ends) and
  // stores outputs whose keys are dropped and still awaited; returns 0. A transient re-run (each time it
  // is asked) stores and caches nothing; returns the bytes its caller then holds: output `out`'s fresh
  // storage, or the held input it is a view of. Inputs from transient re-runs are held while it runs.
  int64_t rerun(int64_t ord, int out, bool store_required, Prediction& pred) {
    if (cache_.count(ord)) return 0;
    const bool is_transient = !store_required && transient(ord);
    if (!is_transient) cache_.insert(ord);
    const ProfiledNode& n = p_.nodes[static_cast<size_t>(ord)];
    std::vector<std::pair<int64_t, int64_t>> held;  // (storage, bytes) of inputs this re-run holds
    for (const auto& in : n.inputs) {
      if (usable(in)) continue;
      const int64_t b = rerun(in.first, in.second, /*store_required=*/false, pred);
      if (b > 0) {
        held.emplace_back(p_.storage_of(in), b);
        frame_bytes_ += b;
      }
    }
    pred.recompute_ms += n.forward_ms;
    pred.recomputed_nodes += 1;
    // The producer allocates its fresh storages; while it runs, its measured forward workspace comes on top.
    int64_t fresh = 0;
    for (int64_t st : n.allocated_storage) {
      if (is_transient) fresh += p_.storages[static_cast<size_t>(st)].bytes;
      else if (transient_.insert(st).second) transient_bytes_ += p_.storages[static_cast<size_t>(st)].bytes;
    }
    const int64_t workspace = std::max<int64_t>(0, n.peak_bytes - n.end_bytes);
    recompute_peak_ = std::max(recompute_peak_, resident_ + transient_bytes_ + frame_bytes_ + fresh + workspace);
    for (const auto& h : held) frame_bytes_ -= h.second;
    if (is_transient) {
      const int64_t s = n.output_storage.at(static_cast<size_t>(out));
      if (std::find(n.allocated_storage.begin(), n.allocated_storage.end(), s) != n.allocated_storage.end())
        return p_.storages[static_cast<size_t>(s)].bytes;
      for (const auto& h : held)
        if (h.first == s) return h.second;
      return 0;
    }
    // Outputs whose keys were dropped and are still awaited are stored: their storage instance moves
    // from the cache's transients to the resident set (a view restored later moves its base likewise).
    for (size_t j = 0; j < n.output_storage.size(); ++j) {
      const ValueKey key{ord, static_cast<int>(j)};
      auto st = state_.find(key);
      if (st == state_.end() || st->second != KeyState::Dropped) continue;
      st->second = KeyState::Restored;
      const int64_t storage = n.output_storage[j];
      if (storage < 0) continue;
      hold(rec_holders_, storage, +1);
      if (transient_.erase(storage)) transient_bytes_ -= p_.storages[static_cast<size_t>(storage)].bytes;
    }
    return 0;
  }

  const StepProfile& p_;
  const std::vector<char>& dropped_;
  int64_t extra_;
  const OffloadSchedule* schedule_;
  std::vector<int64_t> saved_at_, last_alive_, first_use_;
  std::map<int64_t, std::vector<ValueKey>> storage_keys_;  // offloaded storage -> its saved keys
  std::set<int64_t> fetched_;
  std::map<ValueKey, int> pending_;
  std::map<ValueKey, KeyState> state_;
  std::vector<int64_t> orig_holders_, rec_holders_;
  std::unordered_set<int64_t> cache_;
  std::unordered_set<int64_t> transient_;  // recomputed storage instances held only by the cache
  int64_t transient_bytes_ = 0, recompute_peak_ = 0;
  const std::map<int64_t, int64_t>* store_from_ = nullptr;
  int64_t step_ = 0;         // index of the backward node being simulated
  int64_t frame_bytes_ = 0;  // outputs of transient re-runs held by the re-runs consuming them
  int64_t resident_ = 0;
};

// Cost of re-running the producer of storage s if only s were dropped (its unsaved inputs re-run too).
double single_cost(const StepProfile& p, const std::set<ValueKey>& saved, int64_t producer,
                   std::unordered_set<int64_t>& seen) {
  if (producer < 0 || !seen.insert(producer).second) return 0;
  const ProfiledNode& n = p.nodes[static_cast<size_t>(producer)];
  double cost = n.forward_ms;
  for (const auto& in : n.inputs) {
    if (in.first >= 0 && !saved.count(in)) cost += single_cost(p, saved, in.first, seen);
  }
  return cost;
}

void fill_counts(Plan& plan) {
  plan.kept_groups = plan.kept_bytes = plan.dropped_groups = plan.dropped_bytes = 0;
  plan.offloaded_groups = plan.offloaded_bytes = 0;
  for (const auto& g : plan.groups) {
    if (g.keep) {
      ++plan.kept_groups;
      plan.kept_bytes += g.bytes;
    } else {
      ++plan.dropped_groups;
      plan.dropped_bytes += g.bytes;
      if (g.offload) {
        ++plan.offloaded_groups;
        plan.offloaded_bytes += g.bytes;
      }
    }
  }
}

std::vector<char> decision_vector(const StepProfile& p, const std::vector<Group>& groups) {
  std::vector<char> d(p.storages.size(), kKeep);
  for (const auto& g : groups) d[static_cast<size_t>(g.storage)] = g.keep ? kKeep : g.offload ? kOffload : kRecompute;
  return d;
}

// Per storage: the first forward ordinal that saves it and the last (its first use in backward).
void save_span(const StepProfile& p, std::vector<int64_t>& saved_at, std::vector<int64_t>& first_use) {
  saved_at.assign(p.storages.size(), -1);
  first_use.assign(p.storages.size(), -1);
  for (size_t k = 0; k < p.nodes.size(); ++k) {
    for (const auto& key : p.nodes[k].saved) {
      const int64_t s = p.storage_of(key);
      if (s < 0) continue;
      if (saved_at[static_cast<size_t>(s)] < 0) saved_at[static_cast<size_t>(s)] = static_cast<int64_t>(k);
      first_use[static_cast<size_t>(s)] = static_cast<int64_t>(k);
    }
  }
}

}  // namespace

Strategy parse_strategy(const std::string& name) {
  if (name == "knapsack") return Strategy::Knapsack;
  if (name == "ordered") return Strategy::Ordered;
  if (name == "ordered-sets") return Strategy::OrderedSets;
  if (name == "uniform") return Strategy::Uniform;
  if (name == "sqrt") return Strategy::Sqrt;
  if (name == "optimal-chain") return Strategy::OptimalChain;
  RATION_CHECK(false, "unknown plan strategy '", name,
               "' (expected knapsack, ordered, ordered-sets, uniform, sqrt or optimal-chain)");
}

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::Knapsack: return "knapsack";
    case Strategy::Ordered: return "ordered";
    case Strategy::OrderedSets: return "ordered-sets";
    case Strategy::Uniform: return "uniform";
    case Strategy::Sqrt: return "sqrt";
    case Strategy::OptimalChain: return "optimal-chain";
  }
  return "?";
}

std::string node_set_of(const std::string& scope) {
  if (scope.empty()) return "(top)";
  const auto dot = scope.find('.');
  if (dot == std::string::npos) return scope;
  const auto dot2 = scope.find('.', dot + 1);
  const std::string second = scope.substr(dot + 1, dot2 == std::string::npos ? std::string::npos : dot2 - dot - 1);
  return is_number(second) ? scope.substr(0, dot2) : scope.substr(0, dot);
}

Prediction simulate(const StepProfile& profile, const std::vector<char>& decision, int64_t extra_fixed_bytes,
                    const OffloadSchedule* schedule) {
  return simulate(profile, decision, extra_fixed_bytes, {}, schedule);
}

OffloadSchedule schedule_offloads(const StepProfile& p, const std::vector<char>& decision, const OffloadCosts& c) {
  const size_t ns = p.storages.size(), nn = p.nodes.size();
  OffloadSchedule sch;
  sch.deadline.assign(ns, -1);
  sch.prefetch.assign(ns, 0);
  if (nn == 0) return sch;
  std::vector<int64_t> saved_at, first_use;
  save_span(p, saved_at, first_use);
  auto bytes_of = [&](size_t s) { return static_cast<double>(p.storages[s].bytes); };
  // Forward: node k ends at end_f[k] (measured forward times); Q2 copies in order of saving.
  std::vector<double> end_f(nn);
  double t = 0;
  for (size_t k = 0; k < nn; ++k) end_f[k] = (t += p.nodes[k].forward_ms);
  std::vector<size_t> order;
  for (size_t s = 0; s < ns; ++s)
    if (decision[s] == kOffload && saved_at[s] >= 0) order.push_back(s);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return saved_at[a] < saved_at[b]; });
  double free_at = 0;
  for (size_t s : order) {
    const auto from = static_cast<size_t>(saved_at[s]);
    const double done = std::max(end_f[from], free_at) + c.per_copy_ms + bytes_of(s) / c.write_bytes_per_ms;
    free_at = done;
    const auto k = static_cast<int64_t>(std::lower_bound(end_f.begin() + static_cast<std::ptrdiff_t>(from), end_f.end(), done) -
                                        end_f.begin());
    sch.deadline[s] = std::min<int64_t>(k, static_cast<int64_t>(nn) - 1);
  }
  sch.stall_ms += std::max(0.0, free_at - end_f[nn - 1]);
  // Backward: node j (execution order) starts at start_b[j]; a read for first use u issued with
  // distance d starts at the first node whose ordinal is <= u + d (the executor's rule).
  const auto& bo = p.backward_order;
  if (bo.empty()) return sch;
  std::vector<double> start_b(bo.size());
  std::vector<int64_t> min_ord(bo.size());
  t = 0;
  for (size_t j = 0; j < bo.size(); ++j) {
    start_b[j] = t;
    t += p.nodes[static_cast<size_t>(bo[j])].backward_ms;
    min_ord[j] = j == 0 ? bo[j] : std::min(min_ord[j - 1], bo[j]);
  }
  auto first_at_or_below = [&](int64_t ordinal) {  // first j with some bo[<=j] <= ordinal
    const auto it = std::lower_bound(min_ord.begin(), min_ord.end(), ordinal, [](int64_t a, int64_t b) { return a > b; });
    return static_cast<size_t>(std::min<std::ptrdiff_t>(it - min_ord.begin(), static_cast<std::ptrdiff_t>(bo.size()) - 1));
  };
  std::vector<std::pair<size_t, size_t>> reads;  // (need index, storage)
  for (size_t s : order) reads.emplace_back(first_at_or_below(first_use[s]), s);
  std::stable_sort(reads.begin(), reads.end());
  double free_b = 0;
  for (const auto& [need_j, s] : reads) {
    const double need = start_b[need_j];
    const double copy = c.per_copy_ms + bytes_of(s) / c.read_bytes_per_ms;
    int d = c.min_prefetch;
    double done = 0;
    for (;; ++d) {
      const size_t issue_j = first_at_or_below(first_use[s] + d);
      done = std::max(start_b[issue_j], free_b) + copy;
      if (done <= need || issue_j == 0 || d > static_cast<int>(nn)) break;
    }
    sch.prefetch[s] = d;
    free_b = done;
    sch.stall_ms += std::max(0.0, done - need);
  }
  return sch;
}

Prediction simulate(const StepProfile& profile, const std::vector<char>& decision, int64_t extra_fixed_bytes,
                    const std::map<int64_t, int64_t>& store_from, const OffloadSchedule* schedule) {
  RATION_ASSERT(decision.size() == profile.storages.size(), "decision vector size mismatch");
  const bool any_offload = std::find(decision.begin(), decision.end(), kOffload) != decision.end();
  RATION_ASSERT(!any_offload || schedule != nullptr, "offloaded storages need a schedule");
  Simulator sim(profile, decision, extra_fixed_bytes, schedule, store_from.empty() ? nullptr : &store_from);
  Prediction pred = sim.run();
  if (any_offload) {
    pred.offload_stall_ms = schedule->stall_ms;
    for (size_t st = 0; st < decision.size(); ++st)
      if (sim.offloaded(static_cast<int64_t>(st))) pred.offloaded_bytes += profile.storages[st].bytes;
  }
  return pred;
}

int64_t revolve_min_recomputes(int64_t n, int64_t c) {
  RATION_CHECK(n >= 1 && c >= 1, "revolve needs n >= 1 steps and c >= 1 checkpoints");
  if (c >= n - 1) return 0;
  // beta(c, r) = C(c + r, c): the longest chain reversible with c checkpoints and r sweeps.
  auto binom = [](int64_t a, int64_t b) {
    if (b < 0 || b > a) return 0.0;
    double r = 1;
    for (int64_t i = 1; i <= b; ++i) r = r * static_cast<double>(a - b + i) / static_cast<double>(i);
    return r;
  };
  int64_t r = 1;
  while (binom(c + r, c) < static_cast<double>(n)) ++r;
  const double forward_steps = static_cast<double>(r * n) - binom(c + r, c + 1);
  return std::max<int64_t>(0, static_cast<int64_t>(std::llround(forward_steps)) - (n - 1));
}

std::map<ValueKey, Plan::OffloadOrder> Plan::offloaded_keys(const StepProfile& profile) const {
  std::map<int64_t, OffloadOrder> by_storage;
  for (const auto& g : groups)
    if (!g.keep && g.offload) by_storage[g.storage] = {g.deadline, g.prefetch};
  std::map<ValueKey, OffloadOrder> keys;
  for (const auto& n : profile.nodes)
    for (const auto& k : n.saved)
      if (auto it = by_storage.find(profile.storage_of(k)); k.first >= 0 && it != by_storage.end()) keys[k] = it->second;
  return keys;
}


std::string why_not_chain(const StepProfile& profile) {
  if (profile.nodes.empty()) return "the profile recorded no nodes";
  for (size_t k = 0; k < profile.nodes.size(); ++k) {
    for (const auto& in : profile.nodes[k].inputs) {
      if (in.first < 0 || in.first == static_cast<int64_t>(k) - 1) continue;
      const ProfiledNode& n = profile.nodes[k];
      const ProfiledNode& from = profile.nodes[static_cast<size_t>(in.first)];
      return detail::str("node ", k, " (", n.op, n.scope.empty() ? "" : " in " + n.scope, ") reads the output of node ",
                         in.first, " (", from.op, from.scope.empty() ? "" : " in " + from.scope,
                         "), not of the node just before it");
    }
  }
  return "";
}

namespace {

// ---- the binomial (Revolve) schedule on a chain -----------------------------------------------------
// States 1..m are the chain's checkpointable values in forward order; state 0 (the chain's input) is
// free. Backward needs state m, m-1, ..., 1 in turn ("unit" i needs state i resident), and each state is
// released after its unit. Rebuilding state i from a resident state a < i re-runs i − a steps. Slots:
// states resident at once (the one a unit needs included).
//   C(l, s): state a resident, units a+l..a+1 to do, s slots: the sweep for unit a+l advances from a and
//            stores state a+j (cost j), the rest of the sweep and units a+l..a+j+1 are C(l−j, s−1) from
//            a+j, unit a+j finds its state resident, then C(j−1, s) from a.
//   G(l, s): the same during forward, where keeping a state costs nothing: G(l−j, s−1) + C(j−1, s).
// This is Griewank's binomial optimum: G(n, s) == revolve_min_recomputes(n + 1, s) (the unit of the
// chain's head, which needs state n, is Revolve's last step).
class BinomialSchedule {
 public:
  BinomialSchedule(int64_t m, int64_t slots) : m_(m), s_(slots) {
    const size_t w = static_cast<size_t>(s_ + 1);
    c_.assign(static_cast<size_t>(m_ + 1) * w, kInf);
    g_ = c_;
    cj_.assign(c_.size(), 0);
    gj_ = cj_;
    for (int64_t s = 0; s <= s_; ++s) at(c_, 0, s) = at(g_, 0, s) = 0;
    for (int64_t l = 1; l <= m_; ++l) {
      for (int64_t s = 1; s <= s_; ++s) {
        for (int64_t j = 1; j <= l; ++j) {
          const int64_t rest_c = l - j > 0 ? at(c_, l - j, s - 1) : 0;
          const int64_t rest_g = l - j > 0 ? at(g_, l - j, s - 1) : 0;
          const int64_t below = at(c_, j - 1, s);
          if (rest_c < kInf && below < kInf && j + rest_c + below < at(c_, l, s)) {
            at(c_, l, s) = j + rest_c + below;
            at(cj_, l, s) = j;
          }
          if (rest_g < kInf && below < kInf && rest_g + below < at(g_, l, s)) {
            at(g_, l, s) = rest_g + below;
            at(gj_, l, s) = j;
          }
        }
      }
    }
  }
  // Steps re-run with `slots` slots (kInf: infeasible).
  int64_t cost(int64_t slots) const { return at(g_, m_, slots); }
  // keep[i]: state i kept in forward; store_for[i]: for a dropped state, the unit whose sweep stores it.
  void emit(int64_t slots, std::vector<char>& keep, std::vector<int64_t>& store_for) const {
    keep.assign(static_cast<size_t>(m_ + 1), 0);
    store_for.assign(static_cast<size_t>(m_ + 1), -1);
    emit_g(0, m_, slots, keep, store_for);
  }
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

 private:
  int64_t& at(std::vector<int64_t>& t, int64_t l, int64_t s) const { return t[static_cast<size_t>(l * (s_ + 1) + s)]; }
  int64_t at(const std::vector<int64_t>& t, int64_t l, int64_t s) const { return t[static_cast<size_t>(l * (s_ + 1) + s)]; }
  void emit_g(int64_t a, int64_t l, int64_t s, std::vector<char>& keep, std::vector<int64_t>& store_for) const {
    if (l == 0) return;
    const int64_t j = at(gj_, l, s);
    keep[static_cast<size_t>(a + j)] = 1;
    emit_g(a + j, l - j, s - 1, keep, store_for);
    emit_c(a, j - 1, s, store_for);
  }
  void emit_c(int64_t a, int64_t l, int64_t s, std::vector<int64_t>& store_for) const {
    if (l == 0) return;
    const int64_t j = at(cj_, l, s);
    store_for[static_cast<size_t>(a + j)] = a + l;
    emit_c(a + j, l - j, s - 1, store_for);
    emit_c(a, j - 1, s, store_for);
  }
  int64_t m_, s_;
  std::vector<int64_t> c_, g_, cj_, gj_;
};

// One candidate plan for a chain: the binomial schedule with a given number of slots.
struct ChainCandidate {
  int64_t slots = 0;
  std::vector<char> keep;                 // per plan group
  std::map<int64_t, int64_t> store_from;  // Plan::store_from
  Prediction prediction;
};

// Every binomial schedule (slots = m .. 1) for a chain profile, simulated. Checkpointable states are the
// producers of saved groups at least 1/8 of the largest group (a producer's groups go together); smaller
// groups are always kept. Every other re-run in the chain is transient.
std::vector<ChainCandidate> chain_candidates(const StepProfile& profile, const std::vector<Group>& groups,
                                             int64_t extra) {
  std::vector<ChainCandidate> out;
  int64_t largest = 0;
  for (const auto& g : groups) largest = std::max(largest, g.bytes);
  std::vector<int64_t> producers;  // states 1..m: producer ordinals in forward order
  std::map<int64_t, int64_t> state_of_producer;
  for (const auto& g : groups) {
    if (g.bytes * 8 < largest || state_of_producer.count(g.producer)) continue;
    producers.push_back(g.producer);
    state_of_producer[g.producer] = 0;
  }
  std::sort(producers.begin(), producers.end());
  const int64_t m = static_cast<int64_t>(producers.size());
  if (m == 0) return out;
  for (int64_t i = 0; i < m; ++i) state_of_producer[producers[static_cast<size_t>(i)]] = i + 1;
  // Unit of state i: the first backward node that reads one of its groups.
  std::map<int64_t, int64_t> first_read;  // storage -> backward step
  for (size_t j = 0; j < profile.backward_order.size(); ++j)
    for (const auto& k : profile.nodes[static_cast<size_t>(profile.backward_order[j])].saved)
      first_read.emplace(profile.storage_of(k), static_cast<int64_t>(j));
  std::vector<int64_t> unit_step(static_cast<size_t>(m + 1), std::numeric_limits<int64_t>::max());
  for (const auto& g : groups) {
    auto st = state_of_producer.find(g.producer);
    auto fr = first_read.find(g.storage);
    if (st == state_of_producer.end() || st->second == 0 || fr == first_read.end()) continue;
    int64_t& u = unit_step[static_cast<size_t>(st->second)];
    u = std::min(u, fr->second);
  }
  const BinomialSchedule schedule(m, m);
  for (int64_t slots = m; slots >= 1; --slots) {
    if (schedule.cost(slots) >= BinomialSchedule::kInf) break;
    std::vector<char> keep_state;
    std::vector<int64_t> store_for;
    schedule.emit(slots, keep_state, store_for);
    ChainCandidate c;
    c.slots = slots;
    for (const auto& g : groups) {
      auto st = state_of_producer.find(g.producer);
      c.keep.push_back(st == state_of_producer.end() || keep_state[static_cast<size_t>(st->second)] ? 1 : 0);
    }
    for (int64_t k = 0; k < static_cast<int64_t>(profile.nodes.size()); ++k) {
      auto st = state_of_producer.find(k);
      if (st == state_of_producer.end()) {
        c.store_from[k] = std::numeric_limits<int64_t>::max();  // never checkpointed: always transient
      } else if (!keep_state[static_cast<size_t>(st->second)]) {
        const int64_t unit = store_for[static_cast<size_t>(st->second)];
        RATION_ASSERT(unit > 0, "binomial schedule left state ", st->second, " without a store");
        c.store_from[k] = unit_step[static_cast<size_t>(unit)];
      }
    }
    std::vector<char> dropped(profile.storages.size(), 0);
    for (size_t i = 0; i < groups.size(); ++i) dropped[static_cast<size_t>(groups[i].storage)] = c.keep[i] ? 0 : 1;
    c.prediction = simulate(profile, dropped, extra, c.store_from);
    out.push_back(std::move(c));
  }
  return out;
}

// The candidate that fits `budget` with the fewest re-run nodes (null if none fits).
const ChainCandidate* best_chain_fit(const std::vector<ChainCandidate>& cs, int64_t budget) {
  const ChainCandidate* best = nullptr;
  for (const auto& c : cs) {
    if (c.prediction.peak_bytes > budget) continue;
    if (best == nullptr || c.prediction.recomputed_nodes < best->prediction.recomputed_nodes) best = &c;
  }
  return best;
}

void apply_chain(Plan& plan, const ChainCandidate& c) {
  for (size_t i = 0; i < plan.groups.size(); ++i) plan.groups[i].keep = c.keep[i] != 0;
  plan.store_from = c.store_from;
  plan.chain_slots = c.slots;
}

}  // namespace

std::set<ValueKey> Plan::dropped_keys(const StepProfile& profile) const {
  std::set<int64_t> dropped;
  for (const auto& g : groups)
    if (!g.keep && !g.offload) dropped.insert(g.storage);
  std::set<ValueKey> keys;
  for (const auto& n : profile.nodes)
    for (const auto& k : n.saved)
      if (k.first >= 0 && dropped.count(profile.storage_of(k))) keys.insert(k);
  return keys;
}

namespace {
// `floor` (if set) receives the feasible minimum as soon as it is known, even when the plan then throws.
Plan plan_once(const StepProfile& profile, const PlanOptions& options, int64_t* floor = nullptr);
}  // namespace

// With an offload tier, the joint plan is tried first; where it cannot meet the budget the plan is made
// without offload. A tier with little room can raise the joint plan's floor above keep/recompute's (its
// room goes to groups recompute would have served better), and a budget that keep/recompute meets must
// not fail because a tier was offered. When both fail, the error states the lower floor.
Plan make_plan(const StepProfile& profile, const PlanOptions& options) {
  if (!options.offload) return plan_once(profile, options);
  std::string joint_error;
  int64_t joint_floor = std::numeric_limits<int64_t>::max(), alone_floor = std::numeric_limits<int64_t>::max();
  try {
    return plan_once(profile, options, &joint_floor);
  } catch (const Error& e) {
    joint_error = e.message();
  }
  PlanOptions without = options;
  without.offload.reset();
  try {
    Plan plan = plan_once(profile, without, &alone_floor);
    plan.offload_costs = options.offload;  // reported: the tier was measured, and offloads nothing
    plan.minimum_peak_bytes = std::min(plan.minimum_peak_bytes, joint_floor);
    return plan;
  } catch (const Error& e) {
    RATION_CHECK(false, joint_floor <= alone_floor ? joint_error : e.message());  // the lower floor's error
  }
  return {};
}

namespace {
Plan plan_once(const StepProfile& profile, const PlanOptions& options, int64_t* floor) {
  Plan plan;
  plan.strategy = options.strategy;
  plan.budget_bytes = options.budget_bytes;
  std::vector<char> none(profile.storages.size(), 0);
  Simulator probe(profile, none, 0);
  std::set<ValueKey> saved_keys;
  for (const auto& node : profile.nodes)
    for (const auto& k : node.saved) saved_keys.insert(k);
  // Groups in forward order of their producers.
  for (int64_t s : profile.saved_storages()) {
    if (!probe.droppable(s)) continue;
    Group g;
    g.storage = s;
    g.bytes = profile.storages[static_cast<size_t>(s)].bytes;
    g.producer = profile.storages[static_cast<size_t>(s)].allocated_by;
    g.op = profile.nodes[static_cast<size_t>(g.producer)].op;
    g.node_set = node_set_of(profile.nodes[static_cast<size_t>(g.producer)].scope);
    std::unordered_set<int64_t> seen;
    g.recompute_ms = single_cost(profile, saved_keys, g.producer, seen);
    plan.groups.push_back(g);
  }
  std::stable_sort(plan.groups.begin(), plan.groups.end(),
                   [](const Group& a, const Group& b) { return a.producer < b.producer; });
  const int64_t extra = options.extra_fixed_bytes;
  plan.offload_costs = options.offload;
  auto predict = [&](const std::vector<Group>& gs) {
    const std::vector<char> d = decision_vector(profile, gs);
    if (!options.offload) return simulate(profile, d, extra, plan.store_from);
    const OffloadSchedule sch = schedule_offloads(profile, d, *options.offload);
    return simulate(profile, d, extra, plan.store_from, &sch);
  };

  const Prediction full = predict(plan.groups);
  plan.unconstrained_peak_bytes = full.peak_bytes;
  int64_t saved_total = 0;
  for (const auto& g : plan.groups) saved_total += g.bytes;
  // Fixed occupancy: the measured peak of everything that is not a saved activation.
  plan.fixed_bytes = std::max<int64_t>(0, full.peak_bytes - saved_total);
  plan.capacity_bytes = options.budget_bytes - plan.fixed_bytes;
  const int64_t budget = options.budget_bytes;
  const size_t n = plan.groups.size();

  // Joint plan (knapsack only): a group that is not kept is offloaded where the copy alone would hide
  // under the compute between its saving and its first use (cheaper than re-running its producers).
  std::vector<double> cost(n);
  std::vector<char> prefer_offload(n, 0);
  if (options.offload && options.strategy == Strategy::Knapsack && options.offload->capacity_bytes > 0) {
    const OffloadCosts& c = *options.offload;
    RATION_CHECK(c.write_bytes_per_ms > 0 && c.read_bytes_per_ms > 0, "offload planning needs measured tier bandwidths");
    std::vector<int64_t> saved_at, first_use;
    save_span(profile, saved_at, first_use);
    double fwd_total = 0, bwd_total = 0;
    std::vector<double> end_f;
    for (const auto& node : profile.nodes) end_f.push_back(fwd_total += node.forward_ms);
    std::vector<double> bwd_before(profile.nodes.size(), 0);  // backward time before the node runs
    for (int64_t ord : profile.backward_order) {
      bwd_before[static_cast<size_t>(ord)] = bwd_total;
      bwd_total += profile.nodes[static_cast<size_t>(ord)].backward_ms;
    }
    for (size_t i = 0; i < n; ++i) {
      const Group& g = plan.groups[i];
      const auto st = static_cast<size_t>(g.storage);
      cost[i] = g.recompute_ms;
      if (g.bytes < std::max<int64_t>(c.min_bytes, 1) || saved_at[st] < 0) continue;
      const double bytes = static_cast<double>(g.bytes);
      const double fwd_window = fwd_total - end_f[static_cast<size_t>(saved_at[st])];
      const double bwd_window = bwd_before[static_cast<size_t>(first_use[st])];
      const double alone = 2 * c.per_copy_ms + std::max(0.0, bytes / c.write_bytes_per_ms - fwd_window) +
                           std::max(0.0, bytes / c.read_bytes_per_ms - bwd_window);
      if (alone < g.recompute_ms) {
        prefer_offload[i] = 1;
        cost[i] = alone;
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) cost[i] = plan.groups[i].recompute_ms;
  }
  // The tier holds every offloaded group from its copy-out to its fetch: together they must fit its
  // measured capacity (each rounded up to a file-system page), or the copy-outs would fail mid-step. A
  // group that does not fit is recomputed instead, in the plan rather than as a run-time fall-back.
  constexpr int64_t kTierPage = 4096;
  const int64_t tier_capacity = options.offload ? options.offload->capacity_bytes : 0;
  auto in_tier = [&](int64_t bytes) { return (bytes + kTierPage - 1) / kTierPage * kTierPage; };
  auto offloaded_bytes = [&](const std::vector<Group>& gs) {
    int64_t total = 0;
    for (const auto& g : gs) total += !g.keep && g.offload ? in_tier(g.bytes) : 0;
    return total;
  };
  auto release = [&](std::vector<Group>& gs, size_t i) {
    gs[i].keep = false;
    gs[i].offload = false;
    gs[i].offload = prefer_offload[i] != 0 && in_tier(gs[i].bytes) <= tier_capacity - offloaded_bytes(gs);
  };
  // Knapsack order: cheapest predicted cost (recompute, or an offload that does not hide) per byte first.
  std::vector<size_t> by_ratio(n);
  std::iota(by_ratio.begin(), by_ratio.end(), 0);
  std::stable_sort(by_ratio.begin(), by_ratio.end(), [&](size_t a, size_t b) {
    return cost[a] / static_cast<double>(std::max<int64_t>(plan.groups[a].bytes, 1)) <
           cost[b] / static_cast<double>(std::max<int64_t>(plan.groups[b].bytes, 1));
  });
  // Greedy descent: take drops in knapsack order when they lower the predicted peak, in passes, until
  // the prediction fits `target` or no drop helps. (Dropping is not monotone: a dropped run of values is
  // rebuilt and held together, so a drop that only adds recompute transients is skipped.)
  auto descend = [&](std::vector<Group>& gs, int64_t target) {
    int64_t peak = predict(gs).peak_bytes;
    bool progress = true;
    while (peak > target && progress) {
      progress = false;
      for (size_t i : by_ratio) {
        if (!gs[i].keep) continue;
        release(gs, i);
        int64_t p = predict(gs).peak_bytes;
        if (p >= peak && gs[i].offload) {  // an offload held too long to help: try recomputing it
          gs[i].offload = false;
          p = predict(gs).peak_bytes;
        }
        if (p < peak) {
          peak = p;
          progress = true;
          if (peak <= target) break;
        } else {
          gs[i].keep = true;
          gs[i].offload = false;
        }
      }
    }
    return peak;
  };
  // The feasible floor we can reach: the lowest of a full descent and the checkpointing baselines.
  {
    std::vector<Group> floor_plan = plan.groups;
    plan.minimum_peak_bytes = std::min(full.peak_bytes, descend(floor_plan, 0));
  }
  // On a chain, binomial schedules (recompute without storing) reach further down.
  const bool chain = why_not_chain(profile).empty();
  const std::vector<ChainCandidate> chain_plans = chain ? chain_candidates(profile, plan.groups, extra)
                                                        : std::vector<ChainCandidate>{};
  for (const auto& c : chain_plans) plan.minimum_peak_bytes = std::min(plan.minimum_peak_bytes, c.prediction.peak_bytes);
  if (floor) *floor = plan.minimum_peak_bytes;
  RATION_CHECK(budget >= plan.minimum_peak_bytes, "memory budget ", format_bytes(budget),
               " is below the feasible minimum ", format_bytes(plan.minimum_peak_bytes),
               " for this model and batch (fixed occupancy ", format_bytes(plan.fixed_bytes),
               ": parameters, gradients, optimiser state and workspace, plus what must stay saved). "
               "Raise --memory-budget or lower train.batch_size.");

  auto fits = [&](const std::vector<Group>& gs) { return predict(gs).peak_bytes <= budget; };

  switch (options.strategy) {
    case Strategy::Knapsack: {
      descend(plan.groups, budget);
      // Keep as much as fits: re-keep the most expensive drops first while the prediction still fits.
      for (size_t r = n; r-- > 0;) {
        const size_t i = by_ratio[r];
        if (plan.groups[i].keep) continue;
        plan.groups[i].keep = true;
        if (!fits(plan.groups)) plan.groups[i].keep = false;
      }
      if (options.offload) {
        // Offloads share the copy queues: where one's marginal stall exceeds its recompute cost,
        // recompute it instead (if that still fits).
        for (int pass = 0; pass < 3; ++pass) {
          bool changed = false;
          const double stall = predict(plan.groups).offload_stall_ms;
          for (size_t i = 0; i < n; ++i) {
            Group& g = plan.groups[i];
            if (g.keep || !g.offload) continue;
            g.offload = false;
            const Prediction without = predict(plan.groups);
            if (stall - without.offload_stall_ms > g.recompute_ms && without.peak_bytes <= budget) {
              changed = true;
              break;
            }
            g.offload = true;
          }
          if (!changed) break;
        }
      }
      // Below what storing every rebuilt value can reach, a chain takes the binomial schedule (which
      // recomputes without storing); above it the greedy plan is already the fewest re-runs on a chain
      // (every value not resident when backward starts is rebuilt at least once).
      if (!fits(plan.groups)) {
        if (const ChainCandidate* c = best_chain_fit(chain_plans, budget)) apply_chain(plan, *c);
      }
      break;
    }
    case Strategy::OptimalChain: {
      RATION_CHECK(chain, "strategy 'optimal-chain' needs a chain-shaped model (every node reading only the "
                   "output of the node recorded just before it); this one is not: ", why_not_chain(profile),
                   ". Use --plan knapsack.");
      const ChainCandidate* c = best_chain_fit(chain_plans, budget);
      int64_t lowest = full.peak_bytes;
      for (const auto& cp : chain_plans) lowest = std::min(lowest, cp.prediction.peak_bytes);
      RATION_CHECK(c != nullptr, "strategy 'optimal-chain' cannot meet the budget of ", format_bytes(budget),
                   ": its lowest schedule needs ", format_bytes(lowest), ". Raise the budget.");
      apply_chain(plan, *c);
      break;
    }
    case Strategy::Ordered: {
      for (size_t i = 0; i < n && !fits(plan.groups); ++i) plan.groups[i].keep = false;
      break;
    }
    case Strategy::OrderedSets: {
      // The largest number of groups G that fits, split across node sets in proportion to their sizes;
      // within each set, groups are deleted in the preset (forward) order until its target is met.
      std::map<std::string, std::vector<size_t>> sets;
      std::vector<std::string> set_order;
      for (size_t i = 0; i < n; ++i) {
        if (!sets.count(plan.groups[i].node_set)) set_order.push_back(plan.groups[i].node_set);
        sets[plan.groups[i].node_set].push_back(i);
      }
      for (int64_t target = static_cast<int64_t>(n); target >= 0; --target) {
        // Proportional split with largest remainders.
        std::vector<int64_t> per(set_order.size());
        std::vector<std::pair<double, size_t>> rema;
        int64_t assigned = 0;
        for (size_t k = 0; k < set_order.size(); ++k) {
          const double exact = static_cast<double>(target) * static_cast<double>(sets[set_order[k]].size()) /
                               static_cast<double>(std::max<size_t>(n, 1));
          per[k] = static_cast<int64_t>(std::floor(exact));
          assigned += per[k];
          rema.emplace_back(exact - std::floor(exact), k);
        }
        std::stable_sort(rema.begin(), rema.end(), [](auto& a, auto& b) { return a.first > b.first; });
        for (size_t r = 0; assigned < target && r < rema.size(); ++r, ++assigned) per[rema[r].second] += 1;
        for (size_t k = 0; k < set_order.size(); ++k) {
          const auto& idx = sets[set_order[k]];
          const int64_t to_delete = static_cast<int64_t>(idx.size()) - per[k];
          for (size_t m = 0; m < idx.size(); ++m) plan.groups[idx[m]].keep = static_cast<int64_t>(m) >= to_delete;
        }
        if (fits(plan.groups)) break;
      }
      break;
    }
    case Strategy::Uniform:
    case Strategy::Sqrt: {
      // Checkpointing as PyTorch users do it: inside numbered blocks keep only the block's outputs
      // (groups used outside the block) of every k-th block; everything else in blocks is recomputed.
      std::vector<std::string> blocks;
      for (const auto& g : plan.groups) {
        const auto dot = g.node_set.find('.');
        if (dot != std::string::npos && std::find(blocks.begin(), blocks.end(), g.node_set) == blocks.end())
          blocks.push_back(g.node_set);
      }
      if (blocks.empty()) {  // no numbered blocks: every top-level module is a block
        for (const auto& g : plan.groups)
          if (std::find(blocks.begin(), blocks.end(), g.node_set) == blocks.end() && g.node_set != "(top)")
            blocks.push_back(g.node_set);
      }
      const int64_t k = options.strategy == Strategy::Sqrt
                            ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(blocks.size())))))
                            : std::max<int64_t>(1, options.checkpoint_every);
      for (auto& g : plan.groups) {
        const auto it = std::find(blocks.begin(), blocks.end(), g.node_set);
        if (it == blocks.end()) continue;  // outside blocks: kept
        const int64_t index = it - blocks.begin();
        bool used_outside = false;
        for (const auto& node : profile.nodes) {
          if (node_set_of(node.scope) == g.node_set) continue;
          for (const auto& in : node.inputs)
            if (profile.storage_of(in) == g.storage) used_outside = true;
        }
        g.keep = used_outside && ((index + 1) % k == 0);
      }
      break;
    }
  }
  fill_counts(plan);
  plan.initial_kept_groups = plan.kept_groups;
  plan.initial_kept_bytes = plan.kept_bytes;

  // User feedback (seed step 5): the user may lower what is kept, never raise it.
  if (options.keep_groups) {
    RATION_CHECK(*options.keep_groups <= plan.initial_kept_groups, "--keep-groups ", *options.keep_groups,
                 " asks to keep more than the plan's initial figure of ", plan.initial_kept_groups,
                 " groups; keeping more would not fit the budget of ", format_bytes(budget),
                 " (predicted peak with the initial plan: ", format_bytes(predict(plan.groups).peak_bytes), ")");
  }
  if (options.keep_bytes) {
    RATION_CHECK(*options.keep_bytes <= plan.initial_kept_bytes, "--keep-bytes ", format_bytes(*options.keep_bytes),
                 " asks to keep more than the plan's initial figure of ", format_bytes(plan.initial_kept_bytes),
                 "; keeping more would not fit the budget of ", format_bytes(budget));
  }
  if (options.keep_groups || options.keep_bytes) {
    // Drop further groups, cheapest recompute per byte first, until both limits hold; a drop that would
    // push the prediction over the budget (rebuilt runs held together) is skipped.
    for (size_t i : by_ratio) {
      fill_counts(plan);
      const bool ok = (!options.keep_groups || plan.kept_groups <= *options.keep_groups) &&
                      (!options.keep_bytes || plan.kept_bytes <= *options.keep_bytes);
      if (ok) break;
      if (!plan.groups[i].keep) continue;
      release(plan.groups, i);
      if (!fits(plan.groups)) {
        plan.groups[i].keep = true;
        plan.groups[i].offload = false;
      }
    }
    fill_counts(plan);
    RATION_CHECK((!options.keep_groups || plan.kept_groups <= *options.keep_groups) &&
                     (!options.keep_bytes || plan.kept_bytes <= *options.keep_bytes),
                 "cannot lower what is kept to the requested ", options.keep_groups ? std::to_string(*options.keep_groups) + " groups" : format_bytes(*options.keep_bytes),
                 " within the budget of ", format_bytes(budget), ": the lowest that fits keeps ", plan.kept_groups,
                 " groups (", format_bytes(plan.kept_bytes), "); dropping more rebuilds runs of values together and "
                 "raises the peak. Raise --memory-budget to keep less.");
  }
  fill_counts(plan);
  plan.prediction = predict(plan.groups);
  if (options.offload) {
    const OffloadSchedule sch = schedule_offloads(profile, decision_vector(profile, plan.groups), *options.offload);
    for (auto& g : plan.groups) {
      g.deadline = g.offload && !g.keep ? sch.deadline[static_cast<size_t>(g.storage)] : -1;
      g.prefetch = g.offload && !g.keep ? sch.prefetch[static_cast<size_t>(g.storage)] : 0;
    }
  }
  plan.fits = plan.prediction.peak_bytes <= budget;
  RATION_CHECK(plan.fits, "strategy '", to_string(options.strategy), "' cannot meet the budget of ", format_bytes(budget),
               ": its plan's predicted peak is ", format_bytes(plan.prediction.peak_bytes), " at ",
               plan.prediction.peak_at, " (feasible minimum ", format_bytes(plan.minimum_peak_bytes),
               "). Use --plan knapsack or raise the budget.");
  return plan;
}
}  // namespace

nlohmann::json Plan::to_json() const {
  nlohmann::json sets = nlohmann::json::object();
  for (const auto& g : groups) {
    auto& s = sets[g.node_set];
    if (s.is_null()) s = {{"kept_groups", 0}, {"kept_bytes", 0}, {"dropped_groups", 0}, {"dropped_bytes", 0}};
    s[g.keep ? "kept_groups" : "dropped_groups"] = s[g.keep ? "kept_groups" : "dropped_groups"].get<int64_t>() + 1;
    s[g.keep ? "kept_bytes" : "dropped_bytes"] = s[g.keep ? "kept_bytes" : "dropped_bytes"].get<int64_t>() + g.bytes;
  }
  nlohmann::json gs = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json j = {{"storage", g.storage}, {"bytes", g.bytes}, {"producer", g.producer}, {"op", g.op},
                        {"node_set", g.node_set}, {"recompute_ms", g.recompute_ms},
                        {"decision", g.keep ? "keep" : g.offload ? "offload" : "recompute"}};
    if (!g.keep && g.offload) {
      j["copy_deadline"] = g.deadline;
      j["prefetch"] = g.prefetch;
    }
    gs.push_back(j);
  }
  nlohmann::json j = {{"strategy", to_string(strategy)},
          {"budget_bytes", budget_bytes},
          {"fixed_bytes", fixed_bytes},
          {"activation_capacity_bytes", capacity_bytes},
          {"unconstrained_peak_bytes", unconstrained_peak_bytes},
          {"minimum_peak_bytes", minimum_peak_bytes},
          {"initial_kept_groups", initial_kept_groups},
          {"initial_kept_bytes", initial_kept_bytes},
          {"kept_groups", kept_groups},
          {"kept_bytes", kept_bytes},
          {"dropped_groups", dropped_groups},
          {"dropped_bytes", dropped_bytes},
          {"predicted_peak_bytes", prediction.peak_bytes},
          {"predicted_peak_at", prediction.peak_at},
          {"predicted_recompute_ms", prediction.recompute_ms},
          {"predicted_recomputed_nodes", prediction.recomputed_nodes},
          {"transient_producers", store_from.size()},
          {"chain_slots", chain_slots},
          {"node_sets", sets},
          {"groups", gs}};
  if (offload_costs) {
    j["offloaded_groups"] = offloaded_groups;
    j["offloaded_bytes"] = offloaded_bytes;
    j["predicted_offload_stall_ms"] = prediction.offload_stall_ms;
    j["offload_costs"] = {{"write_bytes_per_ms", offload_costs->write_bytes_per_ms},
                          {"read_bytes_per_ms", offload_costs->read_bytes_per_ms},
                          {"per_copy_ms", offload_costs->per_copy_ms},
                          {"min_bytes", offload_costs->min_bytes},
                          {"capacity_bytes", offload_costs->capacity_bytes == std::numeric_limits<int64_t>::max()
                                                 ? nlohmann::json(nullptr)
                                                 : nlohmann::json(offload_costs->capacity_bytes)}};
  }
  return j;
}

std::string Plan::to_table() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "plan (%s): budget %s = fixed occupancy %s + activation capacity %s\n",
                to_string(strategy), format_bytes(budget_bytes).c_str(), format_bytes(fixed_bytes).c_str(),
                format_bytes(capacity_bytes).c_str());
  os << line;
  std::snprintf(line, sizeof line, "  keep %lld of %lld groups (%s of %s); initial figure %lld groups / %s\n",
                static_cast<long long>(kept_groups), static_cast<long long>(groups.size()),
                format_bytes(kept_bytes).c_str(), format_bytes(kept_bytes + dropped_bytes).c_str(),
                static_cast<long long>(initial_kept_groups), format_bytes(initial_kept_bytes).c_str());
  os << line;
  std::snprintf(line, sizeof line,
                "  predicted peak %s at %s (unconstrained %s, feasible minimum %s); predicted recompute %.2f ms "
                "(%lld node re-runs)\n",
                format_bytes(prediction.peak_bytes).c_str(), prediction.peak_at.c_str(),
                format_bytes(unconstrained_peak_bytes).c_str(), format_bytes(minimum_peak_bytes).c_str(),
                prediction.recompute_ms, static_cast<long long>(prediction.recomputed_nodes));
  os << line;
  if (offload_costs) {
    std::snprintf(line, sizeof line,
                  "  offload %lld groups (%s) of the dropped; predicted copy stall %.2f ms (tier: write %.0f MB/s, "
                  "read %.0f MB/s)\n",
                  static_cast<long long>(offloaded_groups), format_bytes(offloaded_bytes).c_str(),
                  prediction.offload_stall_ms, offload_costs->write_bytes_per_ms / 1e3,
                  offload_costs->read_bytes_per_ms / 1e3);
    os << line;
  }
  if (!store_from.empty() && dropped_groups > 0) {
    std::snprintf(line, sizeof line, "  %zu producers re-run without storing until their planned backward step\n",
                  store_from.size());
    os << line;
  }
  std::map<std::string, std::array<int64_t, 4>> sets;
  std::vector<std::string> order;
  for (const auto& g : groups) {
    if (!sets.count(g.node_set)) order.push_back(g.node_set);
    auto& s = sets[g.node_set];
    s[g.keep ? 0 : 2] += 1;
    s[g.keep ? 1 : 3] += g.bytes;
  }
  std::snprintf(line, sizeof line, "  %-24s %8s %12s %8s %12s\n", "node set", "kept", "kept bytes", "dropped", "dropped bytes");
  os << line;
  for (const auto& name : order) {
    const auto& s = sets[name];
    std::snprintf(line, sizeof line, "  %-24s %8lld %12s %8lld %12s\n", name.c_str(), static_cast<long long>(s[0]),
                  format_bytes(s[1]).c_str(), static_cast<long long>(s[2]), format_bytes(s[3]).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace ration::memory
