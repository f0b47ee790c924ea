// store.h — the embedding store of one parameter-server shard: named tables of 64-bit feature ids ->
// rows of `dim` floats, with per-row optimiser state and per-row metadata (frequency, last step, score).
// Owns: Table (striped hash index + row arena with a free list, deterministic first-touch initialisation,
//       batched thread-safe pull/push with the optimiser applied on the store, erase/compact that return
//       memory, export/assign for snapshots and mirrors, accounted bytes; push-time importance scores;
//       disabled ids with their re-admission counts; a table version, per-row change versions and the
//       tombstone log an online mirror reads deltas from), EmbeddingStore (the tables of a shard by name).
// Does not own: the network (ps/server.h), which shard an id belongs to (ps/partition.h), persistence
//       files (ps/snapshot.h) or what to evict (a policy outside, through erase_if and RowInfo::score).
//
// Layout: a table is split into kStripes stripes by bits 40.. of mix64(id); each stripe has its own mutex,
// an absl::flat_hash_map<id, slot> (probed by the low bits of the same mix64) and an arena of fixed-size
// chunks. A chunk is one allocation of kChunkRows records and their live flags; a record is the row's
// RowInfo (32 bytes), its `dim` values and the optimiser's state floats, contiguous (padded to 8 bytes),
// so a push reads and writes adjacent cache lines of one record. Freed slots go on the stripe's free list
// and are reused first (their RowInfo reset); compact() moves live records, metadata included, out of the
// tail chunks and releases those chunks to the allocator. A batch is grouped by stripe; a push looks a
// stripe group up first (index probes prefetched a few ids ahead, each found record prefetched), then
// updates it; a pull prefetches the probes and copies as it goes. Pull and push visit their stripe
// groups from a per-call start half a table apart and defer a stripe another thread holds
// (docs/METHODS.md, "Store layout and batch access").
// Method: docs/METHODS.md, "Sparse embeddings on parameter servers" (importance, disabling, versions:
// its subsections "Importance", "Disabling and re-admission" and "Online parameter server").
#pragma once
#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

namespace ration::ps {

// splitmix64 finaliser: the mixing every hash in ps/ builds on.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The update rule run on the store when gradients are pushed.
enum class OptimizerKind { Sgd, Adagrad, Adam, Ftrl };
OptimizerKind optimizer_kind_from_name(const std::string& name, const std::string& where);
std::string optimizer_kind_name(OptimizerKind kind);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::Adagrad;
  float lr = 0.05f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;   // Adam (eps also Adagrad's)
  float initial_accumulator = 0.0f;                  // Adagrad
  float ftrl_alpha = 0.05f, ftrl_beta = 1.0f, ftrl_l1 = 0.0f, ftrl_l2 = 0.0f;  // FTRL-proximal
};
// Optimiser state floats per row: Sgd 0, Adagrad dim, Adam 2*dim + 1 (m, v, step), Ftrl 2*dim (z, n).
int64_t state_floats(OptimizerKind kind, int64_t dim);

struct TableOptions {
  std::string name;
  int64_t dim = 16;
  uint64_t seed = 0;
  float init_scale = 0.01f;  // first-touch values uniform in [-init_scale, init_scale), from (seed, id)
  OptimizerOptions optimizer;
};

// What pull does for an id the table does not hold.
enum class MissingRow {
  Create,       // training: insert the row with its deterministic initial value
  ReadDefault,  // evaluation/serving: return the initial value, insert nothing
};

// Per-row metadata, stored at the head of the row's record, just before its values (for eviction
// policies and mirrors).
struct RowInfo {
  uint64_t id = 0;
  uint32_t pushes = 0;     // gradient updates applied
  float score = 0;         // importance (decayed sum of |w.g|/dim, see Table::set_importance_decay)
  int32_t last_step = -1;  // step of the last push (-1: never)
  int32_t first_step = -1; // step of the first push since the row was (re)created (-1: never); its age
  int64_t version = 0;     // table version of the last change (push, assign, creation)
};

// A row id and the score an eviction policy gave it.
struct ScoredId {
  float score;
  uint64_t id;
};

// Called under the row's stripe lock for every pushed row, before the optimiser changes the values:
// (info, values before the update, gradient, dim). Lets a policy score rows at push time.
using PushObserver = std::function<void(RowInfo& info, const float* values, const float* grad, int64_t dim)>;

