// plan/milp.cpp — the keep/recompute choice as a mixed-integer program, solved by CBC (docs/METHODS.md,
// "The exact yardstick").
//
// The program follows the simulator's rules (plan/simulator.cpp) step by step:
//   d[i]       group i is recomputed (1) or kept (0);
//   r[j][o]    node o is re-run during backward step j (created only where some chain of values that may
//              be unusable at j leads from what step j reads to o);
//   c[j][o]    o was re-run in a step before j, so its dropped outputs still awaited are restored (an OR
//              chain over o's re-runs);
//   a value v read at step j, or read by a re-run at j, is unusable where it is a leaf of nothing (read by
//   no backward), released (its last read was before j), or of a recomputed group and not restored:
//   d[group] and not c[j][producer]. r[j][o] is exactly the OR of "o's output is needed and unusable":
//   it is not free to re-run more (the executor does not), nor less.
// Memory, at every node boundary, is what the simulator counts:
//   forward node m: its measured peak, less the bytes of recomputed groups released before m;
//   backward step j, as it starts and after its re-runs: the measured figure less the recomputed groups the
//   measured run still held, plus the restored ones still awaited (h[j][s] = d and any c), plus what each
//   re-run allocates; and while each re-run runs, its own allocation and workspace on top of the start
//   (a lower bound where re-runs of one step overlap: the simulator checks every answer, and an answer it
//   refuses is cut off and the program solved again).
// The objective is the re-run producers' measured forward milliseconds, as Prediction::recompute_ms.
// Owns: the program and its solve. Does not own: the rules (plan/simulator.h), the groups (plan/context.h).
#include "ration/plan/milp.h"

#include <Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "ration/base/check.h"
#include "ration/plan/context.h"
#include "ration/plan/graph.h"

namespace ration::memory {
namespace {

// Bytes per unit of the program's memory rows: KiB keeps their coefficients between 1 and about 1e7.
constexpr double kUnit = 1024.0;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A 0/1 quantity of the program: a constant or a column.
struct Lit {
  int col = -1;
  bool value = false;  // where col < 0
  bool constant() const { return col < 0; }
  bool is(bool v) const { return constant() && value == v; }
  static Lit of(bool v) { return {-1, v}; }
  static Lit column(int c) { return {c, false}; }
};

// The program as columns and rows, with how each derived column follows from others (evaluate(): the
// columns' values for given group decisions, for a MIP start and for the program's own peak).
class Program {
 public:
  struct Term {
    int col;
    double coef;
  };
  struct Row {
    std::vector<Term> terms;
    double lo, hi;
  };
  // A memory row: bytes at one node boundary = constant + sum(coef * column), at most the budget.
  struct Memory {
    double constant;
    std::vector<Term> terms;
  };

  int column(double cost, bool integer, double lo = 0, double up = 1) {
    cost_.push_back(cost);
    lower_.push_back(lo == -kInf ? -std::numeric_limits<double>::max() : lo);
    upper_.push_back(up == kInf ? std::numeric_limits<double>::max() : up);
    integer_.push_back(integer ? 1 : 0);
    def_.push_back({});
    return static_cast<int>(cost_.size()) - 1;
  }
  void row(std::vector<Term> terms, double lo, double hi) { rows_.push_back({std::move(terms), lo, hi}); }
  void memory(double constant, std::vector<Term> terms) { memory_.push_back({constant, std::move(terms)}); }

