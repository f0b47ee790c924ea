// store.cpp — Table and EmbeddingStore (see store.h): stripes, arena, optimisers, export/assign.
#include "ration/ps/store.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <random>

#include "ration/base/check.h"

namespace ration::ps {

OptimizerKind optimizer_kind_from_name(const std::string& name, const std::string& where) {
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "adagrad") return OptimizerKind::Adagrad;
  if (name == "adam") return OptimizerKind::Adam;
  if (name == "ftrl") return OptimizerKind::Ftrl;
  RATION_CHECK(false, where, ": unknown sparse optimiser '", name, "'; valid: sgd, adagrad, adam, ftrl");
  return OptimizerKind::Sgd;
}

std::string optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Sgd: return "sgd";
    case OptimizerKind::Adagrad: return "adagrad";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::Ftrl: return "ftrl";
  }
  return "?";
}

int64_t state_floats(OptimizerKind kind, int64_t dim) {
  switch (kind) {
    case OptimizerKind::Sgd: return 0;
    case OptimizerKind::Adagrad: return dim;
    case OptimizerKind::Adam: return 2 * dim + 1;
    case OptimizerKind::Ftrl: return 2 * dim;
  }
  return 0;
}

namespace {

// One optimiser step on a row: w (dim values), s (state), g (gradient); the kind fixed at compile time so
// a batch dispatches once, not per row. The options are read into locals: a store through w cannot
// change them, so the loops vectorise.
template <OptimizerKind K>
void apply_update(const OptimizerOptions& o, int64_t dim, float* __restrict w, float* __restrict s,
                  const float* __restrict g) {
  if constexpr (K == OptimizerKind::Sgd) {
    const float lr = o.lr;
    for (int64_t k = 0; k < dim; ++k) w[k] -= lr * g[k];
  } else if constexpr (K == OptimizerKind::Adagrad) {
    const float lr = o.lr, eps = o.eps;
    for (int64_t k = 0; k < dim; ++k) {
      s[k] += g[k] * g[k];
      w[k] -= lr * g[k] / (std::sqrt(s[k]) + eps);
    }
  } else if constexpr (K == OptimizerKind::Adam) {
    const float lr = o.lr, beta1 = o.beta1, beta2 = o.beta2, eps = o.eps;
    float* m = s;
    float* v = s + dim;
    float& t = s[2 * dim];
    t += 1.0f;
    const float c1 = 1.0f - std::pow(beta1, t);
    const float c2 = 1.0f - std::pow(beta2, t);
    for (int64_t k = 0; k < dim; ++k) {
      m[k] = beta1 * m[k] + (1.0f - beta1) * g[k];
      v[k] = beta2 * v[k] + (1.0f - beta2) * g[k] * g[k];
      w[k] -= lr * (m[k] / c1) / (std::sqrt(v[k] / c2) + eps);
    }
  } else {
    // FTRL-proximal (McMahan et al. 2013), per coordinate: z accumulates the linearised loss, n the
    // squared gradients; the weight is the closed-form minimiser with L1/L2.
    const float alpha = o.ftrl_alpha, beta = o.ftrl_beta, l1 = o.ftrl_l1, l2 = o.ftrl_l2;
    float* z = s;
    float* n = s + dim;
    for (int64_t k = 0; k < dim; ++k) {
      const float n_new = n[k] + g[k] * g[k];
      const float sigma = (std::sqrt(n_new) - std::sqrt(n[k])) / alpha;
      z[k] += g[k] - sigma * w[k];
      n[k] = n_new;
      if (std::fabs(z[k]) <= l1) {
        w[k] = 0;
      } else {
        const float sign = z[k] < 0 ? -1.0f : 1.0f;
        w[k] = -(z[k] - sign * l1) / ((beta + std::sqrt(n[k])) / alpha + l2);
      }
    }
  }
}

// Fresh optimiser state of a row whose values are `w`.
void init_state(const OptimizerOptions& o, int64_t dim, const float* w, float* s, int64_t state) {
  std::fill(s, s + state, 0.0f);
  if (o.kind == OptimizerKind::Adagrad) std::fill(s, s + dim, o.initial_accumulator);
  if (o.kind == OptimizerKind::Ftrl) {
    // z chosen so the first FTRL step starts from the initial weights (w = -z * alpha / beta when n = 0,
    // l1 = l2 = 0): z = -w * beta / alpha.
    for (int64_t k = 0; k < dim; ++k) s[k] = -w[k] * o.ftrl_beta / o.ftrl_alpha;
  }
}

}  // namespace

// ---- stripe -------------------------------------------------------------------------------------------
namespace {
RowInfo fresh_info(uint64_t id) {
  RowInfo r;
  r.id = id;
  return r;
}
}  // namespace

// The per-stripe index hashes ids with mix64 (the stripe takes bits 40.. of the same hash, the index's
// probe the low ones), so a batch mixes each id once for both.
struct IdHash {
  size_t operator()(uint64_t id) const { return static_cast<size_t>(mix64(id)); }
};

