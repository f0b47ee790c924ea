// evict.cpp — eviction rounds (see evict.h).
#include "ration/ps/evict.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <vector>

#include "ration/core/check.h"

namespace ration::ps {

EvictPolicy evict_policy_from_name(const std::string& name, const std::string& where) {
  if (name == "none") return EvictPolicy::None;
  if (name == "importance") return EvictPolicy::Importance;
  if (name == "frequency") return EvictPolicy::Frequency;
  if (name == "lru") return EvictPolicy::Lru;
  if (name == "l2") return EvictPolicy::L2;
  RATION_CHECK(false, where, ": unknown eviction policy '", name, "'; valid: importance, frequency, lru, l2, none");
  return EvictPolicy::None;
}

std::string evict_policy_name(EvictPolicy policy) {
  switch (policy) {
    case EvictPolicy::None: return "none";
    case EvictPolicy::Importance: return "importance";
    case EvictPolicy::Frequency: return "frequency";
    case EvictPolicy::Lru: return "lru";
    case EvictPolicy::L2: return "l2";
  }
  return "?";
}

void EvictOptions::validate(const std::string& where) const {
  RATION_CHECK(max_bytes >= 0, where, ": ps.max_bytes (--max-bytes) must be >= 0 bytes (0: no cap); got ", max_bytes);
  RATION_CHECK(evict_every >= 1, where, ": ps.evict_every (--evict-every) must be >= 1 step; got ", evict_every);
  RATION_CHECK(keep_fraction > 0 && keep_fraction <= 1, where, ": ps.keep_fraction (--keep-fraction) must be in (0, 1]; got ",
               keep_fraction);
  RATION_CHECK(threshold >= 0, where, ": ps.evict_threshold (--evict-threshold) must be >= 0; got ", threshold);
  RATION_CHECK(readmit_after >= 1, where, ": ps.readmit_after (--readmit-after) must be >= 1 sighting; got ", readmit_after);
  RATION_CHECK(importance_decay > 0 && importance_decay < 1, where,
               ": ps.importance_decay (--importance-decay) must be in (0, 1); got ", importance_decay);
  RATION_CHECK(headroom > 0 && headroom <= 1, where, ": ps.evict_headroom must be in (0, 1]; got ", headroom);
  if (policy != EvictPolicy::None) {
    RATION_CHECK(max_bytes > 0 || keep_fraction < 1 || threshold > 0, where, ": ps.evict (--evict) = '",
                 evict_policy_name(policy), "' needs ps.max_bytes (--max-bytes) > 0, ps.keep_fraction (--keep-fraction) < 1 or ps.evict_threshold (--evict-threshold) > 0");
  }
}

Evictor::Evictor(EmbeddingStore& store, EvictOptions options) : store_(store), options_(options) {
  options_.validate("eviction options");
  for (const std::string& name : store_.table_names()) apply(store_.table(name));
}

void Evictor::apply(Table& table) const {
  table.set_readmit_after(options_.readmit_after);
  // Importance is scored on every push whatever the policy (its cost is measured in bench/ps_evict.cpp),
  // so Stats and mirrors can report it; only the importance policy evicts by it.
  table.set_importance_decay(static_cast<float>(options_.importance_decay));
}

float Evictor::score(const Table& table, const RowInfo& info, const float* values, int64_t step) const {
  switch (options_.policy) {
    case EvictPolicy::Importance: return table.importance_at(info, step);
    case EvictPolicy::Frequency: return static_cast<float>(info.pushes);
    case EvictPolicy::Lru: return static_cast<float>(info.last_step);
    case EvictPolicy::L2: {
      double s = 0;
      for (int64_t k = 0; k < table.dim(); ++k) s += static_cast<double>(values[k]) * values[k];
      return static_cast<float>(std::sqrt(s));
    }
    case EvictPolicy::None: return 0;
  }
  return 0;
}

bool Evictor::maybe_run(int64_t step) {
  if (!options_.active() || step <= 0 || step % options_.evict_every != 0) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (step <= last_step_) return false;
    last_step_ = step;
  }
  run(step);
  return true;
}

