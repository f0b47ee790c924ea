#include "ration/plan/context.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>

#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/plan/incremental.h"
#include "ration/plan/offload_peak.h"
#include "ration/plan/simulator.h"

namespace ration::memory {
namespace {

// Cost of re-running the producer of storage s if only s were dropped (its unsaved inputs re-run too).
// `saved` (by graph value): some backward saves it. `seen` (by node) holds `stamp` for the nodes counted
// so far; `count` counts them.
double single_cost(const PlanGraph& g, const std::vector<double>& forward_ms, const std::vector<char>& saved,
                   int64_t producer, std::vector<uint32_t>& seen, uint32_t stamp, int64_t& count) {
  if (producer < 0 || seen[static_cast<size_t>(producer)] == stamp) return 0;
  seen[static_cast<size_t>(producer)] = stamp;
  ++count;
  double cost = forward_ms[static_cast<size_t>(producer)];
  for (const auto& in : g.inputs[static_cast<size_t>(producer)]) {
    if (in.producer >= 0 && !(in.value >= 0 && saved[static_cast<size_t>(in.value)] != 0))
      cost += single_cost(g, forward_ms, saved, in.producer, seen, stamp, count);
  }
  return cost;
}


// The saved groups of a profile, in forward order of their producers, with the number of nodes a
// single release would re-run (the group's producer and its unsaved inputs' producers).
std::vector<Group> groups_of(const PlanGraph& g, std::vector<int64_t>& rerun_nodes) {
  const StepProfile& profile = g.profile;
  // Saved values, and saved storages in order of first save.
  std::vector<char> saved(g.values(), 0), storage_seen(g.storages, 0);
  std::vector<int64_t> saved_storages;
  for (const int v : g.saved.items) {
    if (v < 0) continue;
    saved[static_cast<size_t>(v)] = 1;
    const int s = g.storage[static_cast<size_t>(v)];
    if (s < 0 || storage_seen[static_cast<size_t>(s)]) continue;
    storage_seen[static_cast<size_t>(s)] = 1;
    saved_storages.push_back(s);
  }
  std::vector<uint32_t> seen(g.nodes, 0);
  uint32_t stamp = 0;
  const std::vector<double> forward_ms = typical_forward_ms(g);
  std::vector<std::pair<Group, int64_t>> found;
  for (int64_t s : saved_storages) {
    // Droppable (Simulator::droppable): saved, and allocated by a recorded node.
    if (profile.storages[static_cast<size_t>(s)].allocated_by < 0) continue;
    Group gr;
    gr.storage = s;
    gr.bytes = profile.storages[static_cast<size_t>(s)].bytes;
    gr.producer = profile.storages[static_cast<size_t>(s)].allocated_by;
    gr.op = profile.nodes[static_cast<size_t>(gr.producer)].op;
    gr.node_set = node_set_of(profile.nodes[static_cast<size_t>(gr.producer)].scope);
    int64_t rerun = 0;
    gr.recompute_ms = single_cost(g, forward_ms, saved, gr.producer, seen, ++stamp, rerun);
    found.emplace_back(gr, rerun);
  }
  // Sorted by index (a Group carries two strings: moving whole groups costs more than the sort).
  std::vector<size_t> order(found.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return found[a].first.producer < found[b].first.producer; });
  std::vector<Group> groups;
  groups.reserve(found.size());
  rerun_nodes.clear();
  for (size_t i : order) {
    groups.push_back(std::move(found[i].first));
    rerun_nodes.push_back(found[i].second);
  }
  return groups;
}

// The joint plan (knapsack with offload): a group's predicted cost when offloaded alone is its two copies'
// fixed cost plus whatever part of each copy does not hide under the compute between its saving and the
// end of forward (copy-out) or between the start of backward and its first use (copy-in).
double offload_alone_ms(const Group& g, const OffloadCosts& c, double forward_window_ms, double backward_window_ms) {
  const double bytes = static_cast<double>(g.bytes);
  return 2 * c.per_copy_ms + std::max(0.0, bytes / c.write_bytes_per_ms - forward_window_ms) +
         std::max(0.0, bytes / c.read_bytes_per_ms - backward_window_ms);
}

}  // namespace

