#include "ration/plan/incremental.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "ration/base/check.h"
#include "ration/plan/simulator.h"

namespace ration::memory {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max() / 4;
constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
constexpr int kNeverUsable = -2;   // a value no backward saves: always rebuilt when needed
constexpr size_t kLongStep = 16;   // storages a step touches from which a release's extension is priced apart
constexpr char kSameLists = 1, kSameTouched = 2;  // commit's same_
constexpr int kSeveral = -1, kPlaced = -2;         // commit's Move::entry
constexpr uint32_t kNotGroup = std::numeric_limits<uint32_t>::max();  // touch_epoch_ of a storage of no group

using State = IncrementalPeak::State;
bool holding(State s) { return s == State::Kept || s == State::Restored; }
// Two runs agree on a key from here on when it is usable-and-holding in both, or in the same other state.
int norm(State s) { return holding(s) ? 0 : s == State::Dropped ? 1 : 2; }

// A step's touch of a storage (touched_at_) and a storage's touch at a step (touches_) are one integer
// each: the storage or step times two, plus one where the step first consulted the storage as the output
// of a node it re-runs. Entries of one storage sort by step.
template <class I>
I touch_entry(I id, bool as_output) { return 2 * id + (as_output ? 1 : 0); }
template <class I>
I touch_id(I entry) { return static_cast<I>(static_cast<std::make_unsigned_t<I>>(entry) >> 1); }  // entries are >= 0
template <class I>
bool touch_as_output(I entry) { return (entry & 1) != 0; }

// [l, r] of n values kept in blocks of kB: part(b, from, to) for each block the range covers in part, then
// whole(first, last) for the blocks it covers whole (the last block is whole once r is the last value).
template <class Part, class Whole>
void split_blocks(size_t l, size_t r, size_t n, size_t kB, Part part, Whole whole) {
  size_t bl = l / kB, br = r / kB;
  const bool head_whole = l % kB == 0, tail_whole = r % kB == kB - 1 || r == n - 1;
  if (bl == br) {
    if (head_whole && tail_whole) whole(bl, br);
    else part(bl, l, r);
    return;
  }
  if (!head_whole) {
    part(bl, l, bl * kB + kB - 1);
    ++bl;
  }
  if (!tail_whole) {  // br > 0: l and r lie in different blocks
    part(br, br * kB, r);
    --br;
  }
  if (bl <= br) whole(bl, br);
}

}  // namespace

// ---- range max / Fenwick ----------------------------------------------------------------------------
// Value i lives in block i / kBlock; its value is val[i] plus the block's offset (the adds at the block's
// leaf and its ancestors). A tree node's pending add stays at the node (never pushed down): mx[i] is the
// maximum of its subtree with the adds at i and below. So max() only reads (no writes into lines other
// evaluations share), an add covering whole blocks updates O(log n) tree nodes, and a partial block is
// one cache line of values. The tree over blocks is an eighth of a tree over values: at a few thousand
// steps it stays in the cache next to the other per-step data.
void IncrementalPeak::Tree::init(const std::vector<int64_t>& v) {
  n = v.size();
  blocks = (n + kBlock - 1) / kBlock;
  size = 1;
  while (size < std::max<size_t>(blocks, 1)) size <<= 1;
  val.assign(blocks * kBlock, kNone);  // padding stays kNone: never part of a range, never a block's max
  std::copy(v.begin(), v.end(), val.begin());
  mx.assign(2 * size, kNone);
  add_at.assign(2 * size, 0);
  for (size_t b = 0; b < blocks; ++b) mx[size + b] = scan(b * kBlock, b * kBlock + kBlock - 1);
  for (size_t i = size; i-- > 1;) mx[i] = std::max(mx[2 * i], mx[2 * i + 1]);
}

int64_t IncrementalPeak::Tree::scan(size_t l, size_t r) const {
  int64_t m = kNone;
  for (size_t i = l; i <= r; ++i) m = std::max(m, val[i]);
  return m;
}

int64_t IncrementalPeak::Tree::offset(size_t b) const {
  int64_t o = 0;
  for (size_t a = size + b; a >= 1; a >>= 1) o += add_at[a];
  return o;
}

void IncrementalPeak::Tree::pull(size_t i) {
  for (i >>= 1; i >= 1; i >>= 1) {
    const int64_t m = std::max(mx[2 * i], mx[2 * i + 1]);
    mx[i] = m == kNone ? kNone : m + add_at[i];  // a subtree of padding leaves stays empty
  }
}

void IncrementalPeak::Tree::refresh(size_t b) {
  const size_t leaf = size + b;
  const int64_t m = scan(b * kBlock, b * kBlock + kBlock - 1);
  mx[leaf] = m == kNone ? kNone : m + add_at[leaf];
  pull(leaf);
}

void IncrementalPeak::Tree::add(size_t l, size_t r, int64_t delta) {
  if (l > r || r >= n || delta == 0) return;
  auto part = [&](size_t b, size_t from, size_t to) {
    for (size_t i = from; i <= to; ++i) val[i] += delta;
    refresh(b);
  };
  auto whole = [&](size_t bl, size_t br) {
    size_t lo = bl + size, hi = br + size + 1;  // half-open over leaves
    auto apply = [&](size_t i) {
      mx[i] += delta;
      add_at[i] += delta;
    };
    for (; lo < hi; lo >>= 1, hi >>= 1) {
      if (lo & 1) apply(lo++);
      if (hi & 1) apply(--hi);
    }
    pull(bl + size);
    pull(br + size);
  };
  split_blocks(l, r, n, kBlock, part, whole);
}

void IncrementalPeak::Tree::assign(size_t i, int64_t value) {
  const size_t b = i / kBlock;
  val[i] = value - offset(b);
  refresh(b);
}

// Bottom-up over the O(log n) tree nodes covering blocks [l, r]. Each side's running maximum is kept
// relative to the level reached: moving up, its nodes all lie under one node of the new level (left: the
// one before `lo`, right: `hi`), whose add is added; at the end the adds of those nodes' ancestors are.
int64_t IncrementalPeak::Tree::blocks_max(size_t l, size_t r) const {
  if (l == 0 && r + 1 == blocks) return mx[1];
  size_t lo = l + size, hi = r + size + 1;
  int64_t left = kNone, right = kNone;
  while (lo < hi) {
    if (lo & 1) left = std::max(left, mx[lo++]);
    if (hi & 1) right = std::max(right, mx[--hi]);
    lo >>= 1;
    hi >>= 1;
    if (left != kNone) left += add_at[lo - 1];
    if (right != kNone && hi < size) right += add_at[hi];
  }
  for (size_t a = lo - 1; left != kNone && a > 1;) left += add_at[a >>= 1];
  for (size_t a = hi; right != kNone && a > 1;) right += add_at[a >>= 1];
  return std::max(left, right);
}

int64_t IncrementalPeak::Tree::max(size_t l, size_t r) const {
  if (l > r || r >= n) return kNone;
  int64_t m = kNone;
  split_blocks(
      l, r, n, kBlock, [&](size_t b, size_t from, size_t to) { m = std::max(m, scan(from, to) + offset(b)); },
      [&](size_t bl, size_t br) { m = std::max(m, blocks_max(bl, br)); });
  return m;
}

