#include "ration/plan/chain.h"

#include <algorithm>
#include <limits>

#include "ration/base/check.h"

namespace ration::memory {
namespace {

// A chain's checkpointable states are the producers of its large saved groups: a group smaller than
// 1/kChainStateFraction of the largest is too small to be worth a slot of the binomial schedule (kept
// always); the states left are the activations between layers, which dominate a chain's memory.
constexpr int64_t kChainStateFraction = 8;

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

}  // namespace

// Checkpointable states are the producers of saved groups at least 1/kChainStateFraction of the largest
// group (a producer's groups go together); smaller groups are always kept. Every other re-run in the
// chain is transient.
std::vector<ChainCandidate> chain_candidates(const StepProfile& profile, const std::vector<Group>& groups,
                                             int64_t extra) {
  std::vector<ChainCandidate> out;
  int64_t largest = 0;
  for (const auto& g : groups) largest = std::max(largest, g.bytes);
  std::vector<int64_t> producers;  // states 1..m: producer ordinals in forward order
  std::map<int64_t, int64_t> state_of_producer;
  for (const auto& g : groups) {
    if (g.bytes * kChainStateFraction < largest || state_of_producer.count(g.producer)) continue;
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
      c.decisions.push_back(st == state_of_producer.end() || keep_state[static_cast<size_t>(st->second)] ? Decision::Keep
                                                                                                       : Decision::Recompute);
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
    std::vector<Decision> by_storage(profile.storages.size(), Decision::Keep);
    for (size_t i = 0; i < groups.size(); ++i) by_storage[static_cast<size_t>(groups[i].storage)] = c.decisions[i];
    c.prediction = simulate(profile, by_storage, extra, c.store_from);
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

std::string why_not_chain(const StepProfile& profile) {
  if (profile.nodes.empty()) return "the profile recorded no nodes";
  for (size_t k = 0; k < profile.nodes.size(); ++k) {
    for (const auto& in : profile.nodes[k].inputs) {
      if (in.is_leaf() || in.producer == static_cast<int64_t>(k) - 1) continue;
      const ProfiledNode& n = profile.nodes[k];
      const ProfiledNode& from = profile.nodes[static_cast<size_t>(in.producer)];
      return detail::str("node ", k, " (", n.op, n.scope.empty() ? "" : " in " + n.scope, ") reads the output of node ",
                         in.producer, " (", from.op, from.scope.empty() ? "" : " in " + from.scope,
                         "), not of the node just before it");
    }
  }
  return "";
}

}  // namespace ration::memory