// One measured forward time per node is noisy (a descheduled thread can triple it), and the knapsack
// order built on it then differs from run to run between nodes that do the same work. Nodes that do the
// same work — same op, same module path up to block numbers, same bytes allocated — get the median of
// their measured times, so identical layers cost the same and a single outlier does not move the order.
std::vector<double> typical_forward_ms(const PlanGraph& g) {
  const StepProfile& p = g.profile;
  // Each node's class of work, in one walk over the nodes in order; then the times by class.
  std::unordered_map<std::string, size_t> class_of;
  std::vector<size_t> cls(g.nodes);
  std::string key;
  for (size_t k = 0; k < g.nodes; ++k) {
    const ProfiledNode& n = p.nodes[k];
    key = n.op + "|";
    for (char ch : n.scope) key += (ch >= '0' && ch <= '9') ? '#' : ch;
    for (const int st : g.allocated[k]) key += "|" + std::to_string(p.storages[static_cast<size_t>(st)].bytes);
    cls[k] = class_of.emplace(key, class_of.size()).first->second;
  }
  std::vector<std::vector<double>> times(class_of.size());
  for (size_t k = 0; k < g.nodes; ++k) times[cls[k]].push_back(g.forward_ms[k]);
  std::vector<double> median(times.size());
  for (size_t c = 0; c < times.size(); ++c) {
    std::vector<double>& t = times[c];
    std::sort(t.begin(), t.end());
    median[c] = t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
  }
  std::vector<double> ms(g.nodes);
  for (size_t k = 0; k < g.nodes; ++k) ms[k] = median[cls[k]];
  return ms;
}

PlanContext::PlanContext(const StepProfile& profile, const PlanOptions& options)
    : profile_(profile), options_(options), graph_(std::make_shared<const PlanGraph>(profile)) {
  groups_ = groups_of(*graph_, rerun_nodes_);
  group_of_storage_.assign(graph_->storages, -1);
  for (size_t i = 0; i < groups_.size(); ++i) group_of_storage_[static_cast<size_t>(groups_[i].storage)] = static_cast<int>(i);
  const size_t n = groups_.size();
  // Everything kept: the incremental peak equals the simulator's (no offload, no transient re-runs), and
  // the descents start from it.
  all_kept_peak_.emplace(graph_, groups_, options_.extra_fixed_bytes, all_kept().decisions);
  unconstrained_peak_ = all_kept_peak_->peak();
  int64_t saved_total = 0;
  for (const auto& g : groups_) saved_total += g.bytes;
  // Fixed occupancy: the measured peak of everything that is not a saved activation.
  fixed_bytes_ = std::max<int64_t>(0, unconstrained_peak_ - saved_total);

  // Knapsack order by predicted cost per byte; with offload (knapsack only) a group is offloaded where
  // the copy alone would hide better than re-running its producers.
  std::vector<double> cost(n);
  release_as_.assign(n, Decision::Recompute);
  for (size_t i = 0; i < n; ++i) cost[i] = groups_[i].recompute_ms;
  if (options.offload && options.strategy == Strategy::Knapsack && options.offload->capacity_bytes > 0) {
    const OffloadCosts& c = *options.offload;
    RATION_CHECK(c.write_bytes_per_ms > 0 && c.read_bytes_per_ms > 0, "offload planning needs measured tier bandwidths");
    const SaveSpan& span = save_span(*graph_);
    const std::vector<double>& end_f = graph_->forward_end;
    const double fwd_total = end_f.empty() ? 0 : end_f.back();
    std::vector<double> bwd_before(graph_->nodes, 0);  // backward time before the node runs
    for (size_t j = 0; j < profile.backward_order.size(); ++j)
      bwd_before[static_cast<size_t>(profile.backward_order[j])] = graph_->backward_start[j];
    for (size_t i = 0; i < n; ++i) {
      const Group& g = groups_[i];
      const auto st = static_cast<size_t>(g.storage);
      if (g.bytes < std::max<int64_t>(c.min_bytes, 1) || span.saved_at[st] < 0) continue;
      const double window = fwd_total - end_f[static_cast<size_t>(span.saved_at[st])];
      // A copy that cannot land before forward ends, at 1/margin of the measured bandwidth, would make
      // forward's last node wait (a deadline it misses): such a group is kept or recomputed instead.
      const double slow_copy = std::max(1.0, c.deadline_margin) * (c.per_copy_ms + static_cast<double>(g.bytes) / c.write_bytes_per_ms);
      if (slow_copy > window) continue;
      const double alone = offload_alone_ms(g, c, window, bwd_before[static_cast<size_t>(span.first_use[st])]);
      if (alone < g.recompute_ms) {
        release_as_[i] = Decision::Offload;
        any_offload_release_ = true;
        cost[i] = alone;
      }
    }
  }
  by_ratio_.resize(n);
  std::iota(by_ratio_.begin(), by_ratio_.end(), 0);
  std::stable_sort(by_ratio_.begin(), by_ratio_.end(), [&](size_t a, size_t b) {
    return cost[a] / static_cast<double>(std::max<int64_t>(groups_[a].bytes, 1)) <
           cost[b] / static_cast<double>(std::max<int64_t>(groups_[b].bytes, 1));
  });
  // Orders that depend on memory and graph structure only (never on measured time), for the floor.
  std::vector<size_t> forward(n);
  std::iota(forward.begin(), forward.end(), 0);
  std::vector<size_t> structural = forward;  // fewest re-run nodes per byte first, ties in forward order
  std::stable_sort(structural.begin(), structural.end(), [&](size_t a, size_t b) {
    return static_cast<double>(rerun_nodes_[a]) / static_cast<double>(std::max<int64_t>(groups_[a].bytes, 1)) <
           static_cast<double>(rerun_nodes_[b]) / static_cast<double>(std::max<int64_t>(groups_[b].bytes, 1));
  });
  std::vector<size_t> largest(forward.rbegin(), forward.rend());  // largest first, ties latest first
  std::stable_sort(largest.begin(), largest.end(), [&](size_t a, size_t b) { return groups_[a].bytes > groups_[b].bytes; });
  memory_orders_ = {std::move(structural), std::move(largest)};
  restarted_.assign(kBaseOrders, 0);
}