// From the root down, right child first: a node's maximum less its own add is its children's larger one.
size_t IncrementalPeak::Tree::last_argmax() const {
  size_t i = 1;
  while (i < size) {
    const int64_t want = mx[i] - add_at[i];
    i = mx[2 * i + 1] == want ? 2 * i + 1 : 2 * i;
  }
  const size_t b = i - size;
  const int64_t want = mx[i] - add_at[i];
  for (size_t v = b * kBlock + kBlock; v-- > b * kBlock;)
    if (val[v] == want) return v;
  return b * kBlock;
}

void IncrementalPeak::Fenwick::init(const std::vector<int64_t>& v) {
  n = v.size();
  val = v;
  t.assign((n + Tree::kBlock - 1) / Tree::kBlock + 1, 0);
}
void IncrementalPeak::Fenwick::add(size_t l, size_t r, int64_t delta) {
  if (l > r || r >= n || delta == 0) return;
  auto bump = [&](size_t b, int64_t d) {  // blocks b.. get d
    for (++b; b < t.size(); b += b & (~b + 1)) t[b] += d;
  };
  split_blocks(
      l, r, n, Tree::kBlock,
      [&](size_t, size_t from, size_t to) {
        for (size_t i = from; i <= to; ++i) val[i] += delta;
      },
      [&](size_t bl, size_t br) {
        bump(bl, delta);
        bump(br + 1, -delta);
      });
}
int64_t IncrementalPeak::Fenwick::at(size_t i) const {
  int64_t s = val[i];
  for (size_t b = i / Tree::kBlock + 1; b > 0; b -= b & (~b + 1)) s += t[b];
  return s;
}

// ---- one backward step, as Simulator::run does it (no transient re-runs, no offload) ----------------
// `St` reads and writes key states: the whole run's (build) or an overlay on the committed plan (evaluate).
template <class St>
struct StepRun {
  const plan_detail::Lists<int>& nodes;  // by node: its record
  const plan_detail::Lists<int>& storage_keys;
  const std::vector<plan_detail::KeyRecord>& keys;
  const std::vector<int64_t>& bytes;
  std::vector<plan_detail::NodeMark>& marks;  // by node, plus one: run mark and record offset
  std::vector<uint32_t>& transient_epoch;
  uint32_t cache_stamp, transient_stamp;
  St& st;
  int64_t& resident;
  std::vector<int>& touched;
  std::vector<int>& restored;
  std::vector<uint32_t>& touch_epoch;  // by storage: == cache_stamp once this step listed it; kNotGroup
                                       // for a storage of no group (never listed)
  const std::vector<char>& sole_key;     // by key: the only key of its group storage
  int64_t transient_bytes = 0, recompute_peak = 0;
  // Early stop (IncrementalPeak::peak_if's stop_at): once the recompute peak reaches this the step's
  // value reaches the caller's threshold, so the rest of the re-run cascade is not simulated.
  int64_t stop_recompute_at = std::numeric_limits<int64_t>::max();
  bool stopped = false;
  // IncrementalPeak::watch_reads: this step's index, and whether a re-run read a value of storage s before
  // step (*held_from)[s].
  const std::vector<int64_t>* held_from = nullptr;
  int64_t step = 0;
  bool read_early = false;

  // `k`: a key, or kNeverUsable (inputs no node produces are not in the records).
  bool usable(int k) {
    if (k == kNeverUsable) return false;
    if (keys[static_cast<size_t>(k)].producer < 0) return true;
    return holding(st.get(k));
  }
  // `as_output`: consulted as the output of a node this step re-runs (not as an input or a saved value).
  void touch(int k, bool as_output = false) {
    if (k < 0) return;
    const int s = keys[static_cast<size_t>(k)].storage;
    // Each group storage once per step: a re-run cascade consults a value as its producer's output and
    // again as its consumer's input, and only whether a step touches a storage matters.
    if (s < 0) return;
    uint32_t& listed = touch_epoch[static_cast<size_t>(s)];
    if (listed == cache_stamp || listed == kNotGroup) return;
    listed = cache_stamp;
    touched.push_back(touch_entry(s, as_output));
  }
  bool held(int s) {
    for (int k : storage_keys[static_cast<size_t>(s)])
      if (holding(st.get(k))) return true;
    return false;
  }
  // Whether group storage s, holding key k, is held by another of its keys (k is dropped or released).
  bool held_without(int k, int s) { return !sole_key[static_cast<size_t>(k)] && held(s); }
  void rerun(int64_t ord) {
    const auto o = static_cast<size_t>(ord);
    plan_detail::NodeMark& mark = marks[o];
    if (mark.epoch == cache_stamp) return;
    mark.epoch = cache_stamp;
    const auto node = plan_detail::node_record(nodes, marks, o);
    for (size_t i = 0; i < node.inputs(); ++i) {
      const int in = node.input(i);
      touch(in);
      if (held_from != nullptr && in >= 0) {
        const int s = keys[static_cast<size_t>(in)].storage;
        read_early = read_early || (s >= 0 && step < (*held_from)[static_cast<size_t>(s)]);
      }
      if (!usable(in)) rerun(node.producer(i));
      if (stopped) return;
    }
    for (const int* a = node.alloc_begin(); a != node.alloc_end(); ++a) {
      const auto s = static_cast<size_t>(*a);
      if (transient_epoch[s] == transient_stamp) continue;
      transient_epoch[s] = transient_stamp;
      transient_bytes += bytes[s];
    }
    recompute_peak = std::max(recompute_peak, resident + transient_bytes + node.workspace());
    if (recompute_peak >= stop_recompute_at) {
      stopped = true;
      return;
    }
    for (size_t j = 0; j < node.outputs(); ++j) {
      const int k = node.output(j);
      touch(k, true);
      if (k < 0 || st.get(k) != State::Dropped) continue;
      const int s = node.out_storage(j);
      const bool was_held = s >= 0 && held_without(k, s);
      st.set(k, State::Restored);
      restored.push_back(k);
      if (s < 0) continue;
      if (!was_held) resident += bytes[static_cast<size_t>(s)];
      if (transient_epoch[static_cast<size_t>(s)] == transient_stamp) {
        transient_epoch[static_cast<size_t>(s)] = 0;
        transient_bytes -= bytes[static_cast<size_t>(s)];
      }
    }
  }
};


