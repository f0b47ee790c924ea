// evict.cpp — eviction rounds (see evict.h).
#include "ration/ps/evict.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <vector>

#include "ration/base/check.h"

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

EvictScope evict_scope_from_name(const std::string& name, const std::string& where) {
  if (name == "slot") return EvictScope::Slot;
  if (name == "shard") return EvictScope::Shard;
  RATION_CHECK(false, where, ": unknown eviction scope '", name, "'; valid: slot (each table apart), shard (all tables pooled)");
  return EvictScope::Slot;
}

std::string evict_scope_name(EvictScope scope) { return scope == EvictScope::Slot ? "slot" : "shard"; }

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
  RATION_CHECK(grace_steps >= 0, where, ": ps.evict_grace (--evict-grace) must be >= 0 steps; got ", grace_steps);
  RATION_CHECK(disabled_share > 0 && disabled_share <= 1, where,
               ": ps.disabled_share (--disabled-share) must be in (0, 1]; got ", disabled_share);
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

bool Evictor::make_room(int64_t need, int64_t step) {
  if (!capped()) return true;
  if (need > options_.max_bytes) return false;  // more than the whole cap: no round can make room
  if (store_.stats().bytes + need <= options_.max_bytes) return true;
  // A cut frees memory in whole chunks (16 rows of a stripe): when one round stops short of the room,
  // the next asks for more — at least a chunk in every stripe of every table — a few times at most.
  int64_t reserve = need;
  for (int attempt = 0; attempt < 4; ++attempt) {
    run_round(step, reserve, true);
    const StoreStats now = store_.stats();
    const int64_t over = now.bytes + need - options_.max_bytes;
    if (over <= 0) return true;
    const int64_t per_row = now.rows > 0 ? now.bytes / now.rows : 0;
    const int64_t chunks = static_cast<int64_t>(now.tables.size()) * Table::kStripes * Table::kChunkRows * per_row;
    reserve += 2 * over + chunks;
    if (reserve >= options_.max_bytes || now.rows == 0) return false;
  }
  return false;
}