struct Table::Stripe {
  // A chunk is one allocation holding kChunkRows records and then their kChunkRows live flags. A record
  // is the row's RowInfo, its dim values and its optimiser state, contiguous (record_bytes each, a
  // multiple of 8), so a push touches adjacent cache lines of one record; see store.h "Layout".
  struct FreeChunk {
    void operator()(char* p) const { ::operator delete[](p, std::align_val_t(kChunkAlign)); }
  };
  using Chunk = std::unique_ptr<char[], FreeChunk>;
  static constexpr size_t kChunkAlign = 64;
  mutable std::mutex mu;
  absl::flat_hash_map<uint64_t, uint32_t, IdHash> index;  // id -> slot
  std::vector<Chunk> chunks;
  std::vector<uint32_t> free_slots;               // freed slots, reused before fresh ones
  struct Disabled {
    uint32_t sightings = 0;  // pushes seen since it was disabled
    uint32_t round = 0;      // the disable() call that disabled it (reported, not used for ordering)
  };
  absl::flat_hash_map<uint64_t, Disabled> disabled;  // disabled id -> its sightings and round
  // Change log (Table::enable_change_log): (id, version) per row change, in the order the changes were
  // applied; generation counts compactions (a paged delta's cursor carries it).
  std::vector<std::pair<uint64_t, int64_t>> log;
  uint32_t log_generation = 1;
  int64_t fresh = 0;                              // slots [fresh, capacity) were never handed out
  int64_t record_bytes = 0;                       // RowInfo + (dim + state) floats, rounded up to 8

  int64_t chunk_bytes() const { return kChunkRows * record_bytes + kChunkRows; }
  char* record(uint32_t slot) { return chunks[slot / kChunkRows].get() + (slot % kChunkRows) * record_bytes; }
  const char* record(uint32_t slot) const {
    return chunks[slot / kChunkRows].get() + (slot % kChunkRows) * record_bytes;
  }
  static RowInfo& info_of(char* rec) { return *std::launder(reinterpret_cast<RowInfo*>(rec)); }
  static float* values_of(char* rec) { return reinterpret_cast<float*>(rec + sizeof(RowInfo)); }
  float* slot_ptr(uint32_t slot) { return values_of(record(slot)); }
  const float* slot_ptr(uint32_t slot) const { return reinterpret_cast<const float*>(record(slot) + sizeof(RowInfo)); }
  RowInfo& info(uint32_t slot) { return info_of(record(slot)); }
  const RowInfo& info(uint32_t slot) const { return *std::launder(reinterpret_cast<const RowInfo*>(record(slot))); }
  uint8_t& live(uint32_t slot) {
    return reinterpret_cast<uint8_t*>(chunks[slot / kChunkRows].get() + kChunkRows * record_bytes)[slot % kChunkRows];
  }
  uint8_t live(uint32_t slot) const {
    return reinterpret_cast<const uint8_t*>(chunks[slot / kChunkRows].get() + kChunkRows * record_bytes)[slot % kChunkRows];
  }
  int64_t capacity() const { return static_cast<int64_t>(chunks.size()) * kChunkRows; }

  Chunk new_chunk() const {
    Chunk c(static_cast<char*>(::operator new[](static_cast<size_t>(chunk_bytes()), std::align_val_t(kChunkAlign))));
    for (int64_t r = 0; r < kChunkRows; ++r) new (c.get() + r * record_bytes) RowInfo();
    std::memset(c.get() + kChunkRows * record_bytes, 0, static_cast<size_t>(kChunkRows));
    return c;
  }
  uint32_t allocate() {
    uint32_t slot;
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else {
      if (fresh == capacity()) {
        RATION_CHECK(capacity() + kChunkRows < (int64_t{1} << 32), "embedding table stripe is full (2^32 slots)");
        chunks.push_back(new_chunk());
      }
      slot = static_cast<uint32_t>(fresh++);
    }
    live(slot) = 1;
    return slot;
  }
  void release(uint32_t slot) {
    live(slot) = 0;
    info(slot) = RowInfo{};
    free_slots.push_back(slot);
  }
};

Table::~Table() = default;

Table::Table(TableOptions options) : options_(std::move(options)) {
  RATION_CHECK(options_.dim > 0 && options_.dim <= 65536, "embedding table '", options_.name, "': dim must be in ",
               "[1, 65536]; got ", options_.dim);
  state_ = state_floats(options_.optimizer.kind, options_.dim);
  stride_ = options_.dim + state_;
  const int64_t record = static_cast<int64_t>(sizeof(RowInfo)) + stride_ * static_cast<int64_t>(sizeof(float));
  for (int i = 0; i < kStripes; ++i) {
    stripes_.push_back(std::make_unique<Stripe>());
    stripes_.back()->record_bytes = (record + 7) / 8 * 8;
  }
  epoch_ = std::random_device{}() * 0x100000001ULL ^ mix64(reinterpret_cast<uintptr_t>(this));
}

Table::Stripe& Table::stripe_of(uint64_t id) const { return *stripes_[static_cast<size_t>(stripe_index(id))]; }

void Table::initial_value(uint64_t id, float* out) const {
  // A counter-based stream keyed by (seed, id): the value never depends on insertion order or shard.
  const uint64_t key = mix64(options_.seed ^ mix64(id));
  for (int64_t k = 0; k < options_.dim; ++k) {
    const uint64_t r = mix64(key + static_cast<uint64_t>(k));
    const float u = static_cast<float>(r >> 40) / static_cast<float>(1ULL << 24);  // [0, 1)
    out[k] = (2.0f * u - 1.0f) * options_.init_scale;
  }
}