IncrementalPeak::Static::Static(std::shared_ptr<const PlanGraph> graph, const std::vector<Group>& groups, int64_t extra)
    : graph_(std::move(graph)), g_(*graph_), extra_(extra) {
  const PlanGraph& g = g_;
  nn_ = g.nodes;
  nb_ = g.steps;
  // Steps and nodes are 32-bit in the key records (a kNoStep above every step).
  RATION_ASSERT(nb_ < (size_t{1} << 29) && nn_ < (size_t{1} << 31), "incremental peak: too many backward steps or nodes");
  const size_t ns = g.storages;
  bytes_.resize(ns);
  for (size_t s = 0; s < ns; ++s) bytes_[s] = g.profile.storages[s].bytes;
  is_group_.assign(ns, 0);
  for (const auto& gr : groups) {
    const auto s = static_cast<size_t>(gr.storage);
    storage_of_group_.push_back(static_cast<int>(s));
    is_group_[s] = 1;
  }
  const std::vector<int> key_of = number_keys();
  std::vector<int64_t> pending(nk_, 0);
  const Lists<int> node_saved = build_node_records(key_of, pending);
  set_release_steps(node_saved, pending);
  find_restored_by_producer();
  extension_bound_ = restores_follow_allocations();
  {
    std::vector<std::pair<size_t, int64_t>> by_storage;  // in step order: each storage's list ascends
    for (size_t j = 0; j < nb_; ++j)
      for (int k : released_at_[j]) by_storage.emplace_back(static_cast<size_t>(keys_[static_cast<size_t>(k)].storage), static_cast<int64_t>(j));
    release_steps_ = Lists<int64_t>::grouped(ns, by_storage);
  }
  measure_other();
  // Forward: a recomputed group is freed after the last forward node that needs it.
  const std::vector<int64_t>& saved_at = save_span(g).saved_at;
  forward_release_.assign(ns, kNever);
  for (size_t s = 0; s < ns; ++s)
    if (is_group_[s]) forward_release_[s] = std::max(g.last_alive[s], saved_at[s]);
}

// Keys: every saved value, numbered in first-saved order (the result: by graph value, -1 not saved).
std::vector<int> IncrementalPeak::Static::number_keys() {
  const PlanGraph& g = g_;
  std::vector<int> key_of(g.values(), -1);
  for (size_t o = 0; o < nn_; ++o) {
    for (int v : g.saved[o]) {
      RATION_ASSERT(v >= 0, "incremental peak: a saved value of node ", o, " is not an output of its node");
      if (key_of[static_cast<size_t>(v)] >= 0) continue;
      key_of[static_cast<size_t>(v)] = static_cast<int>(nk_++);
      plan_detail::KeyRecord key;
      key.storage = g.storage[static_cast<size_t>(v)];
      key.producer = static_cast<int32_t>(g.is_leaf(v) ? g.leaves[static_cast<size_t>(v)].producer : g.producer(v));
      keys_.push_back(key);
    }
  }
  std::vector<std::pair<size_t, int>> by_storage;
  for (size_t k = 0; k < nk_; ++k)
    if (keys_[k].storage >= 0) by_storage.emplace_back(static_cast<size_t>(keys_[k].storage), static_cast<int>(k));
  storage_keys_ = Lists<int>::grouped(g.storages, by_storage);
  return key_of;
}

plan_detail::Lists<int> IncrementalPeak::Static::build_node_records(const std::vector<int>& key_of,
                                                                    std::vector<int64_t>& pending) {
  const PlanGraph& g = g_;
  Lists<int> node_saved;  // by node: key ids of saved values (pinned left out)
  for (size_t o = 0; o < nn_; ++o) {
    const auto workspace = static_cast<uint64_t>(std::max<int64_t>(0, g.peak_bytes[o] - g.end_bytes[o]));
    // Inputs no node produces (leaves, constants: always usable) and outputs no backward saves are left
    // out: a walk does nothing with them, and at thousands of nodes the records are read once per re-run.
    // The two counts are written once the lists are.
    const size_t counts = nodes_.items.size();
    nodes_.add(0);
    nodes_.add(0);
    nodes_.add(static_cast<int>(static_cast<uint32_t>(workspace)));
    nodes_.add(static_cast<int>(static_cast<uint32_t>(workspace >> 32)));
    for (const auto& in : g.inputs[o]) {
      if (in.producer < 0) continue;
      const int k = in.value < 0 ? -1 : key_of[static_cast<size_t>(in.value)];
      nodes_.add(k < 0 ? kNeverUsable : k);
      nodes_.add(in.producer);
      ++nodes_.items[counts];
    }
    for (size_t v = g.first_output(o); v < g.first_output(o + 1); ++v) {
      if (key_of[v] < 0) continue;
      nodes_.add(key_of[v]);
      nodes_.add(g.storage[v]);
      ++nodes_.items[counts + 1];
    }
    for (int st : g.allocated[o]) nodes_.add(st);
    nodes_.close();
    for (int v : g.saved[o]) {
      const int k = key_of[static_cast<size_t>(v)];
      node_saved.add(k);
      ++pending[static_cast<size_t>(k)];
    }
    node_saved.close();
  }
  return node_saved;
}

// Release: after the backward step of a key's last pending use (keys without a storage never are).
void IncrementalPeak::Static::set_release_steps(const Lists<int>& node_saved, std::vector<int64_t>& pending) {
  for (size_t j = 0; j < nb_; ++j) {
    for (int k : node_saved[static_cast<size_t>(g_.profile.backward_order[j])]) {
      saved_at_.add(k);
      if (--pending[static_cast<size_t>(k)] != 0 || keys_[static_cast<size_t>(k)].storage < 0) continue;
      keys_[static_cast<size_t>(k)].release = static_cast<int32_t>(j);
      released_at_.add(k);
    }
    released_at_.close();
    saved_at_.close();
  }
}

// A storage whose keys are all outputs of one node that allocates it: re-running that node restores
// the whole storage (evaluate's shortcut for a release consulted first as such an output).
void IncrementalPeak::Static::find_restored_by_producer() {
  const size_t ns = g_.storages;
  sole_key_.assign(nk_, 0);
  for (size_t st = 0; st < ns; ++st)
    if (is_group_[st] && storage_keys_[st].size() == 1) sole_key_[static_cast<size_t>(storage_keys_[st][0])] = 1;
  restored_by_producer_.assign(ns, 0);
  for (size_t st = 0; st < ns; ++st) {
    const auto keys = storage_keys_[st];
    if (!is_group_[st] || keys.empty()) continue;
    const int64_t producer = keys_[static_cast<size_t>(keys.front())].producer;
    if (producer < 0) continue;
    const auto node = plan_detail::NodeRecord::of(nodes_, static_cast<size_t>(producer));
    bool all = true;
    for (int k : keys) {
      bool found = false;
      for (size_t j = 0; j < node.outputs(); ++j)
        found = found || (node.output(j) == k && node.out_storage(j) == static_cast<int>(st));
      all = all && keys_[static_cast<size_t>(k)].producer == producer && found;
    }
    restored_by_producer_[st] = all && std::find(node.alloc_begin(), node.alloc_end(), static_cast<int>(st)) != node.alloc_end();
  }
}