  // a AND b
  Lit both(Lit a, Lit b) {
    if (a.constant()) return a.value ? b : Lit::of(false);
    if (b.constant()) return b.value ? a : Lit::of(false);
    const int z = column(0, true);
    row({{z, 1}, {a.col, -1}}, -kInf, 0);
    row({{z, 1}, {b.col, -1}}, -kInf, 0);
    row({{z, 1}, {a.col, -1}, {b.col, -1}}, -1, kInf);
    define(z, Def::Both, {a, b});
    return Lit::column(z);
  }
  // a AND NOT b
  Lit but_not(Lit a, Lit b) {
    if (b.constant()) return b.value ? Lit::of(false) : a;
    if (a.is(false)) return a;
    const int z = column(0, true);
    if (a.constant()) {
      row({{z, 1}, {b.col, 1}}, 1, 1);
    } else {
      row({{z, 1}, {a.col, -1}}, -kInf, 0);
      row({{z, 1}, {b.col, 1}}, -kInf, 1);
      row({{z, 1}, {a.col, -1}, {b.col, 1}}, 0, kInf);
    }
    define(z, Def::ButNot, {a, b});
    return Lit::column(z);
  }
  // a OR b
  Lit either(Lit a, Lit b) {
    if (a.constant()) return a.value ? a : b;
    if (b.constant()) return b.value ? b : a;
    const int z = column(0, true);
    row({{z, 1}, {a.col, -1}}, 0, kInf);
    row({{z, 1}, {b.col, -1}}, 0, kInf);
    row({{z, 1}, {a.col, -1}, {b.col, -1}}, -kInf, 0);
    define(z, Def::Any, {a, b});
    return Lit::column(z);
  }
  // Column r is the OR of `terms`.
  void any_of(int r, const std::vector<Lit>& terms) {
    std::vector<Term> sum{{r, 1}};
    bool one = false;
    for (const Lit& t : terms) {
      if (t.constant()) {
        one = one || t.value;
        continue;
      }
      row({{r, 1}, {t.col, -1}}, 0, kInf);
      sum.push_back({t.col, -1});
    }
    if (one) row({{r, 1}}, 1, kInf);
    else row(std::move(sum), -kInf, 0);
    define(r, Def::Any, terms);
  }
  // Continuous h = d AND (any of cs): bounded both ways, so it is determined by the others.
  Lit restored_held(Lit d, const std::vector<Lit>& cs) {
    const int h = column(0, false);
    std::vector<Term> sum{{h, 1}};
    row({{h, 1}, {d.col, -1}}, -kInf, 0);
    for (const Lit& c : cs) {
      row({{h, 1}, {c.col, -1}, {d.col, -1}}, -1, kInf);
      sum.push_back({c.col, -1});
    }
    row(std::move(sum), -kInf, 0);
    std::vector<Lit> args{d};
    args.insert(args.end(), cs.begin(), cs.end());
    define(h, Def::HeldIf, std::move(args));
    return Lit::column(h);
  }
  // A group's decision: an input of evaluate().
  void decision(int col, size_t group) { def_[static_cast<size_t>(col)] = {Def::Group, {}, group, {}}; }
  // Continuous column `col` = sum(coef * column) over `terms` (none of them `col`).
  void define_sum(int col, std::vector<Term> terms) { def_[static_cast<size_t>(col)] = {Def::Sum, {}, 0, std::move(terms)}; }

  // Every column's value for the given decisions (by group).
  std::vector<double> evaluate(const std::vector<Decision>& decisions) const;
  // A memory row's bytes at column values x.
  static double bytes(const Memory& m, const std::vector<double>& x) {
    double b = m.constant;
    for (const Term& t : m.terms) b += t.coef * x[static_cast<size_t>(t.col)];
    return b;
  }
  int64_t peak(const std::vector<double>& x) const {
    double p = 0;
    for (const Memory& m : memory_) p = std::max(p, bytes(m, x));
    return static_cast<int64_t>(std::llround(p));
  }
  size_t columns() const { return cost_.size(); }
  size_t rows() const { return rows_.size() + memory_.size(); }
  double cost(size_t c) const { return cost_[c]; }
  // The no-good cut: at least one group decides differently from `decisions`.
  void cut_off(const std::vector<int>& d_cols, const std::vector<Decision>& decisions) {
    std::vector<Term> t;
    double ones = 0;
    for (size_t i = 0; i < d_cols.size(); ++i) {
      const bool dropped = decisions[i] != Decision::Keep;
      t.push_back({d_cols[i], dropped ? -1.0 : 1.0});
      ones += dropped ? 1 : 0;
    }
    row(std::move(t), 1 - ones, kInf);
  }

  struct Solved {
    bool found = false, optimal = false;
    std::vector<double> x;
    double objective = 0, bound = 0;
  };
  Solved solve(int64_t budget, double time_limit_s, const std::vector<double>& start) const;

 private:
  struct Def {
    enum Kind : uint8_t { Free, Group, Both, ButNot, Any, HeldIf, Sum };
    Kind kind = Free;
    std::vector<Lit> args;
    size_t group = 0;
    std::vector<Term> sum;
  };
  void define(int col, Def::Kind kind, std::vector<Lit> args) { def_[static_cast<size_t>(col)] = {kind, std::move(args), 0, {}}; }