namespace {
// Positions of a batch's ids grouped by stripe (counting sort, O(n + stripes)):
// order[begin[s] .. begin[s+1]) are stripe s's, in batch order.
template <int Stripes>
struct ByStripe {
  std::vector<uint32_t> order;
  std::array<uint32_t, Stripes + 1> begin{};
  template <typename StripeOf>
  ByStripe(const uint64_t* ids, int64_t n, StripeOf stripe_of) : order(static_cast<size_t>(n)) {
    RATION_CHECK(n < (int64_t{1} << 32), "embedding table batch of ", n, " ids; at most 2^32 - 1 per call");
    std::vector<uint8_t> s(static_cast<size_t>(n));
    static_assert(Stripes <= 256, "stripe numbers are kept in a byte");
    for (int64_t i = 0; i < n; ++i) {
      s[static_cast<size_t>(i)] = static_cast<uint8_t>(stripe_of(ids[i]));
      ++begin[s[static_cast<size_t>(i)] + 1u];
    }
    for (int k = 0; k < Stripes; ++k) begin[static_cast<size_t>(k) + 1] += begin[static_cast<size_t>(k)];
    std::array<uint32_t, Stripes> fill;
    std::copy(begin.begin(), begin.end() - 1, fill.begin());
    for (int64_t i = 0; i < n; ++i) order[fill[s[static_cast<size_t>(i)]]++] = static_cast<uint32_t>(i);
  }
};

// Prefetch distance (ids ahead) of a stripe group's index probes.
constexpr int64_t kProbeAhead = 8;
// A push's stripe group is looked up and then updated in parts of at most this many ids, so the records
// prefetched by the first pass are still in the core's cache when the second pass reaches them.
constexpr int64_t kMaxGroup = 256;

// Asks for the cache lines of [p, p + bytes), to be written (a record a push is about to update).
inline void prefetch_for_write(const char* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 1, 3);
}
}  // namespace

uint32_t Table::create_row(Stripe& st, uint64_t id) {
  const int64_t dim = options_.dim;
  const uint32_t slot = st.allocate();
  float* row = st.slot_ptr(slot);
  initial_value(id, row);
  init_state(options_.optimizer, dim, row, row + dim, state_);
  st.info(slot) = fresh_info(id);
  st.info(slot).version = version_.load(std::memory_order_relaxed);
  st.index.insert_or_assign(id, slot);
  return slot;
}

template <class Fn>
void Table::for_each_stripe_group(const uint64_t* ids, int64_t n, StripeOrder visit, Fn&& fn) {
  const ByStripe<kStripes> g(ids, n, [this](uint64_t id) { return stripe_index(id); });
  // Rotated: each call starts at its own stripe and first try_locks; a busy stripe is visited after the
  // others (blocking then), so concurrent batches seldom wait for each other. InOrder: stripe 0 first.
  // Successive calls start kStripes / 2 + 1 stripes apart (odd, so every start comes round): two
  // threads pushing at once walk half a table apart instead of one stripe behind the other.
  const int start = visit == StripeOrder::Rotated
                        ? static_cast<int>(rotor_.fetch_add(1, std::memory_order_relaxed) * (kStripes / 2 + 1) % kStripes)
                        : 0;
  std::array<int, kStripes> busy;
  int n_busy = 0;
  for (int k = 0; k < kStripes; ++k) {
    const int s = (start + k) % kStripes;
    const uint32_t b = g.begin[static_cast<size_t>(s)], e = g.begin[static_cast<size_t>(s) + 1];
    if (b == e) continue;
    Stripe& st = *stripes_[static_cast<size_t>(s)];
    if (visit == StripeOrder::Rotated) {
      std::unique_lock<std::mutex> lock(st.mu, std::try_to_lock);
      if (!lock.owns_lock()) {
        busy[static_cast<size_t>(n_busy++)] = s;
        continue;
      }
      fn(st, g.order.data() + b, static_cast<int64_t>(e - b));
    } else {
      std::lock_guard<std::mutex> lock(st.mu);
      fn(st, g.order.data() + b, static_cast<int64_t>(e - b));
    }
  }
  if (n_busy > 0) contended_.fetch_add(n_busy, std::memory_order_relaxed);
  for (int k = 0; k < n_busy; ++k) {
    const int s = busy[static_cast<size_t>(k)];
    const uint32_t b = g.begin[static_cast<size_t>(s)], e = g.begin[static_cast<size_t>(s) + 1];
    Stripe& st = *stripes_[static_cast<size_t>(s)];
    std::lock_guard<std::mutex> lock(st.mu);
    fn(st, g.order.data() + b, static_cast<int64_t>(e - b));
  }
}

template <class Fn>
void Table::for_each_by_stripe(const uint64_t* ids, int64_t n, Fn&& fn) {
  for_each_stripe_group(ids, n, StripeOrder::InOrder, [&](Stripe& st, const uint32_t* pos, int64_t m) {
    for (int64_t j = 0; j < m; ++j) fn(st, static_cast<int64_t>(pos[j]));
  });
}

void Table::pull(const uint64_t* ids, int64_t n, float* out, MissingRow missing) {
  const int64_t dim = options_.dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for_each_stripe_group(ids, n, StripeOrder::Rotated, [&](Stripe& st, const uint32_t* pos, int64_t m) {
    // The index probe of id j + kProbeAhead is prefetched while id j is looked up and copied. (Prefetching
    // the records too, and copying each 16 ids after its lookup, measured slower; docs/METHODS.md, "Store
    // layout and batch access".)
    for (int64_t j = 0; j < m; ++j) {
      if (j + kProbeAhead < m) st.index.prefetch(ids[pos[j + kProbeAhead]]);
      const uint64_t id = ids[pos[j]];
      float* dst = out + static_cast<int64_t>(pos[j]) * dim;
      auto it = st.index.find(id);
      if (it != st.index.end()) {
        std::memcpy(dst, st.slot_ptr(it->second), row_bytes);
      } else if (!st.disabled.empty() && st.disabled.contains(id)) {
        std::memset(dst, 0, row_bytes);
      } else if (missing == MissingRow::ReadDefault) {
        initial_value(id, dst);
      } else {
        std::memcpy(dst, st.slot_ptr(create_row(st, id)), row_bytes);
      }
    }
  });
}