// evaluate's bound: one allocating node per storage, and a group storage's keys restored only after
// its allocation in any step (restored by the allocating node itself, or by a node that needs it
// through values never saved: the allocating node runs first in every step that runs that one).
bool IncrementalPeak::Static::restores_follow_allocations() const {
  const size_t ns = g_.storages;
  std::vector<int64_t> allocated_by(ns, -1);
  bool once = true;
  for (size_t o = 0; o < nn_; ++o)
    for (int st : g_.allocated[o]) {
      once = once && allocated_by[static_cast<size_t>(st)] < 0;
      allocated_by[static_cast<size_t>(st)] = static_cast<int64_t>(o);
    }
  auto runs_after = [&](int64_t node, int64_t before) {  // `before` reached through never-saved inputs
    std::vector<int64_t> todo{node};
    for (size_t seen = 0; !todo.empty() && seen < 64; ++seen) {
      const int64_t o = todo.back();
      todo.pop_back();
      if (o == before) return true;
      const auto rec = plan_detail::NodeRecord::of(nodes_, static_cast<size_t>(o));
      for (size_t i = 0; i < rec.inputs(); ++i)
        if (rec.input(i) == kNeverUsable) todo.push_back(rec.producer(i));
    }
    return false;
  };
  bool ordered = once;
  for (size_t st = 0; st < ns && ordered; ++st) {
    if (!is_group_[st] || restored_by_producer_[st] || allocated_by[st] < 0) continue;
    for (int k : storage_keys_[st]) {
      const int64_t producer = keys_[static_cast<size_t>(k)].producer;
      ordered = ordered && producer >= 0 && runs_after(producer, allocated_by[st]);
    }
  }
  return ordered;
}

// The measured (keep-everything) run's saved bytes at each backward step's start, and what it held
// besides them.
void IncrementalPeak::Static::measure_other() {
  std::vector<int64_t> measured(nb_ + 1, 0);
  for (size_t s = 0; s < g_.storages; ++s) {
    if (!is_group_[s] || storage_keys_[s].empty()) continue;
    int64_t last = -1;
    for (int k : storage_keys_[s]) last = std::max<int64_t>(last, keys_[static_cast<size_t>(k)].release);
    const auto until = static_cast<size_t>(std::min<int64_t>(last, static_cast<int64_t>(nb_) - 1));
    measured[0] += bytes_[s];
    measured[until + 1] -= bytes_[s];
  }
  other_.resize(nb_);
  int64_t m = 0;
  for (size_t j = 0; j < nb_; ++j) {
    m += measured[j];
    other_[j] = {g_.profile.backward_start_bytes[j] - m, g_.profile.backward_peak_bytes[j] - m};
  }
}

IncrementalPeak::IncrementalPeak(const StepProfile& p, const std::vector<Group>& groups, int64_t extra,
                                 const std::vector<Decision>& decisions)
    : IncrementalPeak(std::make_shared<const PlanGraph>(p), groups, extra, decisions) {}

IncrementalPeak::IncrementalPeak(std::shared_ptr<const PlanGraph> graph, const std::vector<Group>& groups,
                                 int64_t extra, const std::vector<Decision>& decisions)
    : IncrementalPeak(std::make_shared<const Static>(std::move(graph), groups, extra), decisions) {}

IncrementalPeak::IncrementalPeak(const IncrementalPeak& like, const std::vector<Decision>& decisions)
    : IncrementalPeak(like.static_, decisions) {}

IncrementalPeak::IncrementalPeak(std::shared_ptr<const Static> shared, const std::vector<Decision>& decisions)
    : static_(std::move(shared)),
      g_(static_->g_),
      extra_(static_->extra_),
      nn_(static_->nn_),
      nb_(static_->nb_),
      nk_(static_->nk_),
      storage_of_group_(static_->storage_of_group_),
      is_group_(static_->is_group_),
      bytes_(static_->bytes_),
      forward_release_(static_->forward_release_),
      storage_keys_(static_->storage_keys_),
      nodes_(static_->nodes_),
      saved_at_(static_->saved_at_),
      released_at_(static_->released_at_),
      release_steps_(static_->release_steps_),
      restored_by_producer_(static_->restored_by_producer_),
      sole_key_(static_->sole_key_),
      extension_bound_(static_->extension_bound_),
      other_(static_->other_) {
  RATION_ASSERT(decisions.size() == storage_of_group_.size(), "incremental peak: one decision per group expected");
  decision_.assign(bytes_.size(), Decision::Keep);
  for (size_t g = 0; g < storage_of_group_.size(); ++g) {
    RATION_ASSERT(decisions[g] != Decision::Offload, "incremental peaks cover keep/recompute plans only");
    decision_[static_cast<size_t>(storage_of_group_[g])] = decisions[g];
  }
  keys_ = static_->keys_;
  node_mark_.resize(nn_ + 1);
  for (size_t o = 0; o <= nn_; ++o) node_mark_[o] = {0, nodes_.start[o]};
  transient_epoch_.assign(bytes_.size(), 0);
  touch_epoch_.resize(bytes_.size());
  for (size_t s = 0; s < bytes_.size(); ++s) touch_epoch_[s] = is_group_[s] ? 0 : kNotGroup;
  move_.assign(bytes_.size(), Move{0, kSeveral});
  arrive_.assign(nb_, 0);
  build();
}

namespace {
struct FullState {
  std::vector<State>& s;
  State get(int k) const { return s[static_cast<size_t>(k)]; }
  void set(int k, State v) { s[static_cast<size_t>(k)] = v; }
};
}  // namespace

// The committed plan from scratch: forward peaks, then every backward step.
void IncrementalPeak::build() {
  std::vector<int64_t> fwd(nn_), release_after(nn_ + 1, 0);
  for (size_t s = 0; s < decision_.size(); ++s)
    if (is_group_[s] && dropped(static_cast<int>(s)) && forward_release_[s] < static_cast<int64_t>(nn_))
      release_after[static_cast<size_t>(forward_release_[s])] += bytes_[s];
  int64_t released = 0;
  for (size_t k = 0; k < nn_; ++k) {
    fwd[k] = g_.peak_bytes[k] + extra_ - released;
    released += release_after[k];
  }
  forward_.init(fwd);

  std::vector<State> states(nk_, State::Kept);
  for (size_t k = 0; k < nk_; ++k) {
    const int s = keys_[k].storage;
    const bool drop = s >= 0 && is_group_[static_cast<size_t>(s)] && dropped(s);
    if (drop) states[k] = State::Dropped;
    keys_[k].restore = drop ? plan_detail::KeyRecord::kNoStep : plan_detail::KeyRecord::kHeld;
  }
  FullState st{states};
  std::vector<std::pair<size_t, int>> restored, touched, touches;  // (step or storage, entry)
  std::vector<int64_t> values(nb_), resident_at(nb_);
  step_gain_.assign(nb_, 0);
  int64_t resident = 0;
  for (size_t s = 0; s < decision_.size(); ++s) {
    if (!is_group_[s]) continue;
    for (int k : storage_keys_[s])
      if (holding(states[static_cast<size_t>(k)])) {
        resident += bytes_[s];
        break;
      }
  }
  for (size_t j = 0; j < nb_; ++j) {
    StepResult r;
    r.resident_at_start = resident;
    StepRun<FullState> run{nodes_, storage_keys_, keys_,
                           bytes_, node_mark_, transient_epoch_, ++cache_stamp_, ++transient_stamp_,
                           st, resident, r.touched, r.restored, touch_epoch_, sole_key_};
    run.recompute_peak = resident;
    for (int k : saved_at_[j]) {
      run.touch(k);
      if (!run.usable(k)) run.rerun(keys_[static_cast<size_t>(k)].producer);
    }
    values[j] = std::max(other_[j].start + run.recompute_peak, other_[j].transient + resident + run.transient_bytes) + extra_;
    step_gain_[j] = resident + run.transient_bytes - r.resident_at_start;
    for (int k : released_at_[j]) {
      const State was = st.get(k);
      st.set(k, State::Released);
      const int s = keys_[static_cast<size_t>(k)].storage;
      if (holding(was) && is_group_[static_cast<size_t>(s)] && !run.held_without(k, s)) resident -= bytes_[static_cast<size_t>(s)];
    }
    resident_at[j] = r.resident_at_start;
    for (int k : r.restored) {
      keys_[static_cast<size_t>(k)].restore = static_cast<int32_t>(j);
      restored.emplace_back(j, k);
    }
    for (int t : r.touched) {  // j ascends
      touches.emplace_back(static_cast<size_t>(touch_id(t)), touch_entry(static_cast<int>(j), touch_as_output(t)));
      touched.emplace_back(j, t);
    }
  }
  restored_at_.reset(nb_, restored);
  touched_at_.reset(nb_, touched);
  touches_.reset(decision_.size(), touches);
  backward_.init(values);
  resident_.init(resident_at);
  peak_step_ = -1;
  last_.valid = false;
}