std::vector<size_t> PlanContext::rerun_at_peak(const std::vector<Decision>& stalled) const {
  const Prediction pr = predict(stalled);
  const std::vector<int64_t>& bw = pr.backward_peaks;
  const auto top = std::max_element(bw.begin(), bw.end());
  if (top == bw.end() || *top < pr.peak_bytes) return {};  // the peak is in forward: nothing re-runs there
  const PlanGraph& g = *graph_;
  std::vector<size_t> found;  // released groups, in the order reached
  std::vector<char> seen(groups_.size(), 0), node_seen(g.nodes, 0);
  std::vector<int> reruns;  // producers re-run, in the order reached
  // A value the re-runs need, on storage s, made by `producer` (-1: a leaf): a kept group is there (an
  // offloaded one is fetched back); a recomputed one, or a value no backward saves, is rebuilt by re-running
  // its producer.
  auto need = [&](int64_t s, int producer) {
    const int gi = group_of_storage(s);
    if (gi >= 0) {
      const auto i = static_cast<size_t>(gi);
      if (seen[i] || stalled[i] != Decision::Recompute) return;
      seen[i] = 1;
      found.push_back(i);
      producer = static_cast<int>(groups_[i].producer);
    }
    if (producer < 0 || node_seen[static_cast<size_t>(producer)]) return;
    node_seen[static_cast<size_t>(producer)] = 1;
    reruns.push_back(producer);
  };
  const auto node = static_cast<size_t>(profile_.backward_order[static_cast<size_t>(top - bw.begin())]);
  for (const int v : g.saved[node]) need(g.key_storage[static_cast<size_t>(v)], -1);
  for (size_t k = 0; k < reruns.size(); ++k)
    for (const PlanGraph::Input& in : g.inputs[static_cast<size_t>(reruns[k])]) need(g.storage_of(in), in.producer);
  return found;
}

void PlanContext::restart_order(size_t o, const std::vector<Decision>& stalled) {
  if (!options_.floor_restarts || o >= kBaseOrders || restarted_[o]) return;
  restarted_[o] = 1;
  std::vector<char> held(groups_.size(), 0);
  bool any = false;
  for (const size_t i : rerun_at_peak(stalled)) {
    held[i] = 1;
    any = true;
  }
  if (!any) return;
  std::vector<size_t> order;
  for (const size_t i : memory_orders_[o])
    if (!held[i]) order.push_back(i);
  if (std::find(memory_orders_.begin(), memory_orders_.end(), order) == memory_orders_.end())
    memory_orders_.push_back(std::move(order));
}