template <OptimizerKind K>
void Table::push_as(const uint64_t* ids, int64_t n, const float* grads, int64_t step, int64_t version) {
  const int64_t dim = options_.dim;
  const OptimizerOptions& opt = options_.optimizer;
  const bool scored = decay_ > 0;
  const bool logging = logging_.load(std::memory_order_relaxed);
  std::vector<char*> recs(static_cast<size_t>(std::min<int64_t>(n, kMaxGroup)));
  for_each_stripe_group(ids, n, StripeOrder::Rotated, [&](Stripe& st, const uint32_t* pos, int64_t m) {
    const int64_t record_bytes = st.record_bytes;
    for (int64_t j0 = 0; j0 < m; j0 += kMaxGroup) {
      const int64_t m1 = std::min<int64_t>(m - j0, kMaxGroup);
      const uint32_t* p = pos + j0;
      // Pass 1, in batch order: find (or create, or count a disabled id's sighting) each row and prefetch
      // its record. Records never move while the stripe's lock is held, so the pointers stay valid.
      for (int64_t j = 0; j < m1; ++j) {
        if (j0 + j + kProbeAhead < m) st.index.prefetch(ids[p[j + kProbeAhead]]);
        char* rec = row_for_push(st, ids[p[j]]);
        if (rec != nullptr) prefetch_for_write(rec, record_bytes);
        recs[static_cast<size_t>(j)] = rec;
      }
      // Pass 2, in batch order: score, observe, update, stamp each row.
      for (int64_t j = 0; j < m1; ++j) {
        char* rec = recs[static_cast<size_t>(j)];
        if (rec == nullptr) continue;  // a disabled id below its re-admission count
        RowInfo& info = Stripe::info_of(rec);
        float* row = Stripe::values_of(rec);
        const float* g = grads + static_cast<int64_t>(p[j]) * dim;
        if (scored) {
          // Importance (docs/METHODS.md, "Importance"): s = |w . g| / dim with the values before the update.
          float dot = 0;
          for (int64_t k = 0; k < dim; ++k) dot += row[k] * g[k];
          info.score = importance_at(info, step) + (1.0f - decay_) * std::fabs(dot) / static_cast<float>(dim);
        }
        if (observer_) observer_(info, row, g, dim);
        apply_update<K>(opt, dim, row, row + dim, g);
        ++info.pushes;
        info.last_step = static_cast<int32_t>(step);
        if (info.first_step < 0) info.first_step = static_cast<int32_t>(step);
        // One log entry per row per call: a repeat of the id in this call finds it already at this version.
        const bool logged = info.version == version && info.pushes > 1;
        info.version = version;
        if (!logged && logging) log_change(st, info.id, version);
      }
    }
  });
}

char* Table::row_for_push(Stripe& st, uint64_t id) {
  auto it = st.index.find(id);
  if (it != st.index.end()) return st.record(it->second);
  auto d = st.disabled.find(id);
  if (d != st.disabled.end()) {
    // Disabled: the push counts as a sighting; re-admitted at readmit_after_ sightings.
    if (static_cast<int64_t>(++d->second.sightings) < readmit_after_) return nullptr;
    st.disabled.erase(d);
    readmitted_.fetch_add(1, std::memory_order_relaxed);
  }
  return st.record(create_row(st, id));
}

void Table::push(const uint64_t* ids, int64_t n, const float* grads, int64_t step) {
  std::shared_lock<std::shared_mutex> writing(write_mu_);
  const int64_t version = version_.fetch_add(1) + 1;
  switch (options_.optimizer.kind) {
    case OptimizerKind::Sgd: return push_as<OptimizerKind::Sgd>(ids, n, grads, step, version);
    case OptimizerKind::Adagrad: return push_as<OptimizerKind::Adagrad>(ids, n, grads, step, version);
    case OptimizerKind::Adam: return push_as<OptimizerKind::Adam>(ids, n, grads, step, version);
    case OptimizerKind::Ftrl: return push_as<OptimizerKind::Ftrl>(ids, n, grads, step, version);
  }
}

void Table::set_importance_decay(float decay) {
  RATION_CHECK(decay == 0 || (decay > 0 && decay < 1), "embedding table '", options_.name,
               "': importance decay must be in (0, 1) (or 0 for off); got ", decay);
  decay_ = decay;
}

float Table::importance_at(const RowInfo& info, int64_t step) const {
  if (info.last_step < 0 || decay_ <= 0) return info.score;
  const int64_t gap = std::max<int64_t>(0, step - info.last_step);
  return info.score * std::pow(decay_, static_cast<float>(gap));
}

void Table::set_readmit_after(int64_t sightings) {
  RATION_CHECK(sightings >= 1, "embedding table '", options_.name, "': re-admission count must be >= 1; got ",
               sightings);
  readmit_after_ = sightings;
}

void Table::score_rows(const std::function<float(const RowInfo&, const float*)>& score,
                       std::vector<ScoredId>& out) const {
  for (const auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    for (const auto& [id, slot] : sp->index) out.push_back({score(sp->info(slot), sp->slot_ptr(slot)), id});
  }
}