EvictRound Evictor::run_round(int64_t step, int64_t reserve, bool admission) {
  const auto t0 = std::chrono::steady_clock::now();
  EvictRound r;
  r.step = step;
  // Bytes measured on compacted tables: a function of their contents only (see Table::compact).
  for (const std::string& name : store_.table_names()) store_.table(name).compact();
  const StoreStats before = store_.stats();
  r.rows_before = before.rows;
  r.bytes_before = before.bytes;
  struct Scored {
    float score;
    uint8_t young;  // within the grace period: ranks above every old row
    uint64_t id;
    Table* table;
    double rank = 0;      // slot scope: place in its table's keep-first order / the table's rows, in (0, 1]
    uint32_t slot = 0;    // the table's index in this round
  };
  // Keep-first order within one table (and, in shard scope, over all of them): young rows, then higher
  // score; ties broken by id so every policy is deterministic.
  const auto by_score = [](const Scored& a, const Scored& b) {
    if (a.young != b.young) return a.young > b.young;
    return a.score != b.score ? a.score > b.score : a.id < b.id;
  };
  const bool per_slot = options_.scope == EvictScope::Slot;
  size_t slot_keep = 0;  // slot scope: the rows keep_fraction leaves, floor(keep_fraction * rows) per table
  std::vector<Scored> all;
  all.reserve(static_cast<size_t>(before.rows));
  std::vector<Table*> tables;
  std::vector<ScoredId> s;
  for (const std::string& name : store_.table_names()) {
    Table* t = &store_.table(name);
    tables.push_back(t);
    s.clear();
    std::vector<uint8_t> young;  // one flag per scored row, in the walk's order
    t->score_rows([&](const RowInfo& info, const float* v) {
      young.push_back(info.first_step < 0 || step - info.first_step < options_.grace_steps);
      return score(*t, info, v, step);
    }, s);
    const size_t first = all.size();
    for (size_t i = 0; i < s.size(); ++i) {
      all.push_back({s[i].score, young[i], s[i].id, t, 0.0, static_cast<uint32_t>(tables.size() - 1)});
      r.young += young[i];
    }
    if (!per_slot) continue;
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(first);
    std::sort(begin, all.end(), by_score);
    const double n = static_cast<double>(s.size());
    for (size_t i = first; i < all.size(); ++i) all[i].rank = static_cast<double>(i - first + 1) / n;
    slot_keep += static_cast<size_t>(std::floor(options_.keep_fraction * n));
  }
  std::vector<ScoredId>().swap(s);
  // The order the cuts select in: shard scope by score; slot scope by the rank within the table, so that
  // the k first rows hold the same fraction of every table (ties: earlier table first).
  const auto keep_first = [&](const Scored& a, const Scored& b) {
    if (!per_slot) return by_score(a, b);
    return a.rank != b.rank ? a.rank < b.rank : a.slot < b.slot;
  };
  // all[0, kept) are the rows still held; select(k) moves the k best of them to the front (O(kept)).
  size_t kept = all.size();
  auto select = [&](size_t k) {
    if (k >= kept) return;
    std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.begin() + static_cast<std::ptrdiff_t>(kept), keep_first);
  };
  auto disable_from = [&](size_t from) {
    std::map<Table*, std::vector<uint64_t>> ids;
    for (size_t i = from; i < kept; ++i) ids[all[i].table].push_back(all[i].id);
    int64_t n = 0;
    for (auto& [t, v] : ids) n += t->disable(v.data(), static_cast<int64_t>(v.size()));
    for (Table* t : tables) r.released += t->compact();
    kept = from;
    return n;
  };
  size_t keep = kept;
  if (options_.keep_fraction < 1)
    keep = std::min(keep, per_slot ? slot_keep
                                   : static_cast<size_t>(std::floor(options_.keep_fraction * static_cast<double>(all.size()))));
  select(keep);
  if (options_.threshold > 0) {
    keep = static_cast<size_t>(std::partition(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep), [&](const Scored& x) {
                                 return x.young || x.score >= options_.threshold;
                               }) - all.begin());
  }
  if (keep < kept) r.disabled += disable_from(keep);
  // Bounded memory for remembered disabled ids: at most disabled_share of the byte budget, newest kept.
  const double budget = static_cast<double>(options_.max_bytes > 0 ? options_.max_bytes : before.bytes);
  auto forget = [&]() {
    const int64_t room = static_cast<int64_t>(options_.disabled_share * budget) / Table::kDisabledEntryBytes;
    const int64_t per_table = std::max<int64_t>(0, room / std::max<int64_t>(1, static_cast<int64_t>(tables.size())));
    for (Table* t : tables) r.forgotten += t->forget_disabled(per_table);
  };
  forget();
  // The byte cap: rows cost about bytes/rows each; cut to headroom * cap, and again while still above
  // the cap (index and arena granularity, remembered disabled ids).
  // With `reserve`, the target also leaves that much room below the cap.
  for (int pass = 0; options_.max_bytes > 0 && pass < 6 && kept > 0; ++pass) {
    const int64_t bytes = store_.stats().bytes;
    const double target = std::min(options_.headroom * static_cast<double>(options_.max_bytes),
                                   static_cast<double>(options_.max_bytes - reserve));
    if (pass == 0 ? bytes + reserve <= options_.max_bytes : bytes <= target) break;
    const double per_row = static_cast<double>(bytes) / static_cast<double>(kept);
    const int64_t fit = std::max<int64_t>(0, static_cast<int64_t>(std::floor(
        static_cast<double>(kept) - (static_cast<double>(bytes) - target) / per_row)));
    if (fit >= static_cast<int64_t>(kept)) break;
    select(static_cast<size_t>(fit));
    r.disabled += disable_from(static_cast<size_t>(fit));
    forget();
    // Stop when a pass released nothing (what is left is allocator granularity, not rows).
    if (pass > 0 && store_.stats().bytes >= bytes) break;
  }
  const StoreStats after = store_.stats();
  r.rows_after = after.rows;
  r.bytes_after = after.bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  ++(admission ? admission_rounds_ : rounds_);
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
  t.admission_rounds = admission_rounds_;
  t.disabled = disabled_total_;
  t.bytes_freed = freed_total_;
  return t;
}

EvictRound Evictor::last_round() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

}  // namespace ration::ps