namespace {
// The tier stores each offloaded buffer in whole file-system pages.
constexpr int64_t kTierPage = 4096;
int64_t in_tier(int64_t bytes) { return (bytes + kTierPage - 1) / kTierPage * kTierPage; }
}  // namespace

Decision PlanContext::release_decision(size_t i, const std::vector<Decision>& decisions) const {
  if (release_as_[i] != Decision::Offload) return release_as_[i];
  int64_t offloaded = 0;
  for (size_t j = 0; j < groups_.size(); ++j)
    if (j != i && decisions[j] == Decision::Offload) offloaded += in_tier(groups_[j].bytes);
  return release_decision(i, offloaded);
}

Decision PlanContext::release_decision(size_t i, int64_t offloaded_in_tier) const {
  if (release_as_[i] != Decision::Offload) return release_as_[i];
  return in_tier(groups_[i].bytes) <= options_.offload->capacity_bytes - offloaded_in_tier ? Decision::Offload
                                                                                           : Decision::Recompute;
}

bool PlanContext::keep_or_recompute(const std::vector<Decision>& d) const {
  return !any_offload_release_ && std::find(d.begin(), d.end(), Decision::Offload) == d.end();
}

IncrementalPeak PlanContext::incremental(const std::vector<Decision>& d) const {
  // Descents start from everything kept: build that one once and hand out copies. Every copy, and a peak
  // for other decisions, shares its static data (keys, node inputs, release steps).
  if (!all_kept_peak_) all_kept_peak_.emplace(graph_, groups_, options_.extra_fixed_bytes, all_kept().decisions);
  if (std::all_of(d.begin(), d.end(), [](Decision x) { return x == Decision::Keep; })) return *all_kept_peak_;
  return IncrementalPeak(*all_kept_peak_, d);
}

Choice PlanContext::all_kept() const {
  Choice c;
  c.decisions.assign(groups_.size(), Decision::Keep);
  return c;
}

Prediction PlanContext::predict(const std::vector<Decision>& decisions,
                                const std::map<int64_t, int64_t>& store_from) const {
  return predict_until(decisions, store_from, std::numeric_limits<int64_t>::max());
}

int64_t PlanContext::peak_below(const std::vector<Decision>& decisions, int64_t stop_at,
                                const std::map<int64_t, int64_t>& store_from) const {
  return predict_until(decisions, store_from, stop_at).peak_bytes;
}

bool PlanContext::fits(const std::vector<Decision>& decisions, const std::map<int64_t, int64_t>& store_from) const {
  const int64_t over = budget() == std::numeric_limits<int64_t>::max() ? budget() : budget() + 1;
  return peak_below(decisions, over, store_from) <= budget();
}

const std::vector<Decision>& PlanContext::by_storage(const std::vector<Decision>& decisions) const {
  by_storage_.assign(profile_.storages.size(), Decision::Keep);
  for (size_t i = 0; i < groups_.size(); ++i) by_storage_[static_cast<size_t>(groups_[i].storage)] = decisions[i];
  return by_storage_;
}

double PlanContext::offload_stall(const std::vector<Decision>& decisions) const {
  if (last_prediction_ && last_prediction_->decisions == decisions) return last_prediction_->prediction.offload_stall_ms;
  // simulate reports the schedule's stall where some storage is offloaded, 0 where none is.
  if (!options_.offload || std::find(decisions.begin(), decisions.end(), Decision::Offload) == decisions.end()) return 0;
  return schedule_offloads(*graph_, by_storage(decisions), *options_.offload).stall_ms;
}

Prediction PlanContext::predict_until(const std::vector<Decision>& decisions, const std::map<int64_t, int64_t>& store_from,
                                      int64_t stop_at) const {
  // A strategy's last fit check and the plan's final prediction are usually the same decisions.
  if (last_prediction_ && last_prediction_->decisions == decisions && last_prediction_->store_from == store_from)
    return last_prediction_->prediction;
  const std::vector<Decision>& d = by_storage(decisions);
  const int64_t extra = options_.extra_fixed_bytes;
  Prediction pred;
  bool stopped = false;
  if (!options_.offload) {
    pred = simulate(*graph_, d, extra, store_from, nullptr, stop_at, &stopped);
  } else {
    const OffloadSchedule sch = schedule_offloads(*graph_, d, *options_.offload);
    pred = simulate(*graph_, d, extra, store_from, &sch, stop_at, &stopped);
  }
  if (!stopped) last_prediction_ = LastPrediction{decisions, store_from, pred};
  return pred;
}