int64_t Table::disable(const uint64_t* ids, int64_t n) {
  std::shared_lock<std::shared_mutex> writing(write_mu_);
  const int64_t version = version_.fetch_add(1) + 1;
  const uint32_t round = disable_round_.fetch_add(1) + 1;
  int64_t freed = 0;
  std::vector<uint64_t> gone;
  for_each_by_stripe(ids, n, [&](Stripe& st, int64_t i) {
    auto it = st.index.find(ids[i]);
    if (it != st.index.end()) {
      st.release(it->second);
      st.index.erase(it);
      ++freed;
    }
    if (st.disabled.try_emplace(ids[i], Stripe::Disabled{0, round}).second) gone.push_back(ids[i]);
  });
  std::lock_guard<std::mutex> lock(tomb_mu_);
  for (uint64_t id : gone) tombstones_.emplace_back(id, version);
  while (static_cast<int64_t>(tombstones_.size()) > tombstone_limit_) {
    tombstone_floor_ = tombstones_.front().second;
    tombstones_.pop_front();
  }
  return freed;
}

int64_t Table::forget_disabled(int64_t keep) {
  RATION_CHECK(keep >= 0, "embedding table '", options_.name, "': forget_disabled keeps >= 0 ids; got ", keep);
  // Most sightings first, then a hash of the id: only state a snapshot keeps decides, so a restored
  // shard forgets exactly what the uninterrupted one would. The `keep` first selected in O(n).
  struct Entry {
    uint32_t sightings;
    uint64_t hash;
    uint64_t id;
  };
  std::vector<Entry> all;
  for (const auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    for (const auto& [id, d] : sp->disabled) all.push_back({d.sightings, mix64(id ^ 0x5DEECE66DULL), id});
  }
  if (static_cast<int64_t>(all.size()) <= keep) return 0;
  const auto first = [](const Entry& a, const Entry& b) {
    if (a.sightings != b.sightings) return a.sightings > b.sightings;
    return a.hash != b.hash ? a.hash < b.hash : a.id < b.id;
  };
  std::nth_element(all.begin(), all.begin() + keep, all.end(), first);
  std::vector<uint64_t> gone;
  gone.reserve(all.size() - static_cast<size_t>(keep));
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) gone.push_back(all[i].id);
  std::vector<Entry>().swap(all);
  int64_t forgotten = 0;
  for_each_by_stripe(gone.data(), static_cast<int64_t>(gone.size()),
                     [&](Stripe& st, int64_t i) { forgotten += static_cast<int64_t>(st.disabled.erase(gone[static_cast<size_t>(i)])); });
  for (auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    sp->disabled.rehash(0);
  }
  return forgotten;
}

bool Table::is_disabled(uint64_t id) const {
  const Stripe& st = stripe_of(id);
  std::lock_guard<std::mutex> lock(st.mu);
  return st.disabled.contains(id);
}

std::vector<uint64_t> Table::disabled_ids() const {
  std::vector<uint64_t> out;
  for (const auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    for (const auto& [id, n] : sp->disabled) out.push_back(id);
  }
  return out;
}

std::vector<std::pair<uint64_t, uint32_t>> Table::disabled_entries() const {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (const auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    for (const auto& [id, d] : sp->disabled) out.emplace_back(id, d.sightings);
  }
  return out;
}

void Table::restore_disabled(const uint64_t* ids, const uint32_t* sightings, int64_t n) {
  std::shared_lock<std::shared_mutex> writing(write_mu_);
  for_each_by_stripe(ids, n, [&](Stripe& st, int64_t i) {
    auto it = st.index.find(ids[i]);
    if (it != st.index.end()) {
      st.release(it->second);
      st.index.erase(it);
    }
    st.disabled[ids[i]] = Stripe::Disabled{sightings[i], 0};
  });
}

void Table::enable_change_log() {
  if (logging_.load(std::memory_order_acquire)) return;
  std::unique_lock<std::shared_mutex> settle(write_mu_);  // no write in flight: every later one is logged
  if (logging_.load(std::memory_order_relaxed)) return;
  log_floor_ = version_.load();
  logging_.store(true, std::memory_order_release);
}

void Table::log_change(Stripe& st, uint64_t id, int64_t version) {
  st.log.emplace_back(id, version);
  if (static_cast<int64_t>(st.log.size()) <= 2 * static_cast<int64_t>(st.index.size()) + 256) return;
  // Compact: keep each live row's latest entry (the one carrying its current version), in log order, so
  // the entries newer than any settled version still follow all older ones.
  size_t w = 0;
  for (size_t r = 0; r < st.log.size(); ++r) {
    const auto& [lid, lv] = st.log[r];
    auto it = st.index.find(lid);
    if (it == st.index.end() || st.info(it->second).version != lv) continue;
    st.log[w++] = st.log[r];
  }
  st.log.resize(w);
  st.log.shrink_to_fit();
  st.log_generation = (st.log_generation + 1) & ((1u << 22) - 1);
  if (st.log_generation == 0) st.log_generation = 1;
}

namespace {
// A log walk's cursor.slot: 0 = the stripe's start, else (generation << 40) | (position + 1).
constexpr int kLogPosBits = 40;
int64_t log_cursor(uint32_t generation, size_t pos) {
  return (static_cast<int64_t>(generation) << kLogPosBits) | static_cast<int64_t>(pos + 1);
}
}  // namespace

namespace {
void append_row(ExportedRows& out, uint64_t id, const RowInfo& info, const float* row, int64_t dim) {
  out.ids.push_back(id);
  out.values.insert(out.values.end(), row, row + dim);
  out.infos.push_back(info);
}
}  // namespace