int64_t IncrementalPeak::peak() const {
  int64_t peak = 0;
  if (nn_ > 0) peak = std::max(peak, forward_.max(0, nn_ - 1));
  if (nb_ > 0) peak = std::max(peak, backward_.max(0, nb_ - 1));
  return peak;
}

// Key states of the run being evaluated: the overlay where it differs from the committed plan.
struct IncrementalPeak::OverlayState {
  IncrementalPeak* self;
  int64_t step;
  State get(int k) const { return self->over_get(k, step); }
  void set(int k, State v) { self->over_set(k, v); }
};

// Pricing a change of group storage s, in steps: the changes priced without a window (none, a release
// rejected unpriced, no backward step touching s, a release restored inside a cascade anyway), then the
// backward window from the first step touching s (evaluate_window), the forward part last (with_forward).
void IncrementalPeak::evaluate(size_t s, Decision to, Evaluation& e, int64_t stop_at, bool lazy) {
  read_early_ = false;
  e.storage = s;
  e.to = to;
  e.used = 0;  // e.steps keeps its step results (and their buffers) from earlier evaluations
  e.shifted.clear();
  e.first = e.last = -1;
  e.valid = true;
  if (decision_[s] == to) {
    e.peak = peak();
    e.resident_delta = 0;
    return;
  }
  if (lazy && stop_at != kExact && to == Decision::Recompute && rejected_unpriced(s, stop_at, e)) return;
  const int64_t b = bytes_[s];
  e.resident_delta = to == Decision::Keep ? b : -b;
  int64_t peak = 0;
  if (nb_ == 0) {
    e.peak = with_forward(s, e.resident_delta, peak);
    return;
  }
  const auto touches = touches_[s];
  if (touches.empty()) {
    e.peak = with_forward(s, e.resident_delta, std::max(peak, backward_.max(0, nb_ - 1) + e.resident_delta));
    return;
  }
  const int64_t first = touch_id(touches.front());
  e.first = first;
  if (first > 0) peak = std::max(peak, backward_.max(0, static_cast<size_t>(first - 1)) + e.resident_delta);
  if (peak >= stop_at) return stop(e, peak);
  if (to == Decision::Recompute && touch_as_output(touches.front()) && restored_by_producer_[s])
    return price_restored_in_cascade(s, e, peak, stop_at);
  evaluate_window(s, e, peak, stop_at, lazy);
}

// Most releases a descent rejects change one backward step only, before the step where the committed
// plan reaches its peak: that step keeps its value, so the release cannot lower the peak. Found from
// the release's first step and the keys it restores there, before pricing anything.
inline bool IncrementalPeak::rejected_unpriced(size_t s, int64_t stop_at, Evaluation& e) {
  if (nb_ == 0 || !restored_by_producer_[s]) return false;
  const int64_t top = backward_.max(0, nb_ - 1);
  const auto touches = touches_[s];
  if (top < stop_at || touches.empty() || peak_step() <= touch_id(touches.front()) || !only_step_differs(s)) return false;
  e.peak = top;
  e.resident_delta = -bytes_[s];
  e.valid = false;
  return true;
}

// Forward: the group is resident after its last forward need only when kept. Priced last, and only
// where it can exceed what backward reaches: the committed forward peak (plus b for a keep) bounds it.
inline int64_t IncrementalPeak::with_forward(size_t s, int64_t delta, int64_t p) const {
  if (nn_ == 0) return p;
  const int64_t whole = forward_.max(0, nn_ - 1);
  if (whole + std::max<int64_t>(delta, 0) <= p) return p;
  const int64_t a = forward_release_[s];
  if (a >= static_cast<int64_t>(nn_) - 1) return std::max(p, whole);
  return std::max({p, forward_.max(0, static_cast<size_t>(a)), forward_.max(static_cast<size_t>(a + 1), nn_ - 1) + delta});
}

// Released where the committed plan first consults it as the output of a node its step re-runs anyway
// (the rest of a re-run cascade): that re-run restores it, so the step runs the same nodes with the
// group's bytes missing until then, and the same bytes after (the committed run counted them twice
// there, resident and transient; this one once). The step is the committed one less `b`, its keys hold
// from there on as kept ones do, and nothing later changes: no re-simulation.
inline void IncrementalPeak::price_restored_in_cascade(size_t s, Evaluation& e, int64_t peak, int64_t stop_at) {
  const int64_t b = bytes_[s];
  const auto ju = static_cast<size_t>(e.first);
  StepResult& r = e.add_step();
  r.step = e.first;
  r.value = backward_.max(ju, ju) - b;
  r.resident_at_start = resident_.at(ju) - b;
  r.gain = step_gain_[ju];
  r.adds_storage_keys = true;  // the lists are the committed step's, copied only if this is committed
  peak = std::max(peak, r.value);
  if (peak >= stop_at) return stop(e, peak);
  e.last = e.first;
  if (ju + 1 < nb_) peak = std::max(peak, backward_.max(ju + 1, nb_ - 1));
  e.peak = with_forward(s, e.resident_delta, peak);
}