struct TableBytes {
  int64_t rows = 0;          // live rows
  int64_t value_bytes = 0;   // live rows * dim * 4
  int64_t state_bytes = 0;   // live rows * state floats * 4
  int64_t meta_bytes = 0;    // per allocated slot: its record's RowInfo + padding, and its live flag
  int64_t index_bytes = 0;   // hash index capacity * (slot + control byte)
  int64_t arena_bytes = 0;   // values + state of every allocated slot (live + free); arena + meta = chunks
  int64_t disabled = 0;        // disabled ids remembered for re-admission
  int64_t disabled_bytes = 0;  // their index (capacity * (id + count + round + control byte))
  int64_t log_bytes = 0;       // the change log an online mirror's deltas read (0 until a mirror asks)
  int64_t total() const { return arena_bytes + meta_bytes + index_bytes + disabled_bytes + log_bytes; }
};

// Rows copied out of a table (snapshot, mirror): ids, values (n*dim), state (n*state floats), infos.
struct ExportedRows {
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<float> state;
  std::vector<RowInfo> infos;
  int64_t size() const { return static_cast<int64_t>(ids.size()); }
};

// Position of an export walk: stripe, then slot within it.
struct ExportCursor {
  int64_t stripe = 0;
  int64_t slot = 0;
  bool done = false;
};

class Table {
 public:
  static constexpr int kStripes = 16;
  // Small chunks: after compact() a stripe holds at most kChunkRows - 1 free slots, so a byte cap is met
  // closely even for small tables (16 stripes * 15 slots of slack per table).
  static constexpr int64_t kChunkRows = 16;

  explicit Table(TableOptions options);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableOptions& options() const { return options_; }
  int64_t dim() const { return options_.dim; }
  int64_t state_size() const { return state_; }

  // out[i*dim .. +dim) = row of ids[i]. Duplicates allowed. A disabled id reads zeros and is not created.
  void pull(const uint64_t* ids, int64_t n, float* out, MissingRow missing = MissingRow::Create);
  // Applies the optimiser to each row with grads[i*dim .. +dim). Rows are created first if absent.
  // An id repeated in one call is updated once per occurrence, in order. A disabled id's push is ignored
  // but counted as a sighting; at the re-admission count it gets a fresh row and this push applies.
  // Each call is one table version.
  void push(const uint64_t* ids, int64_t n, const float* grads, int64_t step);
  // Ensures every id has a row (initial value when new). Returns how many were created.
  int64_t find_or_insert(const uint64_t* ids, int64_t n);
  // Overwrites values (and state when `state` is non-null; else zero state for new rows) of each id,
  // creating rows as needed. infos (optional) overwrite the metadata too.
  void assign(const uint64_t* ids, int64_t n, const float* values, const float* state = nullptr,
              const RowInfo* infos = nullptr);
  // Frees every row whose info satisfies pred (under the stripe lock). Returns the count freed.
  int64_t erase_if(const std::function<bool(const RowInfo&)>& pred);
  int64_t erase(const uint64_t* ids, int64_t n);

  // ---- importance and disabling (docs/METHODS.md, "Importance", "Disabling and re-admission") ----
  // decay in (0, 1): every push scores its rows (RowInfo::score, see importance_at); 0 turns it off.
  void set_importance_decay(float decay);
  // A row's importance at `step`: its score decayed over the steps since it was last seen.
  float importance_at(const RowInfo& info, int64_t step) const;
  // Pushes a disabled id must see before it gets a row again (>= 1).
  void set_readmit_after(int64_t sightings);
  // score(info, values) for every live row, appended to out.
  void score_rows(const std::function<float(const RowInfo&, const float*)>& score, std::vector<ScoredId>& out) const;
  // Frees the rows of ids (as erase) and remembers them as disabled, each a tombstone of this table
  // version. Returns how many rows were freed. Each call is one disabling round.
  int64_t disable(const uint64_t* ids, int64_t n);
  // Bounded memory for the remembered disabled ids: keeps the `keep` with the most sightings since they
  // were disabled (the closest to re-admission), ties by a hash of the id (a deterministic sample that a
  // snapshot's restore reproduces), and forgets the rest — a forgotten id is an unknown id again (its
  // next pull creates a row; its tombstone stays in the log for mirrors). Shrinks the index. Returns how
  // many were forgotten.
  int64_t forget_disabled(int64_t keep);
  // Bytes the disabled-id index takes per remembered id at its current load (for sizing `keep`).
  static constexpr int64_t kDisabledEntryBytes = 16 + 1;
  bool is_disabled(uint64_t id) const;
  std::vector<uint64_t> disabled_ids() const;
  // Every disabled id with the pushes it has seen since it was disabled (what a snapshot saves).
  std::vector<std::pair<uint64_t, uint32_t>> disabled_entries() const;
  // Marks ids disabled with their sighting counts, as a restored snapshot had them: no row is created,
  // any row of theirs is freed; no version and no tombstone are taken (a restored table is a new table
  // object with a new epoch, so a mirror copies it in full and drops what the copy does not hold).
  void restore_disabled(const uint64_t* ids, const uint32_t* sightings, int64_t n);
  // Disabled ids re-admitted (given a row again) by pushes since this table object was made.
  int64_t readmitted() const { return readmitted_.load(std::memory_order_relaxed); }