int64_t PlanContext::descend_by_recompute(std::vector<Decision>& d, int64_t target, const std::vector<size_t>& order,
                                          std::optional<IncrementalPeak>& inc_slot, Trail* trail) const {
  auto took = [&](size_t i, int64_t peak) {
    if (trail != nullptr) trail->releases.push_back({i, d[i], peak});
  };
  inc_slot.emplace(incremental(d));
  IncrementalPeak& inc = *inc_slot;
  int64_t peak = inc.peak();
  if (trail != nullptr) trail->start = peak;
  bool progress = true;
  // A try's answer depends on the committed plan only. Once a pass comes back to where the previous pass
  // made its last release without releasing anything on the way, every group still kept has been tried
  // against the plan as it is (those after that place by the previous pass, after its last release) and
  // refused: the descent is over, as the rest of the pass would find.
  size_t last_release = order.size();  // position in `order`; order.size(): none in this pass yet
  while (peak > target && progress) {
    progress = false;
    const size_t stop_at = last_release;
    last_release = order.size();
    for (size_t at = 0; at < order.size(); ++at) {
      if (!progress && at == stop_at) break;
      const size_t i = order[at];
      if (d[i] != Decision::Keep) continue;
      // Only "lower than now" matters: the evaluation may stop once it reaches the current peak.
      const int64_t p = inc.peak_if(i, Decision::Recompute, peak);
      if (p < peak) {
        inc.set(i, Decision::Recompute);
        d[i] = Decision::Recompute;
        peak = p;
        took(i, peak);
        progress = true;
        last_release = at;
        if (peak <= target) break;
      }
    }
  }
  return peak;
}

// Releasing is not monotone: a released run of values is rebuilt and held together in backward, so a
// release that only adds recompute transients is undone.
int64_t PlanContext::descend(std::vector<Decision>& d, int64_t target, const std::vector<size_t>& order,
                             std::optional<IncrementalPeak>* reached, Trail* trail) const {
  auto took = [&](size_t i, int64_t peak) {
    if (trail != nullptr) trail->releases.push_back({i, d[i], peak});
  };
  if (keep_or_recompute(d)) {  // the same descent, each try priced by the incremental peak
    std::optional<IncrementalPeak> own;
    return descend_by_recompute(d, target, order, reached != nullptr ? *reached : own, trail);
  }
  if (reached != nullptr) reached->reset();
  if (offload_peak_applies(d)) return descend_by_offload_peak(d, target, order, trail);
  int64_t peak = predict(d).peak_bytes;
  if (trail != nullptr) trail->start = peak;
  bool progress = true;
  while (peak > target && progress) {
    progress = false;
    for (size_t i : order) {
      if (d[i] != Decision::Keep) continue;
      d[i] = release_decision(i, d);
      // Only "lower than now" matters: the simulation may stop once it reaches the current peak.
      int64_t p = peak_below(d, peak);
      if (p >= peak && d[i] == Decision::Offload) {  // an offload held too long to help: try recomputing it
        d[i] = Decision::Recompute;
        p = peak_below(d, peak);
      }
      if (p < peak) {
        peak = p;
        took(i, peak);
        progress = true;
        if (peak <= target) break;
      } else {
        d[i] = Decision::Keep;
      }
    }
  }
  return peak;
}

bool PlanContext::offload_peak_applies(const std::vector<Decision>& d) const {
  return options_.offload && options_.offload_peak &&
         std::find(d.begin(), d.end(), Decision::Offload) == d.end();
}