// The window: from e.first, each step that touches a key held differently is re-simulated
// (resimulate_step); the steps up to the next such one run as the committed plan's, shifted by a constant
// number of resident bytes (one range max); once every key is back in the committed plan's state the
// committed peaks hold unchanged.
// A release first consulted as an input at a step that re-runs many nodes: the step now also re-runs
// the storage's producer and whatever that needs (the extension). Which keys it restores is found
// without re-running the rest of the step (a node the committed step re-ran restores the same keys in
// both runs), and with it every later step; only the step's own value needs the whole re-run. So the
// later steps come first: when one of them (or the unchanged rest) reaches stop_at the release is
// rejected without that value, else the evaluation runs again in full.
inline void IncrementalPeak::evaluate_window(size_t s, Evaluation& e, int64_t peak, int64_t stop_at, bool lazy) {
  const int64_t first = e.first;
  start_overlay(s, e.to == Decision::Keep ? State::Kept : State::Dropped);
  OverlayState st{this, first};
  int64_t resident = resident_.at(static_cast<size_t>(first)) + e.resident_delta;
  const bool extension = lazy && stop_at != kExact && e.to == Decision::Recompute &&
                         !touch_as_output(touches_[s].front()) && restored_by_producer_[s] &&
                         touched_at_.size(static_cast<size_t>(first)) >= kLongStep;
  int64_t j = first;
  for (;; ++j) {
    st.step = j;
    const auto ju = static_cast<size_t>(j);
    if (extension && j == first) resident = step_with_extension(s, j, st);
    else if (resimulate_step(e, j, st, resident, peak, stop_at)) return stop(e, peak);
    const int64_t next = settle_overlay(j);
    if (over_keys_.empty() || ju + 1 == nb_) break;
    if (next > j + 1) {
      const int64_t delta = resident - resident_.at(ju + 1);
      const int64_t to_step = next - 1;
      peak = std::max(peak, backward_.max(ju + 1, static_cast<size_t>(to_step)) + delta);
      if (peak >= stop_at) return stop(e, peak);
      e.shifted.push_back({j + 1, to_step, delta});
      if (next == static_cast<int64_t>(nb_)) {
        j = to_step;
        break;
      }
      resident = resident_.at(static_cast<size_t>(next)) + delta;
    }
    j = next - 1;  // the loop's ++j
  }
  e.last = j;
  if (static_cast<size_t>(j) + 1 < nb_) peak = std::max(peak, backward_.max(static_cast<size_t>(j + 1), nb_ - 1));
  if (extension) {
    if (peak >= stop_at) return stop(e, peak);
    peak = std::max(peak, extended_step_bound(s, first));
    if (peak >= stop_at) return stop(e, peak);
    return evaluate(s, e.to, e, stop_at, false);  // the extension's step decides: run it
  }
  e.peak = with_forward(s, e.resident_delta, peak);
}

inline bool IncrementalPeak::resimulate_step(Evaluation& e, int64_t j, OverlayState& st, int64_t& resident, int64_t& peak,
                                      int64_t stop_at) {
  const auto ju = static_cast<size_t>(j);
  StepResult& r = e.add_step();
  r.adds_storage_keys = false;
  r.touched.clear();
  r.restored.clear();
  r.step = j;
  r.resident_at_start = resident;
  StepRun<OverlayState> run{nodes_, storage_keys_, keys_,
                            bytes_, node_mark_, transient_epoch_, ++cache_stamp_, ++transient_stamp_,
                            st, resident, r.touched, r.restored, touch_epoch_, sole_key_};
  run.recompute_peak = resident;
  run.held_from = held_from_;
  run.step = j;
  const plan_detail::StepOther& other = other_[ju];
  if (stop_at != kExact) run.stop_recompute_at = stop_at - other.start - extra_;
  for (int k : saved_at_[ju]) {
    run.touch(k);
    if (!run.usable(k)) run.rerun(keys_[static_cast<size_t>(k)].producer);
    if (run.stopped) break;
  }
  read_early_ = read_early_ || run.read_early;
  if (run.stopped) {
    peak = std::max(peak, other.start + run.recompute_peak + extra_);
    return true;
  }
  r.value = std::max(other.start + run.recompute_peak, other.transient + resident + run.transient_bytes) + extra_;
  r.gain = resident + run.transient_bytes - r.resident_at_start;
  peak = std::max(peak, r.value);
  if (peak >= stop_at) return true;
  for (int k : released_at_[ju]) {
    const State was = st.get(k);
    st.set(k, State::Released);
    const int ks = keys_[static_cast<size_t>(k)].storage;
    if (holding(was) && is_group_[static_cast<size_t>(ks)] && !run.held_without(k, ks)) resident -= bytes_[static_cast<size_t>(ks)];
  }
  // A key the committed plan restored here but this run did not stays dropped in this run.
  for (int k : restored_at_[ju])
    if (!in_overlay(k)) st.set(k, State::Dropped);
  if (ju + 1 < nb_) resident += arrive_[ju + 1];
  return false;
}

inline int64_t IncrementalPeak::step_with_extension(size_t s, int64_t j, OverlayState& st) {
  const auto ju = static_cast<size_t>(j);
  walk_extension(s, j);
  // Resident at the next step's start: the committed one plus each storage the extension holds that
  // the committed plan does not hold there (the released storage itself is held again in both).
  int64_t resident = ju + 1 < nb_ ? resident_.at(ju + 1) : 0;
  ++transient_stamp_;
  for (int k : extension_) {
    const int ks = keys_[static_cast<size_t>(k)].storage;
    if (ks == static_cast<int>(s) || transient_epoch_[static_cast<size_t>(ks)] == transient_stamp_) continue;
    transient_epoch_[static_cast<size_t>(ks)] = transient_stamp_;
    bool held = false;
    for (int other : storage_keys_[static_cast<size_t>(ks)])
      held = held || (!in_overlay(other) && holding(base_state(other, j + 1)));
    if (!held) resident += bytes_[static_cast<size_t>(ks)];
  }
  for (int k : released_at_[ju]) st.set(k, State::Released);
  return resident;
}

// Keys in the same state as the committed plan's from the next step on need no overlay. Steps before
// the next one that touches a differing key run as the committed plan's, shifted. Where the key is
// the only one of its storage and dropped in the committed plan at the next step, that is the step
// the plan restores it or releases it: a committed step touching such a storage restores the key.
inline int64_t IncrementalPeak::settle_overlay(int64_t j) {
  size_t kept = 0;
  int64_t next = static_cast<int64_t>(nb_);
  for (int k : over_keys_) {
    if (!in_overlay(k)) continue;
    const State base = base_state(k, j + 1);
    if (norm(overlay_state(k)) == norm(base)) {
      leave_overlay(k);
      continue;
    }
    over_keys_[kept++] = k;
    const plan_detail::KeyRecord& key = keys_[static_cast<size_t>(k)];
    if (key.storage < 0) next = std::min(next, j + 1);
    else if (base == State::Dropped && sole_key_[static_cast<size_t>(k)]) next = std::min<int64_t>(next, std::min(key.restore, key.release));
    else next = std::min(next, next_event(key.storage, j + 1));
  }
  over_keys_.resize(kept);
  return next;
}

