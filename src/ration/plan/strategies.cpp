// plan/strategies.cpp — the planner's strategies, one function each over a PlanContext, and the one
// table that names them (parsing, printing, the config check and help texts all read it).
// Owns: every strategy's rule for choosing decisions, and the strategy table.
// Does not own: predictions, the knapsack order and the descent (plan/context.h), user overrides and the
//       final plan (planner.cpp).
#include "ration/plan/strategies.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::memory {
namespace {

// The joint plan's clean-up passes: one offload is switched to recompute per pass where its marginal
// stall on the shared copy queues exceeds its recompute cost. Each pass re-simulates every offload, so
// the passes are capped; by the third the queues have settled on every model measured (later passes
// changed nothing).
constexpr int kOffloadRepairPasses = 3;

// Exchanges after the knapsack's descent (keep/recompute plans that fit): the descent takes a release only
// where it lowers the peak on its own and ranks groups by cost per byte, so where several cheap releases
// would lower the peak together, or a small cheap group would do where a large one is cheaper per byte, it
// takes one expensive group instead. An exchange keeps back one recomputed group (those whose keeping back
// saves the most time first, at most kExchanges of them per round, in at most kExchangeRounds rounds),
// prices every kept group's release against that plan (the recompute time it adds, simulated: a group
// whose producer is re-run anyway adds nothing), releases groups in order of that time per byte (bytes
// counted in full, or only up to what the plan is over the budget) or of that time alone, where they do not
// raise the peak until the plan fits again, keeps back what still fits, and is taken where the plan's predicted
// recompute time drops. It costs a simulation per group, so exchanges run on plans of at most
// kExchangeGroups groups (docs/METHODS.md, "The exact yardstick").
constexpr size_t kExchanges = 16;
constexpr size_t kExchangeRounds = 8;
constexpr size_t kExchangeGroups = 256;

// From `d`, releases in `order` (a producer's other groups right after it: its re-run restores them all)
// where they do not raise the peak, until the plan fits; then keeps back what fits, the groups `d` already
// recomputed first (`recomputed`, the last tried first), then `order` from its end. Empty: it never fits.
std::vector<Decision> refill(const PlanContext& ctx, std::vector<Decision> d, const std::vector<size_t>& order,
                             const std::vector<size_t>& recomputed) {
  const std::vector<Group>& groups = ctx.groups();
  std::map<int64_t, std::vector<size_t>> of_producer;
  for (size_t i : order) of_producer[groups[i].producer].push_back(i);
  IncrementalPeak inc = ctx.incremental(d);
  int64_t peak = inc.peak();
  // A release: the group with its producer's other kept groups where that does not raise the peak (released
  // alone, a small one — layer norm's statistics — re-runs its producer and holds the others' fresh copies),
  // else the group alone.
  auto release = [&](size_t i) {
    if (d[i] != Decision::Keep || peak <= ctx.budget()) return false;
    std::vector<size_t> unit;
    for (size_t sibling : of_producer[groups[i].producer])
      if (d[sibling] == Decision::Keep) unit.push_back(sibling);
    if (unit.size() > 1) {
      for (size_t u : unit) inc.set(u, Decision::Recompute);
      const int64_t p = inc.peak();
      if (p <= peak) {
        for (size_t u : unit) d[u] = Decision::Recompute;
        peak = p;
        return true;
      }
      for (size_t u : unit) inc.set(u, Decision::Keep);
    }
    const int64_t p = inc.peak_if(i, Decision::Recompute, peak + 1);
    if (p > peak) return false;
    inc.set(i, Decision::Recompute);
    d[i] = Decision::Recompute;
    peak = p;
    return true;
  };
  for (bool progress = true; progress && peak > ctx.budget();) {
    progress = false;
    for (size_t i : order) {
      if (!release(i)) continue;
      progress = true;
      for (size_t sibling : of_producer[groups[i].producer]) release(sibling);
    }
  }
  if (peak > ctx.budget()) return {};
  std::vector<size_t> back = order;
  back.insert(back.end(), recomputed.begin(), recomputed.end());
  ctx.keep_back(inc, d, back);
  return d;
}

// One exchange: group x kept back (none: x = d.size()), the plan refilled in four orders; the best, or
// empty.
std::vector<Decision> exchange_once(const PlanContext& ctx, std::vector<Decision> d, size_t x) {
  const std::vector<Group>& groups = ctx.groups();
  if (x < d.size()) d[x] = Decision::Keep;
  const double base = ctx.predict(d).recompute_ms;
  std::vector<size_t> kept, recomputed;  // recomputed: most expensive last (kept back first)
  std::vector<double> added(d.size(), 0);  // by group: the recompute ms its release adds
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] != Decision::Keep) recomputed.push_back(i);
    if (i == x || d[i] != Decision::Keep) continue;
    d[i] = Decision::Recompute;
    added[i] = ctx.predict(d).recompute_ms - base;
    d[i] = Decision::Keep;
    kept.push_back(i);
  }
  std::stable_sort(recomputed.begin(), recomputed.end(),
                   [&](size_t a, size_t b) { return groups[a].recompute_ms < groups[b].recompute_ms; });
  auto bytes = [&](size_t i) { return static_cast<double>(std::max<int64_t>(1, groups[i].bytes)); };
  // Orders: added time per byte; per byte counted only up to what the plan is over the budget (a group
  // larger than the excess frees more than is needed); added time alone; and the fourth, below.
  const double excess = static_cast<double>(std::max<int64_t>(1, ctx.incremental(d).peak() - ctx.budget()));
  auto by = [&](auto key) {
    std::vector<size_t> order = kept;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return key(a) != key(b) ? key(a) < key(b) : bytes(a) > bytes(b);
    });
    return order;
  };
  // A fourth: added time per byte of the producer's kept groups together (one re-run restores them all, and
  // refill releases them together), latest first among equals: near the floor a recurrent model's cells all
  // cost the same, and a late cell's whole set frees more at the peak than an early cell's largest value.
  std::map<int64_t, double> set_bytes;
  for (size_t i : kept) set_bytes[groups[i].producer] += bytes(i);
  std::vector<size_t> by_set(kept.rbegin(), kept.rend());
  std::stable_sort(by_set.begin(), by_set.end(), [&](size_t a, size_t b) {
    return added[a] / set_bytes[groups[a].producer] < added[b] / set_bytes[groups[b].producer];
  });
  const std::vector<std::vector<size_t>> orders = {
      by([&](size_t i) { return added[i] / bytes(i); }),
      by([&](size_t i) { return added[i] / std::min(bytes(i), excess); }),
      by([&](size_t i) { return added[i]; }), by_set};
  std::vector<Decision> best;
  double best_ms = 0;
  for (const std::vector<size_t>* order : {&orders[0], &orders[1], &orders[2], &orders[3]}) {
    std::vector<Decision> tried = refill(ctx, d, *order, recomputed);
    if (tried.empty()) continue;
    const double ms = ctx.predict(tried).recompute_ms;
    if (best.empty() || ms < best_ms) {
      best = std::move(tried);
      best_ms = ms;
    }
  }
  return best;
}

