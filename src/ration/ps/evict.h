// evict.h — disabling sub-features (embedding rows) of a shard's store under a memory cap or a keep
// fraction, by importance or by one of the baseline policies (frequency, lru, l2), in rounds.
// Owns: EvictPolicy and EvictOptions (names, validation with errors naming the flag/key), Evictor (when
//       a round runs, scoring every live row of every table with the policy, choosing the rows to disable
//       — the same selection for every policy — disabling them and compacting the arena so memory goes
//       back to the operating system), EvictRound (what a round did).
// Does not own: the scores' ingredients (ps/store.h keeps importance, pushes, last step, values), who
//       calls a round (ps/shard.h on pushes, tests and benches directly).
// Method: docs/METHODS.md, "Sparse embeddings on parameter servers", "Disabling and re-admission".
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

#include "ration/ps/store.h"

namespace ration::ps {

enum class EvictPolicy { None, Importance, Frequency, Lru, L2 };
EvictPolicy evict_policy_from_name(const std::string& name, const std::string& where);
std::string evict_policy_name(EvictPolicy policy);

// Where a round chooses the lowest rows (ps.evict_scope): Slot (default) within each table — one feature
// slot, the method's category — so every slot keeps the same fraction of its rows, its best ones; Shard
// over all tables of the shard pooled, so a slot whose scores run low can lose every row.
enum class EvictScope { Slot, Shard };
EvictScope evict_scope_from_name(const std::string& name, const std::string& where);
std::string evict_scope_name(EvictScope scope);

struct EvictOptions {
  EvictPolicy policy = EvictPolicy::None;
  EvictScope scope = EvictScope::Slot;
  int64_t max_bytes = 0;        // cap on the store's accounted bytes (all tables together); 0: none
  int64_t evict_every = 100;    // a round at every step that is a multiple of this
  double keep_fraction = 1.0;   // (0, 1]: each round also keeps at most this fraction of the live rows
  double threshold = 0;         // > 0: each round also disables rows scoring below it
  int64_t readmit_after = 2;    // pushes a disabled id must see before it gets a row again
  // Per-step decay γ of the importance (docs/METHODS.md, "Importance"): 0.95 (a time constant of ~20
  // steps) was the best single value over the synthetic drifting clicks and MovieLens.
  double importance_decay = 0.95;
  double headroom = 0.9;        // a capped round cuts to this fraction of max_bytes (room for new ids)
  // Grace period, the same for every policy: a row pushed first fewer than this many steps ago (or
  // never pushed) ranks above every older row, so it is disabled only when the older rows alone cannot
  // meet the cap; among themselves young rows are ordered by the policy's score. 0 (default): off — on
  // the drifting-click and MovieLens benches it lowered every policy's AUC (docs/METHODS.md, "Disabling and
  // re-admission"). Whatever the
  // grace, a row not pushed yet (pulled for the step in progress, whose push is still to come) ranks as
  // young: a round never takes a row from under the step that just pulled it.
  int64_t grace_steps = 0;
  // Bounded memory for remembered disabled ids: a round forgets the oldest-disabled ids beyond this
  // fraction of the byte budget (max_bytes, or the store's bytes at the round's start when uncapped).
  double disabled_share = 0.05;
  // Errors name `where` and the field, with the expected form.
  void validate(const std::string& where) const;
  bool active() const { return policy != EvictPolicy::None; }
};

struct EvictRound {
  int64_t step = 0;
  int64_t rows_before = 0, rows_after = 0, disabled = 0;
  int64_t young = 0;      // rows within their grace period when the round started
  int64_t forgotten = 0;  // remembered disabled ids forgotten (bounded memory)
  int64_t bytes_before = 0, bytes_after = 0, released = 0;
  double seconds = 0;
};

// What every round so far did together, and the re-admissions the policy's tables saw (reported by the
// trainer next to ps.rows / ps.bytes).
struct EvictTotals {
  int64_t rounds = 0;
  int64_t admission_rounds = 0;  // rounds run to make room for an insert (the cap at every moment)
  int64_t disabled = 0;     // rows disabled
  int64_t readmitted = 0;   // disabled ids given a row again (summed over the store's current tables)
  int64_t bytes_freed = 0;  // accounted bytes the rounds took off (bytes_before - bytes_after)
  int64_t disabled_now = 0; // disabled ids remembered now
};

class Evictor {
 public:
  // Sets importance decay and re-admission on every table the store holds now and later (apply()).
  Evictor(EmbeddingStore& store, EvictOptions options);
  // Applies the table settings to tables declared after construction.
  void apply(Table& table) const;
  // Runs a round when `step` is a multiple of evict_every and no round ran for it yet.
  bool maybe_run(int64_t step);
  // One round now. Young rows (grace_steps) first, then the policy's score, order the rows; the lowest
  // are disabled until the store fits headroom * max_bytes, at most keep_fraction of the rows stay, and
  // old rows under threshold go. Shard scope: one order over every table, selection O(rows)
  // (nth_element). Slot scope: each table's rows are sorted in that order and ranked by their place in
  // it (rank / rows of the table), and the cuts select by that rank, so each table loses the same fraction.
  // `reserve`: bytes to leave free below max_bytes besides (room for rows about to be inserted).
  EvictRound run(int64_t step, int64_t reserve = 0) { return run_round(step, reserve, false); }
  // The cap at every moment: before rows taking up to `need` bytes are inserted, runs a round that
  // leaves room for them when the store would otherwise exceed max_bytes. False when they cannot fit
  // (more than the cap, or only rows of the step in progress are left to disable): refuse them.
  bool make_room(int64_t need, int64_t step);
  bool capped() const { return options_.active() && options_.max_bytes > 0; }
  int64_t max_bytes() const { return options_.max_bytes; }
  // Policy score of one row (higher = keep).
  float score(const Table& table, const RowInfo& info, const float* values, int64_t step) const;
  int64_t rounds() const { return rounds_; }  // scheduled rounds (evict_every), not admission rounds
  EvictRound last_round() const;
  EvictTotals totals() const;

 private:
  EmbeddingStore& store_;
  EvictRound run_round(int64_t step, int64_t reserve, bool admission);

  EvictOptions options_;
  mutable std::mutex mu_;
  int64_t last_step_ = -1;
  int64_t rounds_ = 0, admission_rounds_ = 0;
  EvictRound last_;
  int64_t disabled_total_ = 0, freed_total_ = 0;
};

}  // namespace ration::ps