// A lower bound of step j's value when storage s, first consulted at j as an input, is released and the
// extension (extension_, from extend) restores more keys there. The extended step re-runs a superset of
// the committed step's nodes (the extension's at the touch of s, then the rest in the same order, skipping
// those the extension already re-ran), and restores the same keys plus s's and the extension's: every key
// it restores beyond the committed step's has a producer the committed step did not re-run (one it re-ran
// restored all its dropped outputs), and extend visits every such node. So at the step's end:
// - it holds every storage the committed step holds, and besides them every extension storage the
//   committed step neither held at the step's start nor restored in it;
// - a storage is transient at the end when its one allocating node ran and no dropped key of it was
//   restored afterwards. Where every group storage's keys are restored only after its allocation (the
//   graph is checked once: see Static), that is "allocated, and no key of it restored", so the extended
//   step has every transient storage of the committed step except, at most, s and the extension's
//   storages. An extension storage restored by its allocating node was not transient in the committed
//   step (that node did not run there: it would have restored the key); one restored by another node
//   may have been, which costs nothing where the extended step holds it instead, and its bytes where
//   the committed step held it too.
// So the value is at least the committed step's end figure less b, plus the first kind, less the last.
// No bound (0) where the graph breaks the assumption.
int64_t IncrementalPeak::extended_step_bound(size_t s, int64_t j) {
  if (!extension_bound_) return 0;
  const auto ju = static_cast<size_t>(j);
  int64_t differs = 0;
  ++transient_stamp_;
  for (int k : extension_) {
    const auto ks = static_cast<size_t>(keys_[static_cast<size_t>(k)].storage);
    if (ks == s || transient_epoch_[ks] == transient_stamp_) continue;
    transient_epoch_[ks] = transient_stamp_;
    bool held = false;  // by the committed step
    for (int other : storage_keys_[ks])
      held = held || holding(base_state(other, j)) || keys_[static_cast<size_t>(other)].restore == j;
    if (restored_by_producer_[ks] && !held) differs += bytes_[ks];
    if (!restored_by_producer_[ks] && held) differs -= bytes_[ks];
  }
  return other_[ju].transient + resident_.at(ju) + step_gain_[ju] + differs - bytes_[s] + extra_;
}

void IncrementalPeak::extend(int64_t ord, int64_t j, std::vector<int>& restored) {
  const auto o = static_cast<size_t>(ord);
  plan_detail::NodeMark& mark = node_mark_[o];
  if (mark.epoch == cache_stamp_) return;
  mark.epoch = cache_stamp_;
  const auto node = plan_detail::node_record(nodes_, node_mark_, o);
  for (size_t i = 0; i < node.inputs(); ++i) {
    const int k = node.input(i);
    // Usable at the step's start, or restored by the committed step (its producer re-runs in both runs,
    // and what that needs was re-run there too): nothing to add behind it.
    if (k != kNeverUsable && (keys_[static_cast<size_t>(k)].producer < 0 || holding(over_get(k, j)) ||
                              keys_[static_cast<size_t>(k)].restore == j))
      continue;
    extend(node.producer(i), j, restored);
  }
  for (size_t jo = 0; jo < node.outputs(); ++jo) {
    const int k = node.output(jo);
    if (k < 0 || over_get(k, j) != State::Dropped || keys_[static_cast<size_t>(k)].restore == j) continue;
    over_set(k, State::Restored);
    restored.push_back(k);
  }
}

void IncrementalPeak::start_overlay(size_t s, State keys) {
  if (++over_stamp_ == 1u << 30) {  // the stamp fills the word's upper 30 bits: start again
    for (plan_detail::KeyRecord& key : keys_) key.over = 0;
    over_stamp_ = 1;
  }
  over_keys_.clear();
  for (int k : storage_keys_[s]) over_set(k, keys);
}

void IncrementalPeak::walk_extension(size_t s, int64_t j) {
  extension_.clear();
  ++cache_stamp_;
  extend(keys_[static_cast<size_t>(storage_keys_[s].front())].producer, j, extension_);
}

int64_t IncrementalPeak::peak_step() {
  if (peak_step_ < 0) peak_step_ = static_cast<int64_t>(backward_.last_argmax());
  return peak_step_;
}

// Releasing s (restored by its producer, kept now) changes only its first backward step: the storage is
// restored there by its producer's re-run (consulted as that output: the step re-runs it anyway; as an
// input: the step adds the producer, and the producer's re-run restores no other key). From the next step
// on every key is in the committed plan's state.
bool IncrementalPeak::only_step_differs(size_t s) {
  const auto touches = touches_[s];
  if (touch_as_output(touches.front())) return true;
  start_overlay(s, State::Dropped);
  walk_extension(s, touch_id(touches.front()));
  for (int k : extension_)
    if (keys_[static_cast<size_t>(k)].storage != static_cast<int>(s)) return false;
  return true;
}

int64_t IncrementalPeak::next_event(int s, int64_t j) const {
  int64_t next = static_cast<int64_t>(nb_);
  const auto touches = touches_[static_cast<size_t>(s)];
  auto t = std::lower_bound(touches.begin(), touches.end(), touch_entry(static_cast<int>(j), false));
  if (t != touches.end()) next = std::min<int64_t>(next, touch_id(*t));
  const auto& releases = release_steps_[static_cast<size_t>(s)];
  auto r = std::lower_bound(releases.begin(), releases.end(), j);
  if (r != releases.end()) next = std::min(next, *r);
  return next;
}

void IncrementalPeak::mark_offloaded(size_t g) {
  const auto s = static_cast<size_t>(storage_of_group_[g]);
  RATION_ASSERT(decision_[s] == Decision::Keep, "incremental peak: only a kept group can be marked offloaded");
  decision_[s] = Decision::Offload;
  peak_step_ = -1;
  last_.valid = false;
}

void IncrementalPeak::add_forward(size_t from, int64_t delta) {
  if (from >= nn_ || delta == 0) return;
  forward_.add(from, nn_ - 1, delta);
  last_.valid = false;
}

void IncrementalPeak::add_backward(size_t from, size_t until, int64_t delta) {
  until = std::min(until, nb_);
  if (from >= until || delta == 0) return;
  backward_.add(from, until - 1, delta);
  resident_.add(from, until - 1, delta);
  // The resident count at a step's start is the previous step's at its end plus arrive_: the range's first
  // step gains delta, the step after its last loses it.
  if (from > 0) arrive_[from] += delta;
  if (until < nb_) arrive_[until] -= delta;
  peak_step_ = -1;
  last_.valid = false;
}

void IncrementalPeak::set_backward_value(size_t j, int64_t value) {
  backward_.assign(j, value);
  peak_step_ = -1;
  last_.valid = false;
}

int64_t IncrementalPeak::first_touch(size_t s) const {
  const auto touches = touches_[s];
  return touches.empty() ? static_cast<int64_t>(nb_) : static_cast<int64_t>(touch_id(touches.front()));
}

bool IncrementalPeak::matches(const Prediction& p) const {
  if (p.forward_peaks.size() != nn_ || p.backward_peaks.size() != nb_) return false;
  for (size_t k = 0; k < nn_; ++k)
    if (forward_.max(k, k) != p.forward_peaks[k]) return false;
  for (size_t j = 0; j < nb_; ++j)
    if (backward_.max(j, j) != p.backward_peaks[j]) return false;
  return true;
}

int64_t IncrementalPeak::peak_if(size_t g, Decision d, int64_t stop_at) {
  evaluate(static_cast<size_t>(storage_of_group_[g]), d, last_, stop_at);
  return last_.peak;
}

void IncrementalPeak::set(size_t g, Decision d) {
  const auto s = static_cast<size_t>(storage_of_group_[g]);
  if (!(last_.valid && last_.storage == s && last_.to == d)) evaluate(s, d, last_);
  commit(last_);
}