// Rounds of exchanges: each tries the most expensive recomputed groups of the plan as it is and takes the
// first exchange that lowers its recompute time; a round without one ends them (at most kExchangeRounds).
void exchange_releases(const PlanContext& ctx, std::vector<Decision>& d) {
  if (d.size() > kExchangeGroups) return;
  double best = ctx.predict(d).recompute_ms;
  // First, the plan refilled from everything kept, with each release priced against that: where the
  // descent fell back to a memory order (it releases many groups), this is often far cheaper.
  if (std::vector<Decision> fresh = exchange_once(ctx, ctx.all_kept().decisions, d.size()); !fresh.empty()) {
    const double ms = ctx.predict(fresh).recompute_ms;
    if (ms < best) {
      best = ms;
      d = std::move(fresh);
    }
  }
  for (size_t round = 0; round < kExchangeRounds; ++round) {
    // The recomputed groups whose keeping back would save the most time (simulated) first.
    std::vector<std::pair<double, size_t>> saving;
    for (size_t i = 0; i < d.size(); ++i) {
      if (d[i] != Decision::Recompute) continue;
      d[i] = Decision::Keep;
      saving.emplace_back(best - ctx.predict(d).recompute_ms, i);
      d[i] = Decision::Recompute;
    }
    std::stable_sort(saving.begin(), saving.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<size_t> dropped;
    for (size_t k = 0; k < saving.size() && k < kExchanges; ++k) dropped.push_back(saving[k].second);
    bool improved = false;
    for (size_t x : dropped) {
      std::vector<Decision> tried = exchange_once(ctx, d, x);
      if (tried.empty()) continue;
      const double ms = ctx.predict(tried).recompute_ms;
      if (ms < best) {
        best = ms;
        d = std::move(tried);
        improved = true;
        break;
      }
    }
    if (!improved) break;
  }
}

// Swaps after the exchanges: a set of recomputed groups kept back (one group, or every recomputed group of
// one producer) while a set of kept groups is released (one group, or every kept group of one producer), where
// the plan still fits and its predicted recompute time drops. The exchanges release groups one at a time where
// each lowers the peak; near the floor, where every release that fits is worth about the same, the cheaper
// plan can differ from theirs in several groups at once (a recurrent model's cells: a cell re-run late in the
// sequence frees what two re-run early ones do), reached by a run of such swaps. Pairs are tried in order of
// their estimated gain (the saving of the kept-back set alone less the added time of the released set alone,
// both simulated against the plan); the first that fits and, with what still fits kept back, gains is taken;
// at most kSwapRounds swaps (docs/METHODS.md, "The exact yardstick").
constexpr size_t kSwapRounds = 32;

// The candidate sets of one side: each group whose decision is `from`, alone, and each producer's groups with
// that decision where there are several.
std::vector<std::vector<size_t>> swap_sets(const PlanContext& ctx, const std::vector<Decision>& d, Decision from) {
  std::vector<std::vector<size_t>> sets;
  std::map<int64_t, std::vector<size_t>> of_producer;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] != from) continue;
    sets.push_back({i});
    of_producer[ctx.groups()[i].producer].push_back(i);
  }
  for (auto& [producer, members] : of_producer)
    if (members.size() > 1) sets.push_back(std::move(members));
  return sets;
}