  // ---- versions and deltas (docs/METHODS.md, "Online parameter server") ----
  int64_t version() const { return version_.load(); }
  // From now on every row change (push, assign, re-admission) is appended to its stripe's change log, so
  // export_changed(from) costs O(changes since from) instead of a walk over every slot. Idempotent; the
  // first call waits for writes in flight. Deltas from versions before the first call walk the slots.
  void enable_change_log();
  bool change_log_enabled() const { return logging_.load(std::memory_order_acquire); }
  // A version such that every change numbered <= it has finished (waits for pushes in flight).
  int64_t settled_version() const;
  // Live rows whose version > from_version, from `cursor` on, up to max_rows (values only, infos carry
  // the versions). Rows changed concurrently are seen whole, in either state. from_version must be a
  // version settled_version() returned (what a mirror holds). With the change log on and from_version at
  // or after its start, the walk reads only the log entries after from_version (cursor.slot is then a
  // position in the stripe's log tagged with its generation; a log compacted meanwhile restarts the
  // stripe, re-sending rows, which a mirror applies idempotently); else it walks every slot. Rows created
  // by a pull and never pushed hold their initial value, which a mirror reads for an absent id: the log
  // omits them.
  // to_version (a settled version too, pinned for every page of one delta) ends each stripe's log walk at
  // the first newer entry, so a paged walk under load finishes; rows changed after it come next delta.
  void export_changed(int64_t from_version, ExportCursor& cursor, int64_t max_rows, ExportedRows& out,
                      int64_t to_version = std::numeric_limits<int64_t>::max()) const;
  // Tombstones (id, version) with version > from_version, in version order. False when the log no
  // longer reaches back to from_version (entries were dropped): the caller needs a full copy.
  bool tombstones_since(int64_t from_version, std::vector<std::pair<uint64_t, int64_t>>& out) const;
  // Tombstones kept (older ones are dropped; a mirror further behind then resyncs in full).
  void set_tombstone_limit(int64_t limit);
  // A random number fixed for this table object: a mirror that sees it change copies in full.
  uint64_t epoch() const { return epoch_; }
  // Moves live rows out of the tail chunks and releases empty chunks (and trims the heap, so the process
  // RSS goes down too). Returns the bytes released (arena and per-slot metadata).
  int64_t compact();
  // Copies up to `max_rows` live rows from `cursor` on; advances it (cursor.done when the walk ends).
  // Rows changed concurrently may be seen in either state, each row consistent.
  void export_batch(ExportCursor& cursor, int64_t max_rows, ExportedRows& out) const;
  // Deterministic initial value of `id` (what a first pull returns).
  void initial_value(uint64_t id, float* out) const;

  // Stripe groups that pull/push found held by another thread and visited after the others (a measure of
  // lock contention between concurrent batches; see StripeOrder).
  int64_t contended_groups() const { return contended_.load(std::memory_order_relaxed); }

  // An upper bound of the accounted bytes that inserting the absent ids among ids[0, n) would add (their
  // records' chunks and each stripe's index growth; disabled ids count only when `disabled_too`, as a
  // push may re-admit them). *absent (optional) gets how many distinct ids have no row.
  int64_t admission_bytes(const uint64_t* ids, int64_t n, bool disabled_too, int64_t* absent = nullptr) const;

  void set_push_observer(PushObserver observer);
  bool contains(uint64_t id) const;
  int64_t size() const;
  TableBytes bytes() const;

 private:
  struct Stripe;
  enum class RowState { Included, Omitted };  // whether an export carries each row's optimiser state
  void export_logged(int64_t from_version, int64_t to_version, ExportCursor& cursor, int64_t max_rows,
                     ExportedRows& out) const;
  // Appends (id, version) to st's change log (caller holds st's lock), compacting it when it outgrows
  // twice the stripe's rows.
  void log_change(Stripe& st, uint64_t id, int64_t version);
  void export_rows(int64_t newer_than, RowState state, ExportCursor& cursor, int64_t max_rows,
                   ExportedRows& out) const;