EvictRound Evictor::run(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  EvictRound r;
  r.step = step;
  const StoreStats before = store_.stats();
  r.rows_before = before.rows;
  r.bytes_before = before.bytes;
  struct Scored {
    float score;
    uint64_t id;
    Table* table;
  };
  std::vector<Scored> all;
  std::vector<Table*> tables;
  for (const std::string& name : store_.table_names()) {
    Table* t = &store_.table(name);
    tables.push_back(t);
    std::vector<ScoredId> s;
    t->score_rows([&](const RowInfo& info, const float* v) { return score(*t, info, v, step); }, s);
    for (const ScoredId& x : s) all.push_back({x.score, x.id, t});
  }
  // Highest first; ties broken by id so every policy's order is deterministic.
  std::sort(all.begin(), all.end(), [](const Scored& a, const Scored& b) {
    return a.score != b.score ? a.score > b.score : a.id < b.id;
  });
  int64_t keep = static_cast<int64_t>(all.size());
  if (options_.keep_fraction < 1) keep = std::min<int64_t>(keep, static_cast<int64_t>(std::floor(options_.keep_fraction * static_cast<double>(all.size()))));
  if (options_.threshold > 0) {
    int64_t above = 0;
    while (above < keep && all[static_cast<size_t>(above)].score >= options_.threshold) ++above;
    keep = above;
  }
  auto disable_from = [&](int64_t from) {
    std::map<Table*, std::vector<uint64_t>> ids;
    for (size_t i = static_cast<size_t>(from); i < all.size(); ++i) ids[all[i].table].push_back(all[i].id);
    int64_t n = 0;
    for (auto& [t, v] : ids) n += t->disable(v.data(), static_cast<int64_t>(v.size()));
    for (Table* t : tables) r.released += t->compact();
    all.resize(static_cast<size_t>(from));
    return n;
  };
  if (keep < static_cast<int64_t>(all.size())) r.disabled += disable_from(keep);
  // The byte cap: rows cost about bytes/rows each; cut to headroom * cap, and again while still above
  // the cap (index and arena granularity, remembered disabled ids).
  for (int pass = 0; options_.max_bytes > 0 && pass < 4 && !all.empty(); ++pass) {
    const int64_t bytes = store_.stats().bytes;
    const double target = options_.headroom * static_cast<double>(options_.max_bytes);
    if (pass == 0 ? bytes <= options_.max_bytes : bytes <= target) break;
    const double per_row = static_cast<double>(bytes) / static_cast<double>(all.size());
    const int64_t fit = std::max<int64_t>(0, static_cast<int64_t>(std::floor(
        static_cast<double>(all.size()) - (static_cast<double>(bytes) - target) / per_row)));
    if (fit >= static_cast<int64_t>(all.size())) break;
    r.disabled += disable_from(fit);
    // Stop when a pass released nothing (what is left is allocator granularity, not rows).
    if (pass > 0 && store_.stats().bytes >= bytes) break;
  }
  const StoreStats after = store_.stats();
  r.rows_after = after.rows;
  r.bytes_after = after.bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  ++rounds_;
  last_ = r;
  disabled_total_ += r.disabled;
  freed_total_ += std::max<int64_t>(0, r.bytes_before - r.bytes_after);
  return r;
}

EvictTotals Evictor::totals() const {
  EvictTotals t;
  for (const std::string& name : store_.table_names()) {
    const Table* table = store_.find(name);
    if (table == nullptr) continue;
    t.readmitted += table->readmitted();
    t.disabled_now += table->bytes().disabled;
  }
  std::lock_guard<std::mutex> lock(mu_);
  t.rounds = rounds_;
  t.disabled = disabled_total_;
  t.bytes_freed = freed_total_;
  return t;
}

EvictRound Evictor::last_round() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

}  // namespace ration::ps