// The predicted recompute time with `set` switched to `to` (switched back before returning).
double recompute_ms_with(const PlanContext& ctx, std::vector<Decision>& d, const std::vector<size_t>& set, Decision to) {
  const Decision was = d[set.front()];
  for (size_t i : set) d[i] = to;
  const double ms = ctx.predict(d).recompute_ms;
  for (size_t i : set) d[i] = was;
  return ms;
}

// With `tried`'s peak in `inc` (d with sets changed): where it fits, it takes back what still fits; where its
// recompute time is then below `best` it becomes d (true); else false (`inc` is left holding `tried` as given,
// without what was kept back). Kept back before it is judged: a swap whose sets alone gain nothing can leave room
// for groups its estimate did not count (gpt at 2 layers near its floor: one block's attention weights re-run
// where its first linear, its residual sum and its last dropout were).
bool take_if_better(const PlanContext& ctx, std::vector<Decision>& d, double& best, std::vector<Decision>& tried,
                    IncrementalPeak& inc) {
  if (inc.peak() > ctx.budget()) return false;
  std::vector<size_t> order(d.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  IncrementalPeak kept = inc;  // `inc` stays at `tried` as given: a caller undoes its own changes where it is not taken
  ctx.keep_back(kept, tried, order);
  const double ms = ctx.predict(tried).recompute_ms;
  if (ms >= best - 1e-9) return false;
  d = std::move(tried);
  best = ms;
  return true;
}

// One set kept back for several released: for the kSwapBacks kept-back sets that save the most, released sets
// whose added time is below that saving, cheapest added time per byte first, each where it lowers the peak,
// until the plan fits.
constexpr size_t kSwapBacks = 16;
bool swap_many(const PlanContext& ctx, std::vector<Decision>& d, double& best, const std::vector<std::vector<size_t>>& back,
               const std::vector<double>& saving, const std::vector<std::vector<size_t>>& out,
               const std::vector<double>& added, const IncrementalPeak& committed) {
  std::vector<size_t> by_saving(back.size()), by_added(out.size());
  for (size_t b = 0; b < back.size(); ++b) by_saving[b] = b;
  for (size_t o = 0; o < out.size(); ++o) by_added[o] = o;
  std::stable_sort(by_saving.begin(), by_saving.end(), [&](size_t x, size_t y) { return saving[x] > saving[y]; });
  auto bytes = [&](size_t o) {
    int64_t b = 0;
    for (size_t i : out[o]) b += ctx.groups()[i].bytes;
    return static_cast<double>(std::max<int64_t>(1, b));
  };
  std::stable_sort(by_added.begin(), by_added.end(), [&](size_t x, size_t y) { return added[x] / bytes(x) < added[y] / bytes(y); });
  for (size_t k = 0; k < by_saving.size() && k < kSwapBacks; ++k) {
    const size_t b = by_saving[k];
    if (saving[b] <= 1e-9) break;
    IncrementalPeak inc = committed;
    std::vector<Decision> tried = d;
    for (size_t i : back[b]) {
      inc.set(i, Decision::Keep);
      tried[i] = Decision::Keep;
    }
    int64_t peak = inc.peak();
    double spent = 0;
    for (size_t o : by_added) {
      if (peak <= ctx.budget()) break;
      if (spent + added[o] >= saving[b] - 1e-9) continue;
      if (std::any_of(out[o].begin(), out[o].end(), [&](size_t i) { return tried[i] != Decision::Keep; })) continue;
      for (size_t i : out[o]) inc.set(i, Decision::Recompute);
      const int64_t p = inc.peak();
      if (p < peak) {
        for (size_t i : out[o]) tried[i] = Decision::Recompute;
        peak = p;
        spent += added[o];
      } else {
        for (size_t i : out[o]) inc.set(i, Decision::Keep);
      }
    }
    if (take_if_better(ctx, d, best, tried, inc)) return true;
  }
  return false;
}

// One swap that fits and lowers the recompute time below `best` (d changed, true), or none (d unchanged).
bool swap_once(const PlanContext& ctx, std::vector<Decision>& d, double& best) {
  const std::vector<std::vector<size_t>> back = swap_sets(ctx, d, Decision::Recompute);
  const std::vector<std::vector<size_t>> out = swap_sets(ctx, d, Decision::Keep);
  std::vector<double> saving(back.size()), added(out.size());
  for (size_t b = 0; b < back.size(); ++b) saving[b] = best - recompute_ms_with(ctx, d, back[b], Decision::Keep);
  for (size_t o = 0; o < out.size(); ++o) added[o] = recompute_ms_with(ctx, d, out[o], Decision::Recompute) - best;
  std::vector<std::tuple<double, size_t, size_t>> pairs;  // (estimated gain, kept back, released)
  for (size_t b = 0; b < back.size(); ++b)
    for (size_t o = 0; o < out.size(); ++o)
      if (saving[b] - added[o] > 1e-9) pairs.emplace_back(saving[b] - added[o], b, o);
  std::stable_sort(pairs.begin(), pairs.end(), [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
  IncrementalPeak inc = ctx.incremental(d);
  if (swap_many(ctx, d, best, back, saving, out, added, inc)) return true;
  for (const auto& [gain, b, o] : pairs) {
    for (size_t i : back[b]) inc.set(i, Decision::Keep);
    for (size_t i : out[o]) inc.set(i, Decision::Recompute);
    if (inc.peak() <= ctx.budget()) {
      std::vector<Decision> tried = d;
      for (size_t i : back[b]) tried[i] = Decision::Keep;
      for (size_t i : out[o]) tried[i] = Decision::Recompute;
      if (take_if_better(ctx, d, best, tried, inc)) return true;
    }
    for (size_t i : out[o]) inc.set(i, Decision::Keep);
    for (size_t i : back[b]) inc.set(i, Decision::Recompute);
  }
  return false;
}

void swap_releases(const PlanContext& ctx, std::vector<Decision>& d) {
  if (d.size() > kExchangeGroups) return;
  double best = ctx.predict(d).recompute_ms;
  for (size_t round = 0; round < kSwapRounds && swap_once(ctx, d, best); ++round) {
  }
}

// Exchanges, then swaps, from several starts, the cheapest answer taken: the knapsack's plan; the
// memory-ordered descent's plan to the budget; and each memory order's descent to the floor, kept back as far
// as it fits (most expensive per byte first). The two are local searches: near the floor the time-ordered
// descent, or a memory-ordered descent stopped at the budget, can end in a plan from which no exchange or swap
// gains, while a plan released further and kept back leads elsewhere (lstm_lm, a fifth of the way above its
// floor: two early cells re-run where one late cell would do). `fell_back`: d is the memory order's already.
void improve_from_starts(const PlanContext& ctx, std::vector<Decision>& d, bool fell_back) {
  if (d.size() > kExchangeGroups) return;
  std::vector<std::vector<Decision>> starts = {d};
  auto add_start = [&](std::vector<Decision> start) {
    if (!ctx.keep_or_recompute(start)) return;
    IncrementalPeak inc = ctx.incremental(start);
    ctx.keep_back(inc, start, ctx.knapsack_order());
    if (inc.peak() > ctx.budget() || std::find(starts.begin(), starts.end(), start) != starts.end()) return;
    starts.push_back(std::move(start));
  };
  if (!fell_back)
    if (std::optional<Choice> reached = ctx.reach_budget_by_memory_order()) add_start(std::move(reached->decisions));
  for (size_t o = 0; o < PlanContext::kBaseOrders; ++o) {  // the floor's restarts are not starts (they would cost
    std::vector<Decision> floor = ctx.all_kept().decisions;   // exchanges from far off the budget's plan)
    ctx.descend(floor, 0, ctx.memory_orders()[o]);
    add_start(std::move(floor));
  }
  double best = 0;
  for (size_t k = 0; k < starts.size(); ++k) {
    exchange_releases(ctx, starts[k]);
    swap_releases(ctx, starts[k]);
    const double ms = ctx.predict(starts[k]).recompute_ms;
    if (k == 0 || ms < best - 1e-9) {
      best = ms;
      d = starts[k];
    }
  }
}

// Knapsack: greedy descent in cost-per-byte order (measured recompute time) to the budget, falling back
// to a memory-ordered descent where that one stops above it; then keep back as much as still fits (most
// expensive first), then trade offloads whose queueing stall costs more than recomputing; on a chain, if
// the greedy plan does not fit, the binomial schedule that fits with the fewest re-runs. A budget below
// the floor is refused before any of this, so that measured times never decide whether a budget is met.
Choice knapsack(PlanContext& ctx) {
  ctx.check_budget_reachable();
  Choice c = ctx.all_kept();
  std::vector<Decision>& d = c.decisions;
  std::optional<IncrementalPeak> reached_peak;  // the descent's incremental peak, reused below
  bool fell_back = false;                       // the plan is the memory-ordered descent's
  if (ctx.descend(d, ctx.budget(), ctx.knapsack_order(), &reached_peak) > ctx.budget()) {
    // The time-ordered descent got stuck above the budget; where a memory-ordered one reaches it, take
    // that, so whether a budget is met never depends on measured times.
    if (std::optional<Choice> reached = ctx.reach_budget_by_memory_order()) {
      c = std::move(*reached);
      reached_peak.reset();
      fell_back = true;
    }
  }
  const std::vector<size_t>& order = ctx.knapsack_order();
  if (ctx.keep_or_recompute(d)) {
    if (!reached_peak) reached_peak.emplace(ctx.incremental(d));
    ctx.keep_back(*reached_peak, d, order);
  } else {
    for (size_t r = order.size(); r-- > 0;) {
      const size_t i = order[r];
      if (d[i] == Decision::Keep) continue;
      const Decision released = d[i];
      d[i] = Decision::Keep;
      if (!ctx.fits(c)) d[i] = released;
    }
  }
  if (ctx.options().exchanges && ctx.keep_or_recompute(d) && !ctx.options().offload && ctx.fits(c))
    improve_from_starts(ctx, d, fell_back);
  if (ctx.options().offload) {
    for (int pass = 0; pass < kOffloadRepairPasses; ++pass) {
      bool changed = false;
      const double stall = ctx.predict(d).offload_stall_ms;
      for (size_t i = 0; i < d.size(); ++i) {
        if (d[i] != Decision::Offload) continue;
        d[i] = Decision::Recompute;
        // The stall needs the copy queues only; memory is simulated for a trade worth making.
        if (stall - ctx.offload_stall(d) > ctx.groups()[i].recompute_ms && ctx.fits(d)) {
          changed = true;
          break;
        }
        d[i] = Decision::Offload;
      }
      if (!changed) break;
    }
  }
  // Below what storing every rebuilt value can reach, a chain takes the binomial schedule (which
  // recomputes without storing); above it the greedy plan is already the fewest re-runs on a chain
  // (every value not resident when backward starts is rebuilt at least once).
  if (!ctx.fits(c)) {
    if (const ChainCandidate* best = best_chain_fit(ctx.chain_candidates(), ctx.budget()))
      c = {best->decisions, best->store_from, best->slots};
  }
  return c;
}

// Optimal chain: the binomial schedule with the fewest re-runs that fits (chain-shaped models only), or
// the knapsack's plan where that re-runs fewer nodes. A binomial schedule counts slots, all of one size;
// a byte budget is not a whole number of them, and the schedule of m slots holds its working values where
// it must: at some budgets the schedule of m slots does not fit while a keep/recompute plan keeping m
// states does (16 layers of 256 at batch 1024, 23.08 MiB: 12 slots and 4 re-run layer steps against the
// knapsack's 13 and 3). docs/METHODS.md, "Optimal chain".
Choice optimal_chain(PlanContext& ctx) {
  RATION_CHECK(ctx.why_not_chain().empty(), "strategy 'optimal-chain' needs a chain-shaped model (every node reading only "
               "the output of the node recorded just before it); this one is not: ", ctx.why_not_chain(),
               ". Use --plan knapsack.");
  const std::vector<ChainCandidate>& candidates = ctx.chain_candidates();
  const ChainCandidate* best = best_chain_fit(candidates, ctx.budget());
  // The knapsack refuses a budget below the floor (the chain candidates' included) with the floor's error;
  // the schedules then answer with their own error below.
  std::optional<Choice> greedy;
  if (ctx.budget() >= ctx.minimum_peak()) greedy = knapsack(ctx);
  if (greedy && ctx.fits(*greedy) &&
      (best == nullptr || ctx.predict(greedy->decisions, greedy->store_from).recomputed_nodes < best->prediction.recomputed_nodes))
    return std::move(*greedy);
  int64_t lowest = ctx.unconstrained_peak();
  for (const auto& cp : candidates) lowest = std::min(lowest, cp.prediction.peak_bytes);
  RATION_CHECK(best != nullptr, "strategy 'optimal-chain' cannot meet the budget of ", format_bytes(ctx.budget()),
               ": its lowest schedule needs ", format_bytes(lowest), ". Raise the budget.");
  return {best->decisions, best->store_from, best->slots};
}

// Ordered: recompute groups in forward order until the prediction fits.
Choice ordered(PlanContext& ctx) {
  Choice c = ctx.all_kept();
  IncrementalPeak inc = ctx.incremental(c.decisions);
  for (size_t i = 0; i < c.decisions.size() && inc.peak() > ctx.budget(); ++i) {
    inc.set(i, Decision::Recompute);
    c.decisions[i] = Decision::Recompute;
  }
  return c;
}

// Ordered count, the whole-model count-based split: the groups are counted as equal-sized units of the
// largest group's bytes, so that any G of them fit in G units; G = activation capacity (budget − fixed
// occupancy) / unit, at most every group. The first n − G groups in forward order are recomputed; where the
// simulated peak still exceeds the budget (a peak is not a sum of bytes: re-runs hold what they rebuild),
// deletion goes on in the same order until it fits.
Choice ordered_count(PlanContext& ctx) {
  Choice c = ctx.all_kept();
  const size_t n = c.decisions.size();
  int64_t unit = 0;
  for (const Group& g : ctx.groups()) unit = std::max(unit, g.bytes);
  const int64_t capacity = ctx.budget() - ctx.fixed_bytes();
  const size_t kept = unit <= 0 ? n : static_cast<size_t>(std::clamp<int64_t>(capacity / unit, 0, static_cast<int64_t>(n)));
  for (size_t i = 0; i < n - kept; ++i) c.decisions[i] = Decision::Recompute;
  IncrementalPeak inc = ctx.incremental(c.decisions);
  for (size_t i = n - kept; i < n && inc.peak() > ctx.budget(); ++i) {
    inc.set(i, Decision::Recompute);
    c.decisions[i] = Decision::Recompute;
  }
  return c;
}

// The kept groups per set at each target (the largest-remainder rule of ordered-sets): set k keeps
// floor(target · s_k / n) of its s_k groups, and the target's remaining groups go one each to the sets
// with the largest remainders, ties to the earlier set. Sets of equal size have equal shares and equal
// remainders, so the rule is evaluated per size class (O(classes) per target, not O(sets · log sets)),
// and a target lists only the sets whose share changed from the previous target's.
class SetShares {
 public:
  SetShares(const std::vector<std::vector<size_t>>& sets, size_t n) : n_(std::max<size_t>(n, 1)) {
    std::map<size_t, size_t> class_of_size;
    for (size_t k = 0; k < sets.size(); ++k) {
      const auto [it, added] = class_of_size.emplace(sets[k].size(), classes_.size());
      if (added) classes_.push_back(Class{sets[k].size(), {}, static_cast<int64_t>(sets[k].size()), 0, 0, 0, 0});
      classes_[it->second].members.push_back(k);  // k ascends
    }
  }
  // The shares at `target` (targets descend from n by one): `changed` gets (set, new share), ascending
  // by set, for every set whose share differs from the previous target's.
  void at(int64_t target, std::vector<std::pair<size_t, int64_t>>& changed) {
    changed.clear();
    int64_t rest = target;
    for (Class& c : classes_) {
      const double exact = static_cast<double>(target) * static_cast<double>(c.size) / static_cast<double>(n_);
      c.new_floor = static_cast<int64_t>(std::floor(exact));
      c.rem = exact - std::floor(exact);
      c.new_extra = 0;
      rest -= c.new_floor * static_cast<int64_t>(c.members.size());
    }
    order_.resize(classes_.size());
    for (size_t c = 0; c < order_.size(); ++c) order_[c] = c;
    std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      return classes_[a].rem > classes_[b].rem || (classes_[a].rem == classes_[b].rem && a < b);
    });
    for (size_t i = 0; i < order_.size() && rest > 0;) {
      size_t j = i, members = 0;  // classes order_[i, j) tie on the remainder
      for (; j < order_.size() && classes_[order_[j]].rem == classes_[order_[i]].rem; ++j)
        members += classes_[order_[j]].members.size();
      if (rest >= static_cast<int64_t>(members)) {
        for (size_t t = i; t < j; ++t) classes_[order_[t]].new_extra = static_cast<int64_t>(classes_[order_[t]].members.size());
        rest -= static_cast<int64_t>(members);
      } else {
        // The `rest` earliest sets of the tied classes: those below the smallest bound that has `rest`
        // of them below it.
        auto below = [&](size_t bound, size_t c) {
          const auto& m = classes_[c].members;
          return static_cast<int64_t>(std::lower_bound(m.begin(), m.end(), bound) - m.begin());
        };
        size_t lo = 0, hi = 0;
        for (size_t t = i; t < j; ++t) hi = std::max(hi, classes_[order_[t]].members.back() + 1);
        while (lo < hi) {
          const size_t mid = lo + (hi - lo) / 2;
          int64_t count = 0;
          for (size_t t = i; t < j; ++t) count += below(mid, order_[t]);
          if (count >= rest) hi = mid;
          else lo = mid + 1;
        }
        for (size_t t = i; t < j; ++t) classes_[order_[t]].new_extra = below(lo, order_[t]);
        rest = 0;
      }
      i = j;
    }
    for (Class& c : classes_) {
      // A member's share is floor + (its position < extra): with the floor unchanged only the members
      // between the two boundaries change.
      const int64_t from = c.new_floor == c.floor ? std::min(c.extra, c.new_extra) : 0;
      const int64_t to = c.new_floor == c.floor ? std::max(c.extra, c.new_extra) : static_cast<int64_t>(c.members.size());
      for (int64_t m = from; m < to; ++m) {
        const int64_t was = c.floor + (m < c.extra ? 1 : 0), share = c.new_floor + (m < c.new_extra ? 1 : 0);
        if (share != was) changed.emplace_back(c.members[static_cast<size_t>(m)], share);
      }
      c.floor = c.new_floor;
      c.extra = c.new_extra;
    }
    std::sort(changed.begin(), changed.end());
  }

 private:
  struct Class {
    size_t size;                  // groups per set
    std::vector<size_t> members;  // its sets, ascending
    int64_t floor, extra;         // the previous target's shares: floor + (position < extra)
    int64_t new_floor, new_extra;
    double rem;
  };
  size_t n_;
  std::vector<Class> classes_;
  std::vector<size_t> order_;
};

// Ordered sets: the largest number of kept groups G that fits, split across node sets in proportion to
// their sizes (largest remainders); within each set, groups are recomputed in forward order until its
// share is met. Going from G to G − 1 moves a few sets' shares by one, so only the groups whose
// decision changes are re-priced (incremental peak) instead of simulating the whole step per G.
Choice ordered_sets(PlanContext& ctx) {
  Choice c = ctx.all_kept();
  const size_t n = ctx.size();
  std::unordered_map<std::string, size_t> set_index;
  std::vector<std::vector<size_t>> sets;  // in order of first appearance
  for (size_t i = 0; i < n; ++i) {
    const auto [it, added] = set_index.emplace(ctx.groups()[i].node_set, sets.size());
    if (added) sets.emplace_back();
    sets[it->second].push_back(i);
  }
  IncrementalPeak inc = ctx.incremental(c.decisions);
  SetShares shares(sets, n);
  std::vector<std::pair<size_t, int64_t>> changed;
  for (int64_t target = static_cast<int64_t>(n); target >= 0; --target) {
    shares.at(target, changed);
    for (const auto& [k, keep] : changed) {
      const auto& idx = sets[k];
      const int64_t to_recompute = static_cast<int64_t>(idx.size()) - keep;
      for (size_t m = 0; m < idx.size(); ++m) {
        const Decision want = static_cast<int64_t>(m) >= to_recompute ? Decision::Keep : Decision::Recompute;
        if (c.decisions[idx[m]] == want) continue;
        c.decisions[idx[m]] = want;
        inc.set(idx[m], want);
      }
    }
    if (inc.peak() <= ctx.budget()) break;
  }
  return c;
}

// Checkpointing as PyTorch users do it: the blocks are the numbered node sets ("blocks.3"), or, in a
// model without any, every top-level module.
// (In order of first appearance; a set of the names seen keeps this linear in the number of groups.)
std::vector<std::string> blocks_of(const std::vector<Group>& groups) {
  std::vector<std::string> blocks;
  std::unordered_set<std::string> seen;
  for (const auto& g : groups) {
    const auto dot = g.node_set.find('.');
    if (dot != std::string::npos && seen.insert(g.node_set).second) blocks.push_back(g.node_set);
  }
  if (blocks.empty()) {
    for (const auto& g : groups)
      if (g.node_set != "(top)" && seen.insert(g.node_set).second) blocks.push_back(g.node_set);
  }
  return blocks;
}

// Inside blocks keep only the block's outputs (groups read by a node outside the block) of every k-th
// block; everything else in blocks is recomputed; groups outside blocks are kept.
Choice keep_outputs_of_every_kth_block(PlanContext& ctx, const std::vector<std::string>& blocks, int64_t k) {
  Choice c = ctx.all_kept();
  const std::vector<Group>& groups = ctx.groups();
  const PlanGraph& g = ctx.graph();
  std::vector<char> used_outside(groups.size(), 0);
  for (size_t o = 0; o < g.nodes; ++o) {
    std::optional<std::string> set;  // the node's set, named once it reads a group
    for (const auto& in : g.inputs[o]) {
      const int group = ctx.group_of_storage(g.storage_of(in));
      if (group < 0) continue;
      const auto gi = static_cast<size_t>(group);
      if (!set) set = node_set_of(g.profile.nodes[o].scope);
      if (groups[gi].node_set != *set) used_outside[gi] = 1;
    }
  }
  std::unordered_map<std::string, int64_t> block_index;  // block name -> its index in `blocks`
  for (size_t b = 0; b < blocks.size(); ++b) block_index.emplace(blocks[b], static_cast<int64_t>(b));
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto it = block_index.find(groups[i].node_set);
    if (it == block_index.end()) continue;
    const int64_t index = it->second;
    c.decisions[i] = used_outside[i] && ((index + 1) % k == 0) ? Decision::Keep : Decision::Recompute;
  }
  return c;
}