template <class Walk>
void Table::walk_stripes(ExportCursor& cursor, int64_t max_rows, ExportedRows& out, Walk&& walk) const {
  const int64_t start = out.size();
  while (!cursor.done && out.size() - start < max_rows) {
    if (cursor.stripe >= kStripes) {
      cursor.done = true;
      break;
    }
    const Stripe& st = *stripes_[static_cast<size_t>(cursor.stripe)];
    std::lock_guard<std::mutex> lock(st.mu);
    if (walk(st, cursor.slot, max_rows - (out.size() - start), out) == StripeEnd::Finished) {
      ++cursor.stripe;
      cursor.slot = 0;
    }
  }
}

void Table::export_logged(int64_t from_version, int64_t to_version, ExportCursor& cursor, int64_t max_rows,
                          ExportedRows& out) const {
  const int64_t dim = options_.dim;
  walk_stripes(cursor, max_rows, out, [&](const Stripe& st, int64_t& slot, int64_t room, ExportedRows& rows) {
    size_t pos;
    const uint32_t gen = static_cast<uint32_t>(slot >> kLogPosBits);
    if (slot > 0 && gen == st.log_generation) {
      pos = static_cast<size_t>(slot & ((int64_t{1} << kLogPosBits) - 1)) - 1;
    } else {
      // Every entry newer than a settled version follows every older one (writers take their versions
      // under write_mu_ shared, settled_version() takes it exclusively), so the start is a partition point.
      pos = static_cast<size_t>(std::partition_point(st.log.begin(), st.log.end(),
                                                     [&](const std::pair<uint64_t, int64_t>& e) {
                                                       return e.second <= from_version;
                                                     }) - st.log.begin());
    }
    size_t end = st.log.size();
    int64_t taken = 0;
    for (; pos < end && taken < room; ++pos) {
      const auto& [id, v] = st.log[pos];
      if (v > to_version) {  // the entries after a settled version all follow it: this stripe is done
        end = pos;
        break;
      }
      auto it = st.index.find(id);
      if (it == st.index.end()) continue;  // freed since (erase, disable: a tombstone says so)
      const RowInfo& info = st.info(it->second);
      if (info.version != v) continue;     // changed again: a later entry carries it
      append_row(rows, id, info, st.slot_ptr(it->second), dim);
      ++taken;
    }
    if (pos >= end) return StripeEnd::Finished;
    slot = log_cursor(st.log_generation, pos);
    return StripeEnd::Paused;
  });
}

int64_t Table::settled_version() const {
  std::unique_lock<std::shared_mutex> settle(write_mu_);
  return version_.load();
}

// The slot walk for both full exports: rows whose version is above `newer_than`, with or without their
// optimiser state, resuming at `cursor`.
void Table::export_rows(int64_t newer_than, RowState state, ExportCursor& cursor, int64_t max_rows,
                        ExportedRows& out) const {
  const int64_t dim = options_.dim;
  walk_stripes(cursor, max_rows, out, [&](const Stripe& st, int64_t& slot, int64_t room, ExportedRows& rows) {
    int64_t taken = 0;
    for (; slot < st.capacity() && taken < room; ++slot) {
      const uint32_t s = static_cast<uint32_t>(slot);
      if (!st.live(s) || st.info(s).version <= newer_than) continue;
      const float* row = st.slot_ptr(s);
      append_row(rows, st.info(s).id, st.info(s), row, dim);
      if (state == RowState::Included) rows.state.insert(rows.state.end(), row + dim, row + dim + state_);
      ++taken;
    }
    return slot >= st.capacity() ? StripeEnd::Finished : StripeEnd::Paused;
  });
}

void Table::export_changed(int64_t from_version, ExportCursor& cursor, int64_t max_rows, ExportedRows& out,
                           int64_t to_version) const {
  if (from_version >= 0 && logging_.load(std::memory_order_acquire) && from_version >= log_floor_) {
    export_logged(from_version, to_version, cursor, max_rows, out);
    return;
  }
  export_rows(from_version, RowState::Omitted, cursor, max_rows, out);
}

bool Table::tombstones_since(int64_t from_version, std::vector<std::pair<uint64_t, int64_t>>& out) const {
  std::lock_guard<std::mutex> lock(tomb_mu_);
  if (from_version < tombstone_floor_) return false;
  auto it = std::upper_bound(tombstones_.begin(), tombstones_.end(), from_version,
                             [](int64_t v, const std::pair<uint64_t, int64_t>& t) { return v < t.second; });
  out.insert(out.end(), it, tombstones_.end());
  return true;
}

void Table::set_tombstone_limit(int64_t limit) {
  RATION_CHECK(limit >= 0, "embedding table '", options_.name, "': tombstone limit must be >= 0");
  std::lock_guard<std::mutex> lock(tomb_mu_);
  tombstone_limit_ = limit;
  while (static_cast<int64_t>(tombstones_.size()) > tombstone_limit_) {
    tombstone_floor_ = tombstones_.front().second;
    tombstones_.pop_front();
  }
}

int64_t Table::find_or_insert(const uint64_t* ids, int64_t n) {
  int64_t created = 0;
  for (int64_t i = 0; i < n; ++i) {
    Stripe& st = stripe_of(ids[i]);
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.index.contains(ids[i])) continue;
    create_row(st, ids[i]);
    ++created;
  }
  return created;
}

