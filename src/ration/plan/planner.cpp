#include "ration/plan/planner.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <type_traits>

#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/plan/context.h"
#include "ration/plan/simulator.h"
#include "ration/plan/strategies.h"

namespace ration::memory {
namespace {

bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct Counts {
  int64_t kept_groups = 0, kept_bytes = 0;
};

Counts kept_of(const std::vector<Group>& groups, const std::vector<Decision>& d) {
  Counts c;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (d[i] != Decision::Keep) continue;
    ++c.kept_groups;
    c.kept_bytes += groups[i].bytes;
  }
  return c;
}

void fill_counts(Plan& plan) {
  plan.kept_groups = plan.kept_bytes = plan.dropped_groups = plan.dropped_bytes = 0;
  plan.offloaded_groups = plan.offloaded_bytes = 0;
  for (const auto& g : plan.groups) {
    if (g.kept()) {
      ++plan.kept_groups;
      plan.kept_bytes += g.bytes;
    } else {
      ++plan.dropped_groups;
      plan.dropped_bytes += g.bytes;
      if (g.decision == Decision::Offload) {
        ++plan.offloaded_groups;
        plan.offloaded_bytes += g.bytes;
      }
    }
  }
}

// Releases groups of `c` in `order` (as `release` says) until the kept counts are within `limit`; a
// release that would push the prediction over the budget (rebuilt runs held together) is skipped.
// Returns whether the counts got within the limit.
template <typename Within, typename Release>
bool lower_kept(const PlanContext& ctx, Choice& c, const std::vector<size_t>& order, Within within, Release release) {
  Counts now = kept_of(ctx.groups(), c.decisions);
  for (size_t i : order) {
    if (within(now)) break;
    if (c.decisions[i] != Decision::Keep) continue;
    c.decisions[i] = release(i, c.decisions);
    if (ctx.fits(c)) {
      now.kept_groups -= 1;
      now.kept_bytes -= ctx.groups()[i].bytes;
    } else {
      c.decisions[i] = Decision::Keep;
    }
  }
  return within(now);
}

// User feedback: the user may lower what is kept (--keep-groups, --keep-bytes), never raise it above the
// initial figure (`reference`'s counts: the stable plan for the knapsack, the strategy's own plan for the
// others, none of which read measured time). Whether the limits can be met within the budget is decided
// from the reference, released by recompute in a memory order; the strategy's choice, released cheapest
// measured cost first, is kept where it gets within them too. So the outcome of a request never depends
// on timing; only which groups go may.
void apply_overrides(PlanContext& ctx, Choice& c, const Choice& reference, const Counts& initial) {
  const PlanOptions& o = ctx.options();
  const int64_t budget = ctx.budget();
  if (o.keep_groups) {
    RATION_CHECK(*o.keep_groups >= 0 && *o.keep_groups <= static_cast<int64_t>(ctx.size()), "--keep-groups ",
                 *o.keep_groups, " is out of range: this model and batch save ", ctx.size(),
                 " groups (expected 0 to ", ctx.size(), ")");
    RATION_CHECK(*o.keep_groups <= initial.kept_groups, "--keep-groups ", *o.keep_groups,
                 " asks to keep more than the plan's initial figure of ", initial.kept_groups,
                 " groups; keeping more would not fit the budget of ", format_bytes(budget),
                 " (predicted peak with the initial figure kept: ",
                 format_bytes(ctx.predict(reference.decisions, reference.store_from).peak_bytes), ")");
  }
  if (o.keep_bytes) {
    RATION_CHECK(*o.keep_bytes >= 0, "--keep-bytes must not be negative (got ", *o.keep_bytes, ")");
    RATION_CHECK(*o.keep_bytes <= initial.kept_bytes, "--keep-bytes ", format_bytes(*o.keep_bytes),
                 " asks to keep more than the plan's initial figure of ", format_bytes(initial.kept_bytes),
                 "; keeping more would not fit the budget of ", format_bytes(budget));
  }
  if (!o.keep_groups && !o.keep_bytes) return;
  auto within = [&](const Counts& k) {
    return (!o.keep_groups || k.kept_groups <= *o.keep_groups) && (!o.keep_bytes || k.kept_bytes <= *o.keep_bytes);
  };
  auto by_recompute = [](size_t, const std::vector<Decision>&) { return Decision::Recompute; };
  std::optional<Choice> stable;
  Counts lowest = initial;
  for (const std::vector<size_t>& order : ctx.memory_orders()) {
    Choice r = reference;
    if (lower_kept(ctx, r, order, within, by_recompute)) {
      stable = std::move(r);
      break;
    }
    const Counts k = kept_of(ctx.groups(), r.decisions);
    if (k.kept_groups < lowest.kept_groups) lowest = k;
  }
  RATION_CHECK(stable.has_value(), "cannot lower what is kept to the requested ",
               o.keep_groups ? std::to_string(*o.keep_groups) + " groups" : format_bytes(*o.keep_bytes),
               " within the budget of ", format_bytes(budget), ": the lowest that fits keeps ", lowest.kept_groups,
               " groups (", format_bytes(lowest.kept_bytes), "); dropping more rebuilds runs of values together and "
               "raises the peak. Raise --memory-budget to keep less.");
  Choice timed = c;
  auto release = [&](size_t i, const std::vector<Decision>& d) { return ctx.release_decision(i, d); };
  c = lower_kept(ctx, timed, ctx.knapsack_order(), within, release) && ctx.fits(timed) ? std::move(timed) : std::move(*stable);
}

}  // namespace