// descend's loop with offload, each try priced by the offload-aware peak. Its rejections hold (its peaks are
// lower bounds of the simulator's); an acceptance is simulated where the model's answer is not exact (a
// re-run would read a copy before the model holds it), and once such a release is taken the model is built
// again for the plan, with the simulator's fetches on demand. Where that model is not the simulator's
// figure for figure, the rest of the descent is simulated.
int64_t PlanContext::descend_by_offload_peak(std::vector<Decision>& d, int64_t target, const std::vector<size_t>& order,
                                             Trail* trail) const {
  std::optional<OffloadPeak> model;
  model.emplace(incremental(d), *graph_, groups_, *options_.offload, d);
  int64_t peak = model->peak();
  if (trail != nullptr) trail->start = peak;
  Prediction simulated;  // the last simulated try, whole where it ran to the end
  std::vector<int64_t> on_demand;
  int64_t in_tier_bytes = 0;  // the offloaded groups' room in the tier (release_decision)
  // A try's peak where below `peak` (exact), else a value >= peak; `by_simulation`: priced by the simulator.
  auto price = [&](size_t i, Decision to, bool& by_simulation) {
    if (model) {
      const OffloadPeak::Price p = model->price(i, to, peak);
      by_simulation = p.peak < peak && !p.exact;
      if (!by_simulation) return p.peak;
    }
    by_simulation = true;
    d[i] = to;
    const std::vector<Decision>& by_storage_now = by_storage(d);
    const OffloadSchedule sch = schedule_offloads(*graph_, by_storage_now, *options_.offload);
    on_demand.assign(graph_->storages, -1);
    simulated = simulate(*graph_, by_storage_now, options_.extra_fixed_bytes, {}, &sch, peak, nullptr, &on_demand);
    d[i] = Decision::Keep;
    return simulated.peak_bytes;
  };
  bool progress = true;
  while (peak > target && progress) {
    progress = false;
    for (size_t i : order) {
      if (d[i] != Decision::Keep) continue;
      Decision to = release_decision(i, in_tier_bytes);
      bool by_simulation = false;
      int64_t p = price(i, to, by_simulation);
      if (p >= peak && to == Decision::Offload) {  // an offload held too long to help: try recomputing it
        to = Decision::Recompute;
        p = price(i, to, by_simulation);
      }
      if (p >= peak) continue;
      d[i] = to;
      peak = p;
      if (to == Decision::Offload) in_tier_bytes += in_tier(groups_[i].bytes);
      if (model && !by_simulation) {
        model->commit(i, to);
      } else if (model) {
        std::vector<Decision> held = d;  // the keep/recompute part: a copy is held as a kept group
        std::replace(held.begin(), held.end(), Decision::Offload, Decision::Keep);
        model.emplace(incremental(held), *graph_, groups_, *options_.offload, d, &simulated, &on_demand);
        if (!model->in_step()) model.reset();
      }
      if (trail != nullptr) trail->releases.push_back({i, to, peak});
      progress = true;
      if (peak <= target) break;
    }
  }
  return peak;
}

const std::string& PlanContext::why_not_chain() {
  if (!why_not_chain_) why_not_chain_ = memory::why_not_chain(profile_);
  return *why_not_chain_;
}

const std::vector<ChainCandidate>& PlanContext::chain_candidates() {
  if (!chain_candidates_) {
    chain_candidates_ = why_not_chain().empty() ? memory::chain_candidates(profile_, groups_, options_.extra_fixed_bytes)
                                                : std::vector<ChainCandidate>{};
  }
  return *chain_candidates_;
}

int64_t PlanContext::minimum_peak() {
  if (!minimum_peak_) {
    int64_t floor = unconstrained_peak_;
    floor_trails_.assign(memory_orders_.size(), Trail{});
    for (size_t o = 0; o < memory_orders_.size(); ++o) {  // restarts are added to the orders as it goes
      std::vector<Decision> lowest = all_kept().decisions;
      floor = std::min(floor, descend(lowest, 0, memory_orders_[o], nullptr, &floor_trails_[o]));
      restart_order(o, lowest);
      floor_trails_.resize(memory_orders_.size());
    }
    // On a chain, binomial schedules (recompute without storing) reach further down.
    for (const auto& c : chain_candidates()) floor = std::min(floor, c.prediction.peak_bytes);
    minimum_peak_ = floor;
  }
  return *minimum_peak_;
}