void Table::assign(const uint64_t* ids, int64_t n, const float* values, const float* state, const RowInfo* infos) {
  const int64_t dim = options_.dim;
  std::shared_lock<std::shared_mutex> writing(write_mu_);
  const int64_t version = version_.fetch_add(1) + 1;
  for (int64_t i = 0; i < n; ++i) {
    Stripe& st = stripe_of(ids[i]);
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.disabled.empty()) st.disabled.erase(ids[i]);
    auto [it, inserted] = st.index.try_emplace(ids[i], 0);
    if (inserted) it->second = st.allocate();
    const int64_t before = inserted ? -1 : st.info(it->second).version;
    float* row = st.slot_ptr(it->second);
    std::memcpy(row, values + i * dim, static_cast<size_t>(dim) * sizeof(float));
    if (state != nullptr) std::memcpy(row + dim, state + i * state_, static_cast<size_t>(state_) * sizeof(float));
    else if (inserted) init_state(options_.optimizer, dim, row, row + dim, state_);
    if (infos != nullptr) st.info(it->second) = infos[i];
    else if (inserted) st.info(it->second) = fresh_info(ids[i]);
    st.info(it->second).id = ids[i];
    if (infos == nullptr || infos[i].version == 0) st.info(it->second).version = version;
    // Logged when this call gave the row its version (not for rows assigned with a version of their own,
    // as a restore does, nor for a repeat of the id in this call).
    if (st.info(it->second).version == version && before != version && logging_.load(std::memory_order_relaxed))
      log_change(st, ids[i], version);
  }
}

int64_t Table::erase_if(const std::function<bool(const RowInfo&)>& pred) {
  int64_t freed = 0;
  for (auto& sp : stripes_) {
    Stripe& st = *sp;
    std::lock_guard<std::mutex> lock(st.mu);
    for (auto it = st.index.begin(); it != st.index.end();) {
      if (pred(st.info(it->second))) {
        st.release(it->second);
        st.index.erase(it++);
        ++freed;
      } else {
        ++it;
      }
    }
  }
  return freed;
}

int64_t Table::erase(const uint64_t* ids, int64_t n) {
  int64_t freed = 0;
  for (int64_t i = 0; i < n; ++i) {
    Stripe& st = stripe_of(ids[i]);
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.index.find(ids[i]);
    if (it == st.index.end()) continue;
    st.release(it->second);
    st.index.erase(it);
    ++freed;
  }
  return freed;
}

int64_t Table::compact() {
  int64_t released = 0;
  for (auto& sp : stripes_) {
    Stripe& st = *sp;
    std::lock_guard<std::mutex> lock(st.mu);
    const int64_t live_rows = static_cast<int64_t>(st.index.size());
    const int64_t keep_chunks = (live_rows + kChunkRows - 1) / kChunkRows;
    const int64_t keep_slots = keep_chunks * kChunkRows;
    if (keep_chunks == static_cast<int64_t>(st.chunks.size())) {
      // Nothing to release, but the indexes and the free list are brought to the size their contents
      // need, so the accounted bytes depend on what the table holds, not on its history (a table restored
      // from a snapshot then measures the same as the one that wrote it: eviction cuts are repeatable).
      st.index.rehash(0);
      st.disabled.rehash(0);
      st.free_slots.shrink_to_fit();
      continue;
    }
    // Free slots below the cut, lowest first; live rows above it move there.
    std::vector<uint32_t> holes;
    for (int64_t s = 0; s < keep_slots; ++s)
      if (!st.live(static_cast<uint32_t>(s))) holes.push_back(static_cast<uint32_t>(s));
    size_t h = 0;
    for (int64_t s = keep_slots; s < st.capacity(); ++s) {
      const uint32_t from = static_cast<uint32_t>(s);
      if (!st.live(from)) continue;
      const uint32_t to = holes.at(h++);
      std::memcpy(st.record(to), st.record(from), static_cast<size_t>(st.record_bytes));  // RowInfo too
      st.live(to) = 1;
      st.index[st.info(to).id] = to;
    }
    released += (static_cast<int64_t>(st.chunks.size()) - keep_chunks) * st.chunk_bytes();
    st.chunks.resize(static_cast<size_t>(keep_chunks));
    st.chunks.shrink_to_fit();
    st.free_slots.clear();
    for (int64_t s = keep_slots - 1; s >= 0; --s)
      if (!st.live(static_cast<uint32_t>(s))) st.free_slots.push_back(static_cast<uint32_t>(s));
    st.free_slots.shrink_to_fit();
    st.fresh = keep_slots;
    // The indexes shrink too (absl rehash(0) sizes them to their contents).
    st.index.rehash(0);
    st.disabled.rehash(0);
  }
  // Hand the freed chunks back to the operating system (glibc keeps small frees in its heap otherwise).
  if (released > 0) malloc_trim(0);
  return released;
}

void Table::export_batch(ExportCursor& cursor, int64_t max_rows, ExportedRows& out) const {
  export_rows(std::numeric_limits<int64_t>::min(), RowState::Included, cursor, max_rows, out);
}

void Table::set_push_observer(PushObserver observer) { observer_ = std::move(observer); }

bool Table::contains(uint64_t id) const {
  const Stripe& st = stripe_of(id);
  std::lock_guard<std::mutex> lock(st.mu);
  return st.index.contains(id);
}