  // How a batch visits its stripe groups: Rotated (pull, push) starts at a per-call stripe and defers a
  // stripe another thread holds; InOrder takes stripe 0 first and waits for each lock.
  enum class StripeOrder { Rotated, InOrder };
  // How a stripe walk of an export left its stripe.
  enum class StripeEnd { Finished, Paused };
  // The stripe+cursor skeleton both exports share: from `cursor` on, locks each stripe and calls
  // walk(stripe, cursor.slot, room, out) -> StripeEnd until max_rows rows are taken or the stripes end.
  template <class Walk>
  void walk_stripes(ExportCursor& cursor, int64_t max_rows, ExportedRows& out, Walk&& walk) const;

  Stripe& stripe_of(uint64_t id) const;
  // Bits 40.. of mix64(id) (the index probes with its low bits).
  static int stripe_index(uint64_t id) { return static_cast<int>((mix64(id) >> 40) % kStripes); }
  // Push of one batch with the optimiser fixed at compile time (push() dispatches once per call).
  template <OptimizerKind K>
  void push_as(const uint64_t* ids, int64_t n, const float* grads, int64_t step, int64_t version);
  // The record a push of `id` updates (created if absent), or null for a disabled id that this push
  // sighted without re-admitting it. Caller holds st's lock.
  char* row_for_push(Stripe& st, uint64_t id);
  // A new row for `id` in `st` (whose lock the caller holds): first-touch value, fresh optimiser state
  // and RowInfo, entered in the index. Returns its slot.
  uint32_t create_row(Stripe& st, uint64_t id);
  // Calls fn(stripe, positions, m) once per stripe that ids[0, n) touch, under the stripe's lock, with
  // the positions (ascending) of the ids in that stripe.
  template <class Fn>
  void for_each_stripe_group(const uint64_t* ids, int64_t n, StripeOrder visit, Fn&& fn);
  // Calls fn(stripe, i) for every i in [0, n), grouped by stripe (InOrder), under its stripe's lock.
  template <class Fn>
  void for_each_by_stripe(const uint64_t* ids, int64_t n, Fn&& fn);

  TableOptions options_;
  int64_t state_ = 0;
  int64_t stride_ = 0;  // floats per slot: dim + state
  std::vector<std::unique_ptr<Stripe>> stripes_;
  PushObserver observer_;
  float decay_ = 0;            // importance decay; 0: not scored
  int64_t readmit_after_ = 2;  // sightings of a disabled id before it is re-admitted
  std::atomic<int64_t> readmitted_{0};
  std::atomic<uint32_t> rotor_{0};      // start stripe of the next Rotated batch
  std::atomic<int64_t> contended_{0};   // stripe groups a Rotated batch found locked and deferred
  // Versions: writers (push, assign, erase, disable) hold write_mu_ shared while they take a version and
  // apply it; settled_version() takes it exclusively for a moment, so every smaller version is done.
  mutable std::shared_mutex write_mu_;
  std::atomic<int64_t> version_{0};
  mutable std::mutex tomb_mu_;
  std::deque<std::pair<uint64_t, int64_t>> tombstones_;  // (id, version), version ascending
  int64_t tombstone_floor_ = 0;  // tombstones with version <= this were dropped
  int64_t tombstone_limit_ = 1 << 22;
  uint64_t epoch_ = 0;
  std::atomic<bool> logging_{false};
  int64_t log_floor_ = 0;        // the version at which the change log started
  std::atomic<uint32_t> disable_round_{0};  // disable() calls so far
};

struct StoreStats {
  int64_t rows = 0;
  int64_t bytes = 0;
  std::map<std::string, TableBytes> tables;
};

// The tables one shard holds. Tables are created before use and never removed while the store lives.
class EmbeddingStore {
 public:
  // Creates the table, or returns the existing one if its options match (dim, optimiser kind); differing
  // options are an error naming both.
  Table& ensure_table(const TableOptions& options);
  Table* find(const std::string& name);
  const Table* find(const std::string& name) const;
  // Throws naming the table and the tables that exist.
  Table& table(const std::string& name);
  std::vector<std::string> table_names() const;
  StoreStats stats() const;
  // Takes every table of `other` in place of this store's (restore: built aside, swapped in whole).
  void replace_tables(EmbeddingStore&& other);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Table>> tables_;
};

}  // namespace ration::ps