// A cascade moved to an earlier step leaves the step it came from with a short list: before the lists
// of the changed window steps are rewritten, a step whose new list outgrows its room takes the room of
// one whose new list fits its own (the two trade places), instead of moving to the end of the buffer.
// Each cascade move would otherwise write the whole cascade's lists to memory not touched before.
void IncrementalPeak::trade_rooms(const Evaluation& e, plan_detail::PooledLists<int>& lists, char unchanged,
                                  std::vector<int> StepResult::*list) {
  if (e.used < 2) return;
  for (size_t u = 0; u < e.used; ++u) {
    if ((same_[u] & unchanged) != 0 || e.steps[u].adds_storage_keys) continue;
    const auto ju = static_cast<size_t>(e.steps[u].step);
    const size_t need = (e.steps[u].*list).size();
    if (need <= lists.room(ju)) continue;
    for (size_t w = 0; w < e.used; ++w) {
      if (w == u || (same_[w] & unchanged) != 0 || e.steps[w].adds_storage_keys) continue;
      const auto jw = static_cast<size_t>(e.steps[w].step);
      if (lists.room(jw) >= need && (e.steps[w].*list).size() <= lists.room(ju)) {
        lists.swap_places(ju, jw);
        break;
      }
    }
  }
}

void IncrementalPeak::commit(const Evaluation& e) {
  const size_t s = e.storage;
  if (decision_[s] == e.to) return;
  peak_step_ = -1;
  const int64_t sign = e.to == Decision::Keep ? 1 : -1;
  const int64_t a = forward_release_[s];
  if (nn_ > 0 && a < static_cast<int64_t>(nn_) - 1) forward_.add(static_cast<size_t>(a + 1), nn_ - 1, sign * bytes_[s]);
  decision_[s] = e.to;
  // A released group's keys are restored by the window below, or never; a kept one's are held (set
  // after the window, which clears the restore steps of the lists it replaces).
  if (e.to == Decision::Recompute)
    for (int k : storage_keys_[s]) keys_[static_cast<size_t>(k)].restore = plan_detail::KeyRecord::kNoStep;
  if (nb_ > 0) {
    const size_t before = e.first < 0 ? nb_ : static_cast<size_t>(e.first);
    if (before > 0) {
      backward_.add(0, before - 1, e.resident_delta);
      resident_.add(0, before - 1, e.resident_delta);
    }
  }
  if (e.first >= 0) {
    // A re-simulated step that restores and touches what the committed plan's step did (a long re-run
    // cascade mostly does) keeps its lists: each key is restored at one step at most, so leaving the
    // step's entries in place is the same as removing and adding them again.
    // same_ per window step: kSameLists (nothing to change) or kSameTouched (only the restored list).
    same_.assign(e.used, 0);
    for (size_t u = 0; u < e.used; ++u) {
      const StepResult& r = e.steps[u];
      const auto ju = static_cast<size_t>(r.step);
      if (r.adds_storage_keys) {  // evaluate's shortcut: the step restores the released storage's keys too
        for (int k : storage_keys_[s]) {
          restored_at_.push_back(ju, k);
          keys_[static_cast<size_t>(k)].restore = static_cast<int32_t>(r.step);
        }
        same_[u] = kSameLists;
        continue;
      }
      const bool same_touched = touched_at_.equals(ju, r.touched);
      if (same_touched && restored_at_.equals(ju, r.restored)) {
        same_[u] = kSameLists;
        continue;
      }
      for (int k : restored_at_[ju]) keys_[static_cast<size_t>(k)].restore = plan_detail::KeyRecord::kNoStep;
      if (same_touched) same_[u] = kSameTouched;
    }
    // A storage whose touch moves from one changed step to another keeps its entry's place where no entry
    // of another step lies between the two (a cascade moved to an earlier step moves every touch of it):
    // the entry is rewritten instead of erased and inserted again.
    if (++move_stamp_ == 0) {
      for (Move& m : move_) m.epoch = 0;
      move_stamp_ = 1;
    }
    for (size_t u = 0; u < e.used; ++u) {
      if (same_[u] != 0) continue;
      for (int t : e.steps[u].touched) {
        const auto id = static_cast<size_t>(touch_id(t));
        Move& m = move_[id];
        m.entry = m.epoch != move_stamp_ ? touch_entry(static_cast<int>(e.steps[u].step), touch_as_output(t)) : kSeveral;
        m.epoch = move_stamp_;
      }
    }
    for (size_t u = 0; u < e.used; ++u) {
      if (same_[u] != 0) continue;
      const auto ju = static_cast<size_t>(e.steps[u].step);
      for (int t : touched_at_[ju]) {
        const auto id = static_cast<size_t>(touch_id(t));
        const auto steps = touches_[id];
        const int* at = std::lower_bound(steps.begin(), steps.end(), touch_entry(static_cast<int>(ju), false));
        const auto pos = static_cast<size_t>(at - steps.begin());
        const int moved = move_[id].epoch == move_stamp_ ? move_[id].entry : -1;
        if (moved >= 0 && (pos == 0 || touch_id(steps[pos - 1]) < touch_id(moved)) &&
            (pos + 1 == steps.size() || touch_id(steps[pos + 1]) > touch_id(moved))) {
          touches_.items[touches_.slot[id].at + pos] = moved;
          move_[id].entry = kPlaced;
          continue;
        }
        touches_.erase(id, pos);
      }
    }
    for (const auto& sh : e.shifted) {
      backward_.add(static_cast<size_t>(sh.from), static_cast<size_t>(sh.to), sh.delta);
      resident_.add(static_cast<size_t>(sh.from), static_cast<size_t>(sh.to), sh.delta);
    }
    trade_rooms(e, restored_at_, kSameLists, &StepResult::restored);
    trade_rooms(e, touched_at_, kSameLists | kSameTouched, &StepResult::touched);
    for (size_t u = 0; u < e.used; ++u) {
      const StepResult& r = e.steps[u];
      const int64_t j = r.step;
      const auto ju = static_cast<size_t>(j);
      backward_.assign(ju, r.value);
      resident_.add(ju, ju, r.resident_at_start - resident_.at(ju));
      step_gain_[ju] = r.gain;
      if (same_[u] == kSameLists) continue;
      restored_at_.assign(ju, r.restored);
      for (int k : r.restored) keys_[static_cast<size_t>(k)].restore = static_cast<int32_t>(j);
      if (same_[u] == kSameTouched) continue;
      touched_at_.assign(ju, r.touched);
      for (int t : r.touched) {
        const auto id = static_cast<size_t>(touch_id(t));
        if (move_[id].epoch == move_stamp_ && move_[id].entry == kPlaced) continue;
        const auto steps = touches_[id];
        const int entry = touch_entry(static_cast<int>(j), touch_as_output(t));
        const int* at = std::upper_bound(steps.begin(), steps.end(), touch_entry(static_cast<int>(j), true));
        touches_.insert(id, static_cast<size_t>(at - steps.begin()), entry);
      }
    }
  }
  if (e.to == Decision::Keep)
    for (int k : storage_keys_[s]) keys_[static_cast<size_t>(k)].restore = plan_detail::KeyRecord::kHeld;
  last_.valid = false;
}

}  // namespace ration::memory