int64_t Table::admission_bytes(const uint64_t* ids, int64_t n, bool disabled_too, int64_t* absent) const {
  using Slot = std::pair<const uint64_t, uint32_t>;
  std::vector<std::vector<uint64_t>> by_stripe(kStripes);
  for (int64_t i = 0; i < n; ++i) by_stripe[static_cast<size_t>(stripe_index(ids[i]))].push_back(ids[i]);
  int64_t bytes = 0, total = 0;
  for (int s = 0; s < kStripes; ++s) {
    std::vector<uint64_t>& v = by_stripe[static_cast<size_t>(s)];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    const Stripe& st = *stripes_[static_cast<size_t>(s)];
    std::lock_guard<std::mutex> lock(st.mu);
    int64_t k = 0;
    for (uint64_t id : v) k += !st.index.contains(id) && (disabled_too || !st.disabled.contains(id));
    total += k;
    if (k == 0) continue;
    // Records: free slots first, then whole new chunks.
    const int64_t size = static_cast<int64_t>(st.index.size());
    const int64_t beyond = std::max<int64_t>(0, k - (st.capacity() - size));
    bytes += (beyond + kChunkRows - 1) / kChunkRows * st.chunk_bytes();
    // The index grows (capacity 2c+1) past 7/8 load, or earlier (at 25/32 of that) when erased rows left
    // tombstones: assume the earlier, so the bound holds.
    const int64_t cap = static_cast<int64_t>(st.index.capacity());
    int64_t grown = cap;
    while (grown == 0 || (size + k) * 32 > (grown - grown / 8) * 25) grown = grown * 2 + 1;
    if (grown != cap) bytes += (grown - cap) * static_cast<int64_t>(sizeof(Slot) + 1) + (cap == 0 ? 16 : 0);
  }
  if (absent != nullptr) *absent = total;
  return bytes;
}

int64_t Table::size() const {
  int64_t n = 0;
  for (const auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    n += static_cast<int64_t>(sp->index.size());
  }
  return n;
}

TableBytes Table::bytes() const {
  TableBytes b;
  using Slot = std::pair<const uint64_t, uint32_t>;
  for (const auto& sp : stripes_) {
    std::lock_guard<std::mutex> lock(sp->mu);
    b.rows += static_cast<int64_t>(sp->index.size());
    // A chunk's bytes split in two: each record's values and state (arena), and each record's RowInfo
    // and alignment padding plus its live flag (meta); the two add up to the chunks allocated.
    // (The free list, fewer than kChunkRows entries per stripe after compact(), is not counted: its
    // size depends on the table's history, and the bytes must not — see compact().)
    const int64_t row_bytes = stride_ * static_cast<int64_t>(sizeof(float));
    b.arena_bytes += sp->capacity() * row_bytes;
    b.meta_bytes += static_cast<int64_t>(sp->chunks.size()) * sp->chunk_bytes() - sp->capacity() * row_bytes;
    // flat_hash_map: one slot plus one control byte per bucket (and a group of trailing control bytes).
    const int64_t cap = static_cast<int64_t>(sp->index.capacity());
    b.index_bytes += cap == 0 ? 0 : cap * static_cast<int64_t>(sizeof(Slot) + 1) + 16;
    b.disabled += static_cast<int64_t>(sp->disabled.size());
    const int64_t dcap = static_cast<int64_t>(sp->disabled.capacity());
    using DisabledSlot = std::pair<const uint64_t, Stripe::Disabled>;
    b.disabled_bytes += dcap == 0 ? 0 : dcap * static_cast<int64_t>(sizeof(DisabledSlot) + 1) + 16;
    b.log_bytes += static_cast<int64_t>(sp->log.capacity() * sizeof(sp->log[0]));
  }
  b.value_bytes = b.rows * options_.dim * static_cast<int64_t>(sizeof(float));
  b.state_bytes = b.rows * state_ * static_cast<int64_t>(sizeof(float));
  return b;
}

// ---- store --------------------------------------------------------------------------------------------
Table& EmbeddingStore::ensure_table(const TableOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(options.name);
  if (it != tables_.end()) {
    const TableOptions& have = it->second->options();
    RATION_CHECK(have.dim == options.dim && have.optimizer.kind == options.optimizer.kind,
                 "embedding table '", options.name, "' exists with dim ", have.dim, " and optimiser ",
                 optimizer_kind_name(have.optimizer.kind), "; asked for dim ", options.dim, " and ",
                 optimizer_kind_name(options.optimizer.kind));
    return *it->second;
  }
  RATION_CHECK(!options.name.empty(), "embedding table needs a name");
  auto [ins, ok] = tables_.emplace(options.name, std::make_unique<Table>(options));
  return *ins->second;
}

Table* EmbeddingStore::find(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second.get();
}

const Table* EmbeddingStore::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second.get();
}

std::vector<std::string> EmbeddingStore::table_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [n, t] : tables_) names.push_back(n);
  return names;
}

Table& EmbeddingStore::table(const std::string& name) {
  Table* t = find(name);
  if (t == nullptr) {
    std::string known;
    for (const auto& n : table_names()) known += (known.empty() ? "" : ", ") + n;
    RATION_CHECK(false, "unknown embedding table '", name, "'; this store holds: ",
                 known.empty() ? std::string("(none)") : known);
  }
  return *t;
}

void EmbeddingStore::replace_tables(EmbeddingStore&& other) {
  std::scoped_lock lock(mu_, other.mu_);
  tables_.swap(other.tables_);
}

StoreStats EmbeddingStore::stats() const {
  StoreStats s;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [n, t] : tables_) {
    TableBytes b = t->bytes();
    s.rows += b.rows;
    s.bytes += b.total();
    s.tables[n] = b;
  }
  return s;
}

}  // namespace ration::ps