  std::vector<double> cost_, lower_, upper_;
  std::vector<char> integer_;
  std::vector<Def> def_;
  std::vector<Row> rows_;
  std::vector<Memory> memory_;
};

std::vector<double> Program::evaluate(const std::vector<Decision>& decisions) const {
  std::vector<double> x(cost_.size(), 0);
  std::vector<char> done(cost_.size(), 0);
  // Depth-first over the definitions (a column's arguments may be made after it: a re-run's column is
  // made when it is first needed, the terms that need it as its consumers are reached).
  std::function<double(const Lit&)> value = [&](const Lit& l) -> double {
    if (l.constant()) return l.value ? 1 : 0;
    const auto c = static_cast<size_t>(l.col);
    if (done[c]) return x[c];
    const Def& d = def_[c];
    double v = 0;
    switch (d.kind) {
      case Def::Free: v = 0; break;
      case Def::Group: v = decisions[d.group] != Decision::Keep ? 1 : 0; break;
      case Def::Both: v = value(d.args[0]) * value(d.args[1]); break;
      case Def::ButNot: v = value(d.args[0]) * (1 - value(d.args[1])); break;
      case Def::Any:
        for (const Lit& a : d.args) v = std::max(v, value(a));
        break;
      case Def::HeldIf: {
        double any = 0;
        for (size_t k = 1; k < d.args.size(); ++k) any = std::max(any, value(d.args[k]));
        v = value(d.args[0]) * any;
        break;
      }
      case Def::Sum:
        for (const Term& t : d.sum) v += t.coef * value(Lit::column(t.col));
        break;
    }
    done[c] = 1;
    x[c] = v;
    return v;
  };
  for (size_t c = 0; c < cost_.size(); ++c) value(Lit::column(static_cast<int>(c)));
  return x;
}

Program::Solved Program::solve(int64_t budget, double time_limit_s, const std::vector<double>& start) const {
  const size_t nc = cost_.size();
  std::vector<Row> all = rows_;
  for (const Memory& m : memory_) {
    std::vector<Term> t;
    for (const Term& term : m.terms) t.push_back({term.col, term.coef / kUnit});
    all.push_back({std::move(t), -kInf, (static_cast<double>(budget) - m.constant) / kUnit});
  }
  // Column-major, as Cbc_loadProblem reads it.
  std::vector<CoinBigIndex> col_start(nc + 1, 0);
  for (const Row& r : all)
    for (const Term& t : r.terms) ++col_start[static_cast<size_t>(t.col) + 1];
  for (size_t c = 0; c < nc; ++c) col_start[c + 1] += col_start[c];
  std::vector<int> index(static_cast<size_t>(col_start[nc]));
  std::vector<double> value(index.size());
  std::vector<CoinBigIndex> at(col_start.begin(), col_start.end() - 1);
  std::vector<double> row_lo, row_hi;
  for (size_t r = 0; r < all.size(); ++r) {
    for (const Term& t : all[r].terms) {
      const auto k = static_cast<size_t>(at[static_cast<size_t>(t.col)]++);
      index[k] = static_cast<int>(r);
      value[k] = t.coef;
    }
    row_lo.push_back(all[r].lo == -kInf ? -std::numeric_limits<double>::max() : all[r].lo);
    row_hi.push_back(all[r].hi == kInf ? std::numeric_limits<double>::max() : all[r].hi);
  }
  Cbc_Model* m = Cbc_newModel();
  Cbc_loadProblem(m, static_cast<int>(nc), static_cast<int>(all.size()), col_start.data(), index.data(), value.data(),
                  lower_.data(), upper_.data(), cost_.data(), row_lo.data(), row_hi.data());
  for (size_t c = 0; c < nc; ++c)
    if (integer_[c]) Cbc_setInteger(m, static_cast<int>(c));
  Cbc_setLogLevel(m, 0);
  // CBC 2.10's preprocessing can crash undoing itself after a time limit (CglPreProcess::postProcess).
  Cbc_setParameter(m, "preprocess", "off");
  Cbc_setMaximumSeconds(m, time_limit_s);
  Cbc_setAllowableGap(m, 1e-9);
  Cbc_setAllowableFractionGap(m, 1e-9);
  if (!start.empty()) {
    std::vector<int> cols(nc);
    for (size_t c = 0; c < nc; ++c) cols[c] = static_cast<int>(c);
    Cbc_setMIPStartI(m, static_cast<int>(nc), cols.data(), start.data());
  }
  Cbc_solve(m);
  Solved s;
  const double* best = Cbc_bestSolution(m);
  s.found = best != nullptr;
  s.optimal = s.found && Cbc_isProvenOptimal(m);
  if (s.found) {
    s.x.assign(best, best + nc);
    s.objective = Cbc_getObjValue(m);
  }
  s.bound = Cbc_getBestPossibleObjValue(m);
  Cbc_deleteModel(m);
  return s;
}

// Builds the program for one profile's graph and groups, step by step as the simulator runs.
class Builder {
 public:
  Builder(const PlanContext& ctx, int64_t extra, int64_t budget)
      : ctx_(ctx), g_(ctx.graph()), groups_(ctx.groups()), extra_(extra), budget_(budget) {}
  void build();
  Program& program() { return p_; }
  const std::vector<int>& decision_columns() const { return d_; }