std::optional<Choice> PlanContext::reach_budget_by_memory_order() const {
  for (size_t o = 0; o < memory_orders_.size(); ++o) {
    Choice c = all_kept();
    if (o < floor_trails_.size()) {  // the floor's descent in this order, up to the budget
      const Trail& t = floor_trails_[o];
      if (t.start <= budget()) return c;
      for (const Trail::Release& r : t.releases) {
        c.decisions[r.group] = r.decision;
        if (r.peak <= budget()) return c;
      }
      continue;
    }
    if (descend(c.decisions, budget(), memory_orders_[o]) <= budget()) return c;
  }
  return std::nullopt;
}

void PlanContext::keep_back(IncrementalPeak& inc, std::vector<Decision>& d, const std::vector<size_t>& order) const {
  // Only "over the budget or not" matters: evaluations may stop once they pass it.
  const int64_t over = budget() == IncrementalPeak::kExact ? IncrementalPeak::kExact : budget() + 1;
  for (size_t r = order.size(); r-- > 0;) {
    const size_t i = order[r];
    if (d[i] == Decision::Keep || inc.peak_if(i, Decision::Keep, over) > budget()) continue;
    inc.set(i, Decision::Keep);
    d[i] = Decision::Keep;
  }
}

const std::optional<Choice>& PlanContext::stable_plan() {
  if (stable_plan_known_) return stable_plan_;
  stable_plan_known_ = true;
  if (unconstrained_peak_ <= budget()) return stable_plan_ = all_kept();
  for (size_t o = 0; o < memory_orders_.size(); ++o) {
    const std::vector<size_t>& order = memory_orders_[o];
    std::vector<Decision> d = all_kept().decisions;
    std::optional<IncrementalPeak> inc;
    if (!any_offload_release_ && o < floor_trails_.size()) {
      // The floor's descent in this order (by recompute: no group releases as an offload) took the same
      // releases up to the budget.
      bool reached = floor_trails_[o].start <= budget();
      for (size_t r = 0; r < floor_trails_[o].releases.size() && !reached; ++r) {
        d[floor_trails_[o].releases[r].group] = Decision::Recompute;
        reached = floor_trails_[o].releases[r].peak <= budget();
      }
      if (!reached) continue;
      inc.emplace(incremental(d));
    } else if (descend_by_recompute(d, budget(), order, inc) > budget()) {
      continue;
    }
    keep_back(*inc, d, order);
    Choice c;
    c.decisions = std::move(d);
    return stable_plan_ = std::move(c);
  }
  if (const ChainCandidate* best = best_chain_fit(chain_candidates(), budget()))
    stable_plan_ = Choice{best->decisions, best->store_from, best->slots};
  return stable_plan_;
}

// The floor is within the budget exactly when everything kept is, when some memory order's descent to
// 0 passes the budget on its way down (its peak falls with every release), or when a chain candidate is.
// A descent to the budget takes the same releases as the one to 0 until it reaches the budget, so it
// answers the second without the rest of the way down — where releases extend the longest re-run
// cascades —, and one order that reaches it makes the other unnecessary. Its trail is the prefix the
// memory-ordered fall-back reads.
bool PlanContext::budget_within_floor() {
  if (within_floor_known_ || unconstrained_peak_ <= budget()) return true;
  floor_trails_.clear();
  for (size_t o = 0; o < memory_orders_.size(); ++o) {
    std::vector<Decision> d = all_kept().decisions;
    floor_trails_.emplace_back();
    if (descend(d, budget(), memory_orders_[o], nullptr, &floor_trails_.back()) <= budget()) return within_floor_known_ = true;
    restart_order(o, d);  // stalled above the budget: where the descent to 0 stalls too
  }
  for (const auto& c : chain_candidates())
    if (c.prediction.peak_bytes <= budget()) return within_floor_known_ = true;
  return false;
}

void PlanContext::check_budget_reachable() {
  if (!minimum_peak_ && !options_.report_minimum && budget_within_floor()) return;
  RATION_CHECK(budget() >= minimum_peak(), "memory budget ", format_bytes(budget()), " is below the feasible minimum ",
               format_bytes(minimum_peak()), " for this model and batch (fixed occupancy ", format_bytes(fixed_bytes_),
               ": parameters, gradients, optimiser state and workspace, plus what must stay saved). "
               "Raise --memory-budget or lower train.batch_size.");
}

}  // namespace ration::memory