const char* to_string(Decision d) {
  switch (d) {
    case Decision::Keep: return "keep";
    case Decision::Recompute: return "recompute";
    case Decision::Offload: return "offload";
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

std::set<ValueKey> Plan::dropped_keys(const StepProfile& profile) const {
  std::set<int64_t> dropped;
  for (const auto& g : groups)
    if (g.decision == Decision::Recompute) dropped.insert(g.storage);
  std::set<ValueKey> keys;
  for (const auto& n : profile.nodes)
    for (const auto& k : n.saved)
      if (!k.is_leaf() && dropped.count(profile.storage_of(k))) keys.insert(k);
  return keys;
}

std::map<ValueKey, Plan::OffloadOrder> Plan::offloaded_keys(const StepProfile& profile) const {
  std::map<int64_t, OffloadOrder> by_storage;
  for (const auto& g : groups)
    if (g.decision == Decision::Offload) by_storage[g.storage] = {g.deadline, g.prefetch};
  std::map<ValueKey, OffloadOrder> keys;
  for (const auto& n : profile.nodes)
    for (const auto& k : n.saved)
      if (auto it = by_storage.find(profile.storage_of(k)); !k.is_leaf() && it != by_storage.end()) keys[k] = it->second;
  return keys;
}

namespace {
Plan plan_once(const StepProfile& profile, const PlanOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  PlanContext ctx(profile, options);
  Plan plan;
  plan.strategy = options.strategy;
  plan.budget_bytes = options.budget_bytes;
  plan.offload_costs = options.offload;
  plan.groups = ctx.groups();
  plan.unconstrained_peak_bytes = ctx.unconstrained_peak();
  plan.fixed_bytes = ctx.fixed_bytes();
  plan.capacity_bytes = options.budget_bytes - plan.fixed_bytes;
  const int64_t budget = options.budget_bytes;

  // A budget below the floor gets the "feasible minimum" error whatever the strategy; the floor is
  // computed up front when reported, else only when the strategy's plan does not fit.
  if (options.report_minimum) ctx.check_budget_reachable();
  Choice choice;
  try {
    choice = run_strategy(ctx);
  } catch (const Error&) {
    ctx.check_budget_reachable();
    throw;
  }
  if (!options.report_minimum && !ctx.fits(choice)) ctx.check_budget_reachable();
  if (options.report_minimum) plan.minimum_peak_bytes = ctx.minimum_peak();

  // The initial figure never reads measured time: the knapsack's is its stable plan's (where only an
  // offload plan fits, its own); the other strategies do not read times.
  const std::optional<Choice>& stable = options.strategy == Strategy::Knapsack ? ctx.stable_plan() : std::nullopt;
  const Choice reference = stable ? *stable : choice;
  const Counts initial = kept_of(plan.groups, reference.decisions);
  plan.initial_kept_groups = initial.kept_groups;
  plan.initial_kept_bytes = initial.kept_bytes;
  apply_overrides(ctx, choice, reference, initial);

  for (size_t i = 0; i < plan.groups.size(); ++i) plan.groups[i].decision = choice.decisions[i];
  plan.store_from = std::move(choice.store_from);
  plan.chain_slots = choice.chain_slots;
  fill_counts(plan);
  plan.prediction = ctx.predict(choice.decisions, plan.store_from);
  if (options.offload) {
    std::vector<Decision> by_storage(profile.storages.size(), Decision::Keep);
    for (const auto& g : plan.groups) by_storage[static_cast<size_t>(g.storage)] = g.decision;
    OffloadSchedule sch = schedule_offloads(ctx.graph(), by_storage, *options.offload);
    if (plan.offloaded_groups > 0) {  // later deadlines where they raise no node above the predicted peak
      relax_deadlines(ctx.graph(), by_storage, plan.prediction.forward_peaks, plan.prediction.peak_bytes, sch);
      const int64_t peak = plan.prediction.peak_bytes;
      plan.prediction = simulate(ctx.graph(), by_storage, options.extra_fixed_bytes, plan.store_from, &sch);
      RATION_ASSERT(plan.prediction.peak_bytes <= peak, "relaxed copy deadlines raised the predicted peak from ", peak,
                    " to ", plan.prediction.peak_bytes);
    }
    for (auto& g : plan.groups) {
      const bool offloaded = g.decision == Decision::Offload;
      g.deadline = offloaded ? sch.deadline[static_cast<size_t>(g.storage)] : -1;
      g.prefetch = offloaded ? sch.prefetch[static_cast<size_t>(g.storage)] : 0;
    }
  }
  plan.fits = plan.prediction.peak_bytes <= budget;
  if (!plan.fits && !options.report_minimum) ctx.check_budget_reachable();
  if (!plan.fits) plan.minimum_peak_bytes = ctx.minimum_peak();
  RATION_CHECK(plan.fits, "strategy '", to_string(options.strategy), "' cannot meet the budget of ", format_bytes(budget),
               ": its plan's predicted peak is ", format_bytes(plan.prediction.peak_bytes), " at ",
               plan.prediction.peak_at, " (feasible minimum ", format_bytes(plan.minimum_peak_bytes),
               "). Use --plan knapsack or raise the budget.");
  plan.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  return plan;
}

}  // namespace

// With an offload tier, the joint plan is tried first; where it cannot meet the budget the plan is made
// without offload. A tier with little room can raise the joint plan's floor above keep/recompute's (its
// room goes to groups recompute would have served better), and a budget that keep/recompute meets must
// not fail because a tier was offered. When both fail, the error with the lower feasible minimum stands.
Plan make_plan(const StepProfile& profile, const PlanOptions& options) {
  if (!options.offload) return plan_once(profile, options);
  PlanOptions without = options;
  without.offload.reset();
  Plan plan;
  try {
    plan = plan_once(profile, options);
  } catch (const Error&) {
    plan = plan_once(profile, without);  // its error (the keep/recompute floor) is the one reported
    plan.offload_costs = options.offload;  // reported: the tier was measured, and offloads nothing
    return plan;
  }
  // The lowest budget this call meets is the lower of the two floors: report that one.
  if (options.report_minimum) plan.minimum_peak_bytes = std::min(plan.minimum_peak_bytes, PlanContext(profile, without).minimum_peak());
  return plan;
}

namespace {
template <class T>
std::string differs(const char* what, const T& a, const T& b) {
  if (a == b) return "";
  if constexpr (std::is_arithmetic_v<T>) return std::string(what) + ": " + std::to_string(a) + " / " + std::to_string(b);
  else return what;
}

std::string prediction_difference(const Prediction& a, const Prediction& b) {
  for (const std::string& d : {differs("predicted peak", a.peak_bytes, b.peak_bytes), differs("peak at", a.peak_at, b.peak_at),
                               differs("recompute ms", a.recompute_ms, b.recompute_ms),
                               differs("recomputed nodes", a.recomputed_nodes, b.recomputed_nodes),
                               differs("offload stall ms", a.offload_stall_ms, b.offload_stall_ms),
                               differs("offloaded bytes", a.offloaded_bytes, b.offloaded_bytes),
                               differs("forward peaks", a.forward_peaks, b.forward_peaks),
                               differs("backward peaks", a.backward_peaks, b.backward_peaks),
                               differs("copy-in pool", a.copy_in_pool, b.copy_in_pool),
                               differs("copy-in pool bytes", a.copy_in_pool_bytes, b.copy_in_pool_bytes)})
    if (!d.empty()) return d;
  return "";
}
}  // namespace

std::string plan_difference(const Plan& a, const Plan& b) {
  if (a.groups.size() != b.groups.size()) return differs("groups", a.groups.size(), b.groups.size());
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const Group& x = a.groups[i];
    const Group& y = b.groups[i];
    const std::string at = "group " + std::to_string(i) + " ";
    if (x.decision != y.decision) return at + "decision: " + to_string(x.decision) + " / " + to_string(y.decision);
    for (const std::string& d : {differs("storage", x.storage, y.storage), differs("bytes", x.bytes, y.bytes),
                                 differs("producer", x.producer, y.producer), differs("recompute ms", x.recompute_ms, y.recompute_ms),
                                 differs("deadline", x.deadline, y.deadline), differs("prefetch", x.prefetch, y.prefetch)})
      if (!d.empty()) return at + d;
  }
  for (const std::string& d :
       {differs("budget", a.budget_bytes, b.budget_bytes), differs("fixed bytes", a.fixed_bytes, b.fixed_bytes),
        differs("unconstrained peak", a.unconstrained_peak_bytes, b.unconstrained_peak_bytes),
        differs("feasible minimum", a.minimum_peak_bytes, b.minimum_peak_bytes),
        differs("initial kept groups", a.initial_kept_groups, b.initial_kept_groups),
        differs("initial kept bytes", a.initial_kept_bytes, b.initial_kept_bytes),
        differs("kept groups", a.kept_groups, b.kept_groups), differs("offloaded groups", a.offloaded_groups, b.offloaded_groups),
        differs("store_from", a.store_from, b.store_from), differs("chain slots", a.chain_slots, b.chain_slots),
        differs("fits", a.fits, b.fits), differs("strategy", static_cast<int>(a.strategy), static_cast<int>(b.strategy)),
        prediction_difference(a.prediction, b.prediction)})
    if (!d.empty()) return d;
  return "";
}

void lower_fixed_bytes(Plan& plan, int64_t bytes) {
  RATION_CHECK(bytes >= 0 && bytes <= plan.fixed_bytes, "lower_fixed_bytes: ", bytes, " B is not within the plan's fixed ",
               plan.fixed_bytes, " B");
  plan.fixed_bytes -= bytes;
  plan.capacity_bytes += bytes;
  plan.unconstrained_peak_bytes -= bytes;
  if (plan.minimum_peak_bytes > 0) plan.minimum_peak_bytes -= bytes;
  plan.prediction.peak_bytes -= bytes;
  for (int64_t& b : plan.prediction.forward_peaks) b -= bytes;
  for (int64_t& b : plan.prediction.backward_peaks) b -= bytes;
}

}  // namespace ration::memory