// Uniform: every k-th block (memory.checkpoint_every).
Choice uniform(PlanContext& ctx) {
  return keep_outputs_of_every_kth_block(ctx, blocks_of(ctx.groups()), std::max<int64_t>(1, ctx.options().checkpoint_every));
}

// Sqrt: every ceil(sqrt(blocks))-th block (Chen et al.'s sqrt(n) checkpointing).
Choice sqrt_blocks(PlanContext& ctx) {
  const std::vector<std::string> blocks = blocks_of(ctx.groups());
  const auto k = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(blocks.size()))));
  return keep_outputs_of_every_kth_block(ctx, blocks, std::max<int64_t>(1, k));
}

struct StrategyEntry {
  Strategy id;
  const char* name;
  Choice (*run)(PlanContext&);
};

// The one table of strategies; the first is the default.
const StrategyEntry kStrategies[] = {
    {Strategy::Knapsack, "knapsack", knapsack},
    {Strategy::Ordered, "ordered", ordered},
    {Strategy::OrderedCount, "ordered-count", ordered_count},
    {Strategy::OrderedSets, "ordered-sets", ordered_sets},
    {Strategy::Uniform, "uniform", uniform},
    {Strategy::Sqrt, "sqrt", sqrt_blocks},
    {Strategy::OptimalChain, "optimal-chain", optimal_chain},
};

const StrategyEntry& entry(Strategy s) {
  for (const auto& e : kStrategies)
    if (e.id == s) return e;
  RATION_ASSERT(false, "strategy missing from the strategy table");
}

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& e : kStrategies) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

std::string strategy_name_list() {
  const auto& names = strategy_names();
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

Strategy parse_strategy(const std::string& name) {
  for (const auto& e : kStrategies)
    if (name == e.name) return e.id;
  RATION_CHECK(false, "unknown plan strategy '", name, "' (expected ", strategy_name_list(), ")");
}

const char* to_string(Strategy s) { return entry(s).name; }

Choice run_strategy(PlanContext& ctx) { return entry(ctx.options().strategy).run(ctx); }

}  // namespace ration::memory