 private:
  bool droppable(int64_t s) const {
    return s >= 0 && g_.key_span.saved_at[static_cast<size_t>(s)] >= 0 &&
           g_.profile.storages[static_cast<size_t>(s)].allocated_by >= 0;
  }
  void prepare();
  void forward_rows();
  void step(size_t j);
  void step_memory(size_t j, const std::vector<int>& reruns, const std::vector<int>& rerun_col);
  Lit unusable(size_t j, int v, int producer);

  const PlanContext& ctx_;               // its storage-to-group map
  const PlanGraph& g_;
  const std::vector<Group>& groups_;
  int64_t extra_, budget_;
  Program p_;
  std::vector<int> d_;                   // by group: its decision's column
  std::vector<int64_t> last_read_;       // by value: its last backward step (-1: never read)
  std::vector<int64_t> storage_last_;    // by storage: the last step reading one of its values
  std::vector<std::vector<int>> keys_;   // by storage: its saved values
  std::vector<Lit> restored_;            // by node: re-run in a step before the current one
  std::vector<Lit> unusable_at_;         // by value: this step's answer (valid where stamp_at_ == j + 1)
  std::vector<size_t> stamp_at_;
};

void Builder::prepare() {
  const size_t nv = g_.values();
  for (size_t i = 0; i < groups_.size(); ++i) {
    d_.push_back(p_.column(0, true));
    p_.decision(d_.back(), i);
  }
  last_read_.assign(nv, -1);
  storage_last_.assign(g_.storages, -1);
  keys_.assign(g_.storages, {});
  for (size_t j = 0; j < g_.steps; ++j)
    for (const int v : g_.saved[static_cast<size_t>(g_.profile.backward_order[j])])
      if (v >= 0) last_read_[static_cast<size_t>(v)] = static_cast<int64_t>(j);
  for (size_t v = 0; v < nv; ++v) {
    const int64_t s = g_.key_storage[v];
    if (last_read_[v] < 0 || !droppable(s)) continue;
    storage_last_[static_cast<size_t>(s)] = std::max(storage_last_[static_cast<size_t>(s)], last_read_[v]);
    if (!g_.is_leaf(static_cast<int>(v))) keys_[static_cast<size_t>(s)].push_back(static_cast<int>(v));
  }
  restored_.assign(g_.nodes, Lit::of(false));
  unusable_at_.assign(nv, Lit::of(false));
  stamp_at_.assign(nv, 0);
}

// Forward node m: its measured peak less the recomputed groups released (after their last forward use)
// before m. Only nodes whose measured peak is over the budget need a row.
void Builder::forward_rows() {
  for (size_t m = 0; m < g_.nodes; ++m) {
    const double constant = static_cast<double>(g_.peak_bytes[m] + extra_);
    if (constant <= static_cast<double>(budget_)) continue;
    std::vector<Program::Term> t;
    for (size_t i = 0; i < groups_.size(); ++i) {
      const auto s = static_cast<size_t>(groups_[i].storage);
      if (!droppable(groups_[i].storage)) continue;
      const int64_t last = std::max(g_.last_alive[s], g_.key_span.saved_at[s]);
      if (last < static_cast<int64_t>(m)) t.push_back({d_[i], -static_cast<double>(g_.profile.storages[s].bytes)});
    }
    p_.memory(constant, std::move(t));
  }
}

// Whether value v (an output of `producer`) is unusable as step j starts: the simulator's KeyState.
Lit Builder::unusable(size_t j, int v, int producer) {
  if (v < 0) return Lit::of(true);  // no id: never a saved value
  const auto vu = static_cast<size_t>(v);
  if (stamp_at_[vu] == j + 1) return unusable_at_[vu];
  Lit answer = Lit::of(false);
  const int64_t s = g_.key_storage[vu];
  if (g_.backward_reads[vu] == 0) answer = Lit::of(true);             // never saved: Absent
  else if (s < 0) answer = Lit::of(false);                             // Kept, never released
  else if (last_read_[vu] < static_cast<int64_t>(j)) answer = Lit::of(true);  // Released
  else if (droppable(s) && ctx_.group_of_storage(s) >= 0)
    answer = p_.but_not(Lit::column(d_[static_cast<size_t>(ctx_.group_of_storage(s))]),
                        restored_[static_cast<size_t>(producer)]);
  stamp_at_[vu] = j + 1;
  unusable_at_[vu] = answer;
  return answer;
}

// Step j: the re-runs (breadth first from what the step reads, through inputs that may be unusable),
// each equal to the OR of its needs; then the step's memory rows; then the restored chains move on.
void Builder::step(size_t j) {
  const auto ord = static_cast<size_t>(g_.profile.backward_order[j]);
  std::vector<int> reruns;                          // nodes, in the order first needed
  std::vector<int> rerun_col(g_.nodes, -1);         // this step's only; reset below
  std::vector<std::vector<Lit>> needs;              // by position in `reruns`
  std::vector<int> position(g_.nodes, -1);
  auto need = [&](int node, Lit why) {
    if (why.is(false)) return;
    const auto n = static_cast<size_t>(node);
    if (rerun_col[n] < 0) {
      rerun_col[n] = p_.column(g_.forward_ms[n], true);
      position[n] = static_cast<int>(reruns.size());
      reruns.push_back(node);
      needs.emplace_back();
    }
    needs[static_cast<size_t>(position[n])].push_back(why);
  };
  for (const int v : g_.saved[ord]) {
    if (v < 0 || g_.is_leaf(v)) continue;
    need(g_.producer(v), unusable(j, v, g_.producer(v)));
  }
  for (size_t q = 0; q < reruns.size(); ++q) {
    const auto o = static_cast<size_t>(reruns[q]);
    for (const auto& in : g_.inputs[o]) {
      if (in.producer < 0) continue;
      need(in.producer, p_.both(Lit::column(rerun_col[o]), unusable(j, in.value, in.producer)));
    }
  }
  for (size_t q = 0; q < reruns.size(); ++q) p_.any_of(rerun_col[static_cast<size_t>(reruns[q])], needs[q]);
  step_memory(j, reruns, rerun_col);
  for (const int o : reruns)
    restored_[static_cast<size_t>(o)] = p_.either(restored_[static_cast<size_t>(o)], Lit::column(rerun_col[static_cast<size_t>(o)]));
}

// Step j's memory: change from the measured run's saved bytes (recomputed groups it held, less restored
// ones still awaited) as a column of its own, then the rows as the step starts, after its re-runs
// (measured peak: the node's own backward), and while each re-run runs.
void Builder::step_memory(size_t j, const std::vector<int>& reruns, const std::vector<int>& rerun_col) {
  std::vector<Program::Term> change, sum;  // the row; delta as a sum
  const int delta = p_.column(0, false, -kInf, kInf);
  change.push_back({delta, 1});
  for (size_t i = 0; i < groups_.size(); ++i) {
    const auto s = static_cast<size_t>(groups_[i].storage);
    if (storage_last_[s] < static_cast<int64_t>(j)) continue;
    const double bytes = static_cast<double>(groups_[i].bytes) / kUnit;
    change.push_back({d_[i], bytes});
    sum.push_back({d_[i], -bytes});
    std::vector<Lit> restored;
    for (const int v : keys_[s]) {
      if (last_read_[static_cast<size_t>(v)] < static_cast<int64_t>(j)) continue;
      const Lit c = restored_[static_cast<size_t>(g_.producer(v))];
      if (!c.constant() && std::none_of(restored.begin(), restored.end(), [&](const Lit& l) { return l.col == c.col; }))
        restored.push_back(c);
    }
    if (restored.empty()) continue;
    const Lit h = p_.restored_held(Lit::column(d_[i]), restored);
    change.push_back({h.col, -bytes});
    sum.push_back({h.col, bytes});
  }
  p_.row(std::move(change), 0, 0);  // delta (KiB) = restored held − recomputed the measured run held
  p_.define_sum(delta, std::move(sum));
  const double start = static_cast<double>(g_.profile.backward_start_bytes[j] + extra_);
  const double end = static_cast<double>(g_.profile.backward_peak_bytes[j] + extra_);
  p_.memory(start, {{delta, kUnit}});
  std::vector<Program::Term> after{{delta, kUnit}};
  for (const int o : reruns) {
    const auto n = static_cast<size_t>(o);
    int64_t allocated = 0;
    for (const int st : g_.allocated[n]) allocated += g_.profile.storages[static_cast<size_t>(st)].bytes;
    const int64_t workspace = std::max<int64_t>(0, g_.peak_bytes[n] - g_.end_bytes[n]);
    after.push_back({rerun_col[n], static_cast<double>(allocated)});
    p_.memory(start, {{delta, kUnit}, {rerun_col[n], static_cast<double>(allocated + workspace)}});
  }
  p_.memory(end, std::move(after));
}

void Builder::build() {
  prepare();
  forward_rows();
  for (size_t j = 0; j < g_.steps; ++j) step(j);
}

}  // namespace

ExactPlan solve_exact_plan(const StepProfile& profile, const PlanOptions& options, const ExactPlanOptions& exact) {
  PlanOptions o = options;
  o.offload.reset();
  o.report_minimum = false;
  PlanContext ctx(profile, o);
  Builder builder(ctx, o.extra_fixed_bytes, o.budget_bytes);
  builder.build();
  Program& program = builder.program();
  const std::vector<int>& d_cols = builder.decision_columns();
  ExactPlan out;
  // A start: the knapsack's plan, where it fits without transient re-runs and the program agrees.
  std::vector<double> start;
  try {
    PlanOptions k = o;
    k.strategy = Strategy::Knapsack;
    const Plan plan = make_plan(profile, k);
    std::vector<Decision> d;
    for (const Group& gr : plan.groups) d.push_back(gr.decision);
    if (plan.store_from.empty()) start = program.evaluate(d);
    if (!start.empty() && program.peak(start) > o.budget_bytes) start.clear();
  } catch (const Error&) {
  }
  for (;;) {
    out.columns = static_cast<int>(program.columns());
    out.rows = static_cast<int>(program.rows());
    const auto began = std::chrono::steady_clock::now();
    const Program::Solved s = program.solve(o.budget_bytes, exact.time_limit_s, start);
    out.solve_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    out.bound_ms = s.bound;
    if (!s.found) {
      out.status = ExactPlan::Status::NoSolution;
      return out;
    }
    std::vector<Decision> d(d_cols.size(), Decision::Keep);
    for (size_t i = 0; i < d_cols.size(); ++i)
      if (s.x[static_cast<size_t>(d_cols[i])] > 0.5) d[i] = Decision::Recompute;
    const Prediction pred = ctx.predict(d);
    if (pred.peak_bytes > o.budget_bytes && out.cuts < exact.max_cuts) {
      program.cut_off(d_cols, d);  // the re-runs' rows were too low for this answer: cut it off, solve again
      ++out.cuts;
      start.clear();
      continue;
    }
    const std::vector<double> x = program.evaluate(d);
    out.decisions = d;
    for (size_t c = 0; c < x.size(); ++c) out.recompute_ms += program.cost(c) * x[c];
    out.predicted_peak_bytes = program.peak(x);
    out.simulated_peak_bytes = pred.peak_bytes;
    out.simulated_recompute_ms = pred.recompute_ms;
    out.status = pred.peak_bytes > o.budget_bytes ? ExactPlan::Status::NoSolution
                 : s.optimal                      ? ExactPlan::Status::Optimal
                                                  : ExactPlan::Status::TimeLimit;
    return out;
  }
}

Plan plan_with_decisions(const StepProfile& profile, const PlanOptions& options, const std::vector<Decision>& decisions) {
  PlanOptions o = options;
  o.offload.reset();
  PlanContext ctx(profile, o);
  RATION_CHECK(decisions.size() == ctx.size(), "plan_with_decisions: ", decisions.size(), " decisions for ", ctx.size(), " groups");
  Plan plan;
  plan.strategy = o.strategy;
  plan.budget_bytes = o.budget_bytes;
  plan.groups = ctx.groups();
  plan.unconstrained_peak_bytes = ctx.unconstrained_peak();
  plan.fixed_bytes = ctx.fixed_bytes();
  plan.capacity_bytes = o.budget_bytes - plan.fixed_bytes;
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    Group& gr = plan.groups[i];
    gr.decision = decisions[i];
    (gr.kept() ? plan.kept_groups : plan.dropped_groups) += 1;
    (gr.kept() ? plan.kept_bytes : plan.dropped_bytes) += gr.bytes;
  }
  plan.initial_kept_groups = plan.kept_groups;
  plan.initial_kept_bytes = plan.kept_bytes;
  plan.prediction = ctx.predict(decisions);
  plan.fits = plan.prediction.peak_bytes <= o.budget_bytes;
  return plan;
}

}  // namespace ration::memory
