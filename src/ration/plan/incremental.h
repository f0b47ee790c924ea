// plan/incremental.h — the predicted peak of a keep/recompute plan, kept up to date as single groups
// change decision, so that a strategy trying thousands of changes pays near-linear time in total
// instead of one whole-step simulation per try.
// Owns: the peak under keep/recompute decisions without transient re-runs, exactly as the simulator
//       (plan/simulator.h) computes it; groups marked offloaded are held as kept ones, their bytes moved by
//       the caller's range adds (plan/offload_peak.h), which a re-simulated window carries from step to step
//       (arrive_). Does not own: the simulator's rules (it runs the same rules step by step), the copy
//       queues (plan/offload_peak.h), binomial chain plans (those use the simulator directly).
//
// How: forward peaks are the measured ones minus the groups released after their last forward use, so a
// change is a range add over node positions (a segment tree with range add and range max). Backward, a
// group's change cannot matter before the first backward step that touches it (consults one of its keys
// or re-runs its producer): before that step the only difference is its bytes being resident or not (a
// range add). From that step on, the backward steps are re-simulated with the new decision, reading the
// committed plan's key states for everything the change did not alter, until every key is back in the
// state the committed plan has (usable / not usable, holding its storage or not); from there on the
// committed plan's peaks hold unchanged. Inside the window, a run of steps that touch none of the keys
// held differently runs exactly as the committed plan's with a constant difference in resident bytes:
// those steps are not re-simulated but priced by one range max (and committed by one range add). So an
// evaluation costs O((steps that touch the differing keys) · log n), a few steps on every model measured,
// even where a re-run cascade keeps values restored for hundreds of steps. A caller that only asks
// whether the peak stays below a threshold (peak_if's stop_at) lets the evaluation stop at the first
// step or re-run that reaches it. The next step that touches a differing key is found in its storage's
// sorted step list, or, for a key alone in its storage and dropped in the committed plan there, is the
// step that restores (or releases) it: any committed step touching that storage restores the key.
// Long re-run steps (a cascade that restores a whole run of dropped layers) are not re-simulated for the
// releases a descent tries most: a group the committed step already restores by re-running its producer
// (first consulted there as that producer's output) costs exactly its bytes less at that step and
// nothing after; a group first consulted there as an input adds its producer's re-runs (the extension),
// whose restored keys are found by walking the extension alone, so the later steps are priced before the
// long step itself, which is re-simulated only when they do not already reject the release.
// When the later steps do not reject such a release, a lower bound of the long step's value (from the
// committed step's end figure, kept per step as its gain over the step's start) may still reject it
// before the step is re-simulated (extended_step_bound).
// Before any of this, a release that changes its first backward step only, before the step holding the
// committed backward peak, cannot lower the peak: rejected without pricing (only_step_differs). The forward
// part is priced last, and only where the committed forward peak could exceed the answer.
// Data: what depends on the profile and the groups only (key ids, node inputs and outputs, release steps)
// is built once and shared by every copy and by every peak built `like` another (a plan's descents all
// start from copies of one all-kept peak); a copy owns only the committed plan's state. Static lists are
// stored back to back (Lists), and a node's lists as one record (its inputs with their producers, its
// outputs with their storages, its allocations, its workspace), so a re-run reads one or two lines per
// node. A step lists each group storage it touches once, with how it first touched it; the steps touching
// a storage are a sorted vector. The range max and the resident bytes keep their values in blocks of a
// cache line with the structure over the blocks an eighth of the size: at thousands of steps the planner's
// data otherwise outgrow the core's cache, and every evaluation's reads miss it.
// What a walk marks sits next to what it reads: a node's run mark with its record's offset, a key's
// overlay mark in its record, what the measured run held besides the groups in one record per step.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "ration/plan/graph.h"
#include "ration/plan/planner.h"
#include "ration/plan/profile.h"

namespace ration::memory {

namespace plan_detail {
// Changeable lists by index in one buffer: list i is slot[i].size items from slot[i].at, with room for
// slot[i].room. A list that outgrows its room moves to the end of the buffer (the room it leaves stays
// unused until the next copy) unless it can take the room of a list being rewritten with it (swap_places:
// a commit that moves a re-run cascade to an earlier step gives that step the room of the step the cascade
// left, see IncrementalPeak::trade_rooms). A copy is two flat vectors, packed tight: copying the committed
// state of a peak (every descent starts from a copy) is a few sequential copies instead of one allocation
// per list.
template <class T>
struct PooledLists {
  struct Slot {
    uint32_t at = 0, size = 0, room = 0;
  };
  PooledLists() = default;
  PooledLists(const PooledLists& o) : slot(o.slot) {
    items.reserve(o.live);
    for (size_t i = 0; i < slot.size(); ++i) {
      const Slot& from = o.slot[i];
      slot[i] = {static_cast<uint32_t>(items.size()), from.size, from.size};
      items.insert(items.end(), o.items.begin() + from.at, o.items.begin() + from.at + from.size);
    }
    live = items.size();
  }
  PooledLists(PooledLists&&) = default;
  PooledLists& operator=(const PooledLists&) = delete;
  // n empty lists, or n lists from (index, item) pairs, each keeping the pairs' order.
  void reset(size_t n) {
    slot.assign(n, Slot{});
    items.clear();
    live = 0;
  }
  void reset(size_t n, const std::vector<std::pair<size_t, T>>& pairs) {
    Lists<T> packed = Lists<T>::grouped(n, pairs);
    slot.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t size = packed.start[i + 1] - packed.start[i];
      slot[i] = {packed.start[i], size, size};
    }
    items = std::move(packed.items);
    live = items.size();
  }
  typename Lists<T>::Span operator[](size_t i) const {
    const Slot& sl = slot[i];
    return {items.data() + sl.at, items.data() + sl.at + sl.size};
  }
  size_t size(size_t i) const { return slot[i].size; }
  bool equals(size_t i, const std::vector<T>& v) const {
    const auto l = (*this)[i];
    return l.size() == v.size() && std::equal(l.begin(), l.end(), v.begin());
  }
  // A list that outgrows its room moves with half as much room again, so that a list growing by a few
  // items at a time (a re-run cascade taking one more layer) moves O(log n) times, not once per item.
  void assign(size_t i, const std::vector<T>& v) {
    Slot& sl = slot[i];
    live = live - sl.size + v.size();
    if (v.size() > sl.room) relocate(sl, v.size() + v.size() / 2);
    std::copy(v.begin(), v.end(), items.begin() + sl.at);
    sl.size = static_cast<uint32_t>(v.size());
  }
  void push_back(size_t i, T v) { insert(i, slot[i].size, v); }
  void insert(size_t i, size_t pos, T v) {
    Slot& sl = slot[i];
    if (sl.size == sl.room) relocate(sl, std::max<size_t>(4, 2 * sl.size));
    std::copy_backward(items.begin() + sl.at + pos, items.begin() + sl.at + sl.size, items.begin() + sl.at + sl.size + 1);
    items[sl.at + pos] = v;
    ++sl.size;
    ++live;
  }
  // Lists i and k trade places (and rooms); their items follow. Only for lists about to be assigned.
  void swap_places(size_t i, size_t k) { std::swap(slot[i], slot[k]); }
  size_t room(size_t i) const { return slot[i].room; }
  void erase(size_t i, size_t pos) {
    Slot& sl = slot[i];
    std::copy(items.begin() + sl.at + pos + 1, items.begin() + sl.at + sl.size, items.begin() + sl.at + pos);
    --sl.size;
    --live;
  }
  std::vector<Slot> slot;
  std::vector<T> items;
  size_t live = 0;  // items in lists

 private:
  void relocate(Slot& sl, size_t room) {
    const auto at = static_cast<uint32_t>(items.size());
    items.resize(items.size() + room);
    std::copy(items.begin() + sl.at, items.begin() + sl.at + sl.size, items.begin() + at);
    sl.at = at;
    sl.room = static_cast<uint32_t>(room);
  }
};

// One node's static record, read by the re-run walk from neighbouring lines: input and output counts,
// its forward workspace, then (key, producer) per input some node produces, (key, storage) per output a
// backward saves, and the storages its forward allocated, as one list of ints.
struct NodeRecord {
  static NodeRecord of(const Lists<int>& records, size_t node) {
    const auto l = records[node];
    return {l.begin(), l.end()};
  }
  const int* r;
  const int* e;
  size_t inputs() const { return static_cast<size_t>(r[0]); }
  size_t outputs() const { return static_cast<size_t>(r[1]); }
  int64_t workspace() const {
    return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(r[3])) << 32) | static_cast<uint32_t>(r[2]));
  }
  int input(size_t i) const { return r[4 + 2 * i]; }
  int producer(size_t i) const { return r[5 + 2 * i]; }
  int output(size_t j) const { return r[4 + 2 * inputs() + 2 * j]; }
  int out_storage(size_t j) const { return r[5 + 2 * inputs() + 2 * j]; }
  const int* alloc_begin() const { return r + 4 + 2 * inputs() + 2 * outputs(); }
  const int* alloc_end() const { return e; }
};

// Per node, in each peak: the mark of the last run that re-ran it and where its record starts (a copy of
// the static list's offset), so that the walk's first read of a node also finds its record.
struct NodeMark {
  uint32_t epoch = 0, at = 0;
};

// Node `node`'s record, found through the peak's marks (NodeMark::at) instead of the list's own offsets.
inline NodeRecord node_record(const Lists<int>& records, const std::vector<NodeMark>& marks, size_t node) {
  return {records.items.data() + marks[node].at, records.items.data() + marks[node + 1].at};
}

// What the measured (keep-everything) run held at a backward step besides the group storages: at its
// start, and at its peak; read together by every re-simulated step.
struct StepOther {
  int64_t start = 0, transient = 0;
};

// What a re-run reads about one saved value (key), in one 20-byte record: its storage (-1 none), its
// producer (negative: a leaf, always usable), the backward step after which it is released, and the step
// that restored it in the committed plan: kHeld where the plan never drops it (no group storage, or the
// group kept), kNoStep where dropped and never restored; and the evaluation's overlay mark. At thousands
// of steps a key's state is one cache miss instead of one per array.
struct KeyRecord {
  static constexpr int32_t kHeld = -1;
  static constexpr int32_t kNoStep = std::numeric_limits<int32_t>::max() / 4;
  int32_t storage = -1, producer = -1, release = kNoStep, restore = kHeld;
  // The evaluation's overlay (IncrementalPeak::in_overlay): its stamp times 4 plus the key's state in the
  // run being evaluated; 0 outside any. Next to the committed state, so a re-run reads one line per key.
  uint32_t over = 0;
};
}  // namespace plan_detail

class IncrementalPeak {
 public:
  // `groups`: the plan's groups (their storages must be droppable); `decisions` per group, Keep or
  // Recompute only.
  IncrementalPeak(const StepProfile& profile, const std::vector<Group>& groups, int64_t extra_fixed_bytes,
                  const std::vector<Decision>& decisions);
  // The same over a profile's graph already built (a plan builds one and shares it).
  IncrementalPeak(std::shared_ptr<const PlanGraph> graph, const std::vector<Group>& groups, int64_t extra_fixed_bytes,
                  const std::vector<Decision>& decisions);
  // The same profile, groups and extra bytes as `like` (whose static data — key ids, node inputs, release
  // steps — is shared, not rebuilt), with other `decisions`. Copies share the static data too and own
  // their committed plan; a peak can be copied, not assigned.
  IncrementalPeak(const IncrementalPeak& like, const std::vector<Decision>& decisions);

  // No early stop: peak_if computes the exact peak.
  static constexpr int64_t kExact = std::numeric_limits<int64_t>::max();

  int64_t peak() const;
  // The peak if group `g` took decision `d` (Keep or Recompute); nothing changes. With `stop_at`, the
  // evaluation stops as soon as some part of the step is known to reach `stop_at` and returns a value
  // >= stop_at that is a lower bound of the peak, not the peak: enough for a caller that only asks
  // whether the peak stays below it (a descent's "does this release lower the peak", a budget check),
  // at a fraction of the cost where a long re-run cascade would otherwise be re-simulated to the end.
  // Below `stop_at` the answer is always exact.
  int64_t peak_if(size_t g, Decision d, int64_t stop_at = kExact);
  // Make group `g` take decision `d`.
  void set(size_t g, Decision d);

  // Offloaded groups (plan/offload_peak.h): a group marked offloaded is held as a kept one is (its values
  // usable, its producer never re-run for it); the caller moves its bytes to where the copy queues put them
  // with range adds on the committed peaks.
  void mark_offloaded(size_t g);
  void add_forward(size_t from, int64_t delta);                 // forward nodes `from` to the last
  void add_backward(size_t from, size_t until, int64_t delta);  // backward steps [from, until)
  // One committed figure: forward node k's, backward step j's (and setting step j's).
  int64_t forward_value(size_t k) const { return forward_.max(k, k); }
  int64_t backward_value(size_t j) const { return backward_.max(j, j); }
  void set_backward_value(size_t j, int64_t value);
  // The first backward step that touches group storage `s` in the committed plan (steps() where none).
  int64_t first_touch(size_t s) const;
  // The last backward step during which a key of storage `s` is held (-1: none is read in backward).
  int64_t last_release(size_t s) const {
    const auto steps = release_steps_[s];
    return steps.empty() ? -1 : *(steps.end() - 1);
  }
  // Watch re-runs' reads: where a step a later peak_if re-simulates has a re-run read a value of storage s
  // before step (*held_from)[s], last_read_early() says so (an offloaded group the simulator would fetch on
  // demand there). Null: not watched.
  void watch_reads(const std::vector<int64_t>* held_from) { held_from_ = held_from; }
  bool last_read_early() const { return read_early_; }
  // Whether every forward and backward figure of `p` is this peak's.
  bool matches(const Prediction& p) const;
  size_t nodes() const { return nn_; }
  size_t steps() const { return nb_; }

  enum class State : uint8_t { Kept, Dropped, Restored, Released };
  // The committed plan's state of key `k` at the start of backward step `j`: it follows from the key's
  // decision, its restore step and its release step.
  State base_state(int k, int64_t j) const {
    const plan_detail::KeyRecord& r = keys_[static_cast<size_t>(k)];
    if (j > r.release) return State::Released;
    if (r.restore == plan_detail::KeyRecord::kHeld) return State::Kept;
    return r.restore < j ? State::Restored : State::Dropped;
  }

 private:
  // Range add, point assign, range max over n values: the values in blocks of kBlock (one cache line),
  // a segment tree over the blocks' maxima (adds kept at the nodes they cover, leaves included).
  struct Tree {
    static constexpr size_t kBlock = 8;
    void init(const std::vector<int64_t>& v);
    void add(size_t l, size_t r, int64_t delta);  // [l, r]
    void assign(size_t i, int64_t value);
    int64_t max(size_t l, size_t r) const;        // [l, r]; INT64_MIN when empty
    // The last position holding the maximum of all n values; n > 0.
    size_t last_argmax() const;
    size_t n = 0, blocks = 0, size = 1;
    std::vector<int64_t> val;         // by value: relative to its block's offset
    std::vector<int64_t> mx, add_at;  // by tree node (leaf size + b: block b)

   private:
    int64_t offset(size_t b) const;            // the adds over block b: its leaf's and its ancestors'
    int64_t scan(size_t l, size_t r) const;    // max of val[l..r]
    void refresh(size_t b);                    // block b's leaf from its values, then its ancestors
    void pull(size_t i);                       // recompute the ancestors of tree node i
    int64_t blocks_max(size_t l, size_t r) const;  // over blocks [l, r]
  };
  // Range add, point query: the values in blocks of Tree::kBlock, adds covering whole blocks in a
  // Fenwick tree over the blocks (an eighth of the values: it stays in the cache).
  struct Fenwick {
    void init(const std::vector<int64_t>& v);
    void add(size_t l, size_t r, int64_t delta);  // [l, r]
    int64_t at(size_t i) const;
    size_t n = 0;
    std::vector<int64_t> val, t;  // t: by block + 1
  };
  // One simulated backward step's results in the run being evaluated.
  struct StepResult {
    int64_t step = 0;
    int64_t value = 0, resident_at_start = 0;
    int64_t gain = 0;           // resident plus transient bytes once the step's re-runs are done, less
                                // resident_at_start
    std::vector<int> touched;   // group storages touched
    std::vector<int> restored;  // keys restored
    // Instead of the lists: the committed step's, with the evaluated storage's keys restored too.
    bool adds_storage_keys = false;
  };
  struct Evaluation {
    size_t storage = 0;
    Decision to = Decision::Keep;
    int64_t peak = 0;
    int64_t first = -1, last = -1;  // backward window [first, last] (first = -1: no window)
    int64_t resident_delta = 0;     // on backward steps before the window
    std::vector<StepResult> steps;  // the window's re-simulated steps, in order: the first `used`
    size_t used = 0;
    // Window steps that touch no key the run holds differently: they run as in the committed plan with
    // `delta` more resident bytes, so their peaks are the committed ones plus `delta`.
    struct Shift {
      int64_t from = 0, to = 0, delta = 0;  // [from, to]
    };
    std::vector<Shift> shifted;
    bool valid = false;
    // The next window step's result, reusing an earlier evaluation's (and its lists' buffers).
    StepResult& add_step() {
      if (used == steps.size()) steps.emplace_back();
      return steps[used++];
    }
  };

  bool dropped(int s) const { return decision_[static_cast<size_t>(s)] == Decision::Recompute; }
  void build();
  struct OverlayState;  // StepRun's view of over_get / over_set
  // `stop_at`: see peak_if; an evaluation stopped early is left invalid (set() evaluates again).
  // `lazy`: a release first consulted as an input at a long re-run step may be rejected without that
  // step's value (see evaluate).
  void evaluate(size_t storage, Decision to, Evaluation& e, int64_t stop_at = kExact, bool lazy = true);
  // evaluate's steps, inline (defined in incremental.cpp and used there only); the window and its step
  // always, so that the compiler reads them as the one loop they were (called apart they cost 1.4% more
  // instructions per evaluation). A release rejected before anything is priced (only_step_differs):
  // true, `e` filled.
  inline bool rejected_unpriced(size_t s, int64_t stop_at, Evaluation& e);
  // A release first consulted as the output of a node its first step re-runs anyway: that step less
  // its bytes, nothing later changes.
  inline void price_restored_in_cascade(size_t s, Evaluation& e, int64_t peak, int64_t stop_at);
  // The backward window from e.first on: re-simulated steps, shifted runs between them, then the rest.
  [[gnu::always_inline]] inline void evaluate_window(size_t s, Evaluation& e, int64_t peak, int64_t stop_at, bool lazy);
  // Step j of the window, re-simulated into e's next step result, `resident` and `peak` carried; true
  // where the evaluation stops there (`peak` then holds what was reached).
  [[gnu::always_inline]] inline bool resimulate_step(Evaluation& e, int64_t j, OverlayState& st, int64_t& resident,
                                                     int64_t& peak, int64_t stop_at);
  // A long step with a release's extension: the keys it restores and releases, without its value;
  // returns the resident bytes at the next step's start.
  inline int64_t step_with_extension(size_t s, int64_t j, OverlayState& st);
  // After window step j: drops the overlay's keys back in the committed plan's state, and returns the
  // next step that touches one still differing (nb_ when none).
  inline int64_t settle_overlay(int64_t j);
  // `p` with the forward part: s's bytes change by `delta` after its last forward need.
  inline int64_t with_forward(size_t s, int64_t delta, int64_t p) const;
  // Stopped early: the peak is known to reach stop_at; what was computed is a lower bound.
  static void stop(Evaluation& e, int64_t peak) {
    e.peak = peak;
    e.valid = false;
  }
  // The nodes a release adds to step j's re-runs (from `ord`, the released storage's producer): marks the
  // keys they restore beyond the committed step's as Restored in the overlay and lists them.
  void extend(int64_t ord, int64_t j, std::vector<int>& restored);
  // A fresh overlay on the committed plan with group storage s's keys in state `keys`.
  void start_overlay(size_t s, State keys);
  // extension_ := the keys that re-running s's producer at step j restores beyond the committed step's.
  void walk_extension(size_t s, int64_t j);
  // A lower bound of step j's value with s released and the extension restoring extension_ there.
  int64_t extended_step_bound(size_t s, int64_t j);
  // The last backward step at the committed plan's backward peak.
  int64_t peak_step();
  // Whether releasing group storage s (kept, restored by its producer) changes its first backward step
  // only (uses the overlay and extension_ as scratch).
  bool only_step_differs(size_t s);
  // The overlay: per key one word (KeyRecord::over), the evaluation's stamp times 4 plus the key's state.
  bool in_overlay(int k) const { return keys_[static_cast<size_t>(k)].over >> 2 == over_stamp_; }
  State overlay_state(int k) const { return static_cast<State>(keys_[static_cast<size_t>(k)].over & 3); }  // in_overlay(k)
  State over_get(int k, int64_t j) const { return in_overlay(k) ? overlay_state(k) : base_state(k, j); }
  void over_set(int k, State v) {
    if (!in_overlay(k)) over_keys_.push_back(k);
    keys_[static_cast<size_t>(k)].over = over_stamp_ << 2 | static_cast<uint32_t>(v);
  }
  void leave_overlay(int k) { keys_[static_cast<size_t>(k)].over = 0; }
  // The first backward step from `j` on that touches group storage `s` or releases one of its keys
  // in the committed plan (nb_ when none).
  int64_t next_event(int s, int64_t j) const;
  void commit(const Evaluation& e);
  void trade_rooms(const Evaluation& e, plan_detail::PooledLists<int>& lists, char unchanged,
                   std::vector<int> StepResult::*list);

  template <class T>
  using Lists = plan_detail::Lists<T>;

  // Static data: depends on the profile, the groups and the extra bytes only; shared by copies (a
  // descent starts from a copy of the all-kept peak) and by peaks built `like` another.
  struct Static {
    Static(std::shared_ptr<const PlanGraph> graph, const std::vector<Group>& groups, int64_t extra);
    // The constructor's steps, in order.
    std::vector<int> number_keys();                          // keys_; returns each graph value's key (-1)
    // nodes_; returns each node's saved keys, counting each key's backward reads in `pending`.
    Lists<int> build_node_records(const std::vector<int>& key_of, std::vector<int64_t>& pending);
    void set_release_steps(const Lists<int>& node_saved, std::vector<int64_t>& pending);  // saved_at_, released_at_
    void find_restored_by_producer();                        // sole_key_, restored_by_producer_
    bool restores_follow_allocations() const;                // extension_bound_'s check
    void measure_other();                                    // other_
    std::shared_ptr<const PlanGraph> graph_;
    const PlanGraph& g_;
    int64_t extra_;
    size_t nn_ = 0, nb_ = 0, nk_ = 0;
    std::vector<int> storage_of_group_;
    std::vector<char> is_group_;                     // by storage
    std::vector<int64_t> bytes_;                     // by storage
    std::vector<int64_t> forward_release_;           // by storage: last forward node that needs it
    std::vector<plan_detail::KeyRecord> keys_;      // by key: storage, producer, release step (the last
                                                     // backward step that reads it); restore kHeld
    Lists<int> storage_keys_;                        // by storage: its saved keys
    Lists<int> nodes_;                               // by node: its record (plan_detail::NodeRecord); an
                                                     // input key is -2 never usable (no backward saves
                                                     // it); inputs no node produces and outputs no
                                                     // backward saves are left out
    Lists<int> saved_at_;                            // by backward step: key ids of its node's saved values
                                                     // (pinned left out)
    Lists<int> released_at_;                         // by backward step: keys released after it
    Lists<int64_t> release_steps_;                   // by storage: its keys' release steps, ascending
    std::vector<char> restored_by_producer_;         // by storage: one node outputs all its keys, allocating it
    std::vector<char> sole_key_;                     // by key: the only key of a group storage
    // Every storage has one allocating node at most and every group storage with keys is restored by its
    // producer: what evaluate's bound on an extended long step assumes (see evaluate).
    bool extension_bound_ = false;
    std::vector<plan_detail::StepOther> other_;      // by backward step
  };
  IncrementalPeak(std::shared_ptr<const Static> shared, const std::vector<Decision>& decisions);
  std::shared_ptr<const Static> static_;
  // Names into *static_ (bound once; a copy binds to the same shared data).
  const PlanGraph& g_;
  const int64_t extra_;
  const size_t nn_, nb_, nk_;
  const std::vector<int>& storage_of_group_;
  const std::vector<char>& is_group_;
  const std::vector<int64_t>& bytes_;
  const std::vector<int64_t>& forward_release_;
  const Lists<int>& storage_keys_;
  const Lists<int>& nodes_;
  const Lists<int>& saved_at_;
  const Lists<int>& released_at_;
  const Lists<int64_t>& release_steps_;
  const std::vector<char>& restored_by_producer_;
  const std::vector<char>& sole_key_;
  const bool extension_bound_;
  const std::vector<plan_detail::StepOther>& other_;

  // The committed plan.
  std::vector<Decision> decision_;                 // by storage
  std::vector<plan_detail::KeyRecord> keys_;       // by key: the static fields, and the committed restore step
  plan_detail::PooledLists<int> restored_at_;      // by backward step
  plan_detail::PooledLists<int> touched_at_;       // by backward step: storage * 2 + 1 where the step
                                                   // first touches it as a re-run node's output, else * 2
  plan_detail::PooledLists<int> touches_;          // by storage: 2 * step + 1 for each step that touches it
                                                   // first as a re-run node's output, 2 * step for the other
                                                   // steps touching it; ascending
  Tree forward_, backward_;
  Fenwick resident_;                               // by backward step: resident bytes at its start
  // By backward step: bytes a run's resident count gains at its start beyond what the walk itself holds (an
  // offloaded group's range, add_backward): the window carries it from step to step.
  std::vector<int64_t> arrive_;
  std::vector<int64_t> step_gain_;                 // by backward step: resident plus transient bytes at its
                                                   // end (before its releases) less resident at its start
                                                   // (shifts and range adds move both alike)
  Evaluation last_;
  int64_t peak_step_ = -1;  // peak_step's answer for the committed plan; -1: not known
  const std::vector<int64_t>* held_from_ = nullptr;  // watch_reads
  bool read_early_ = false;                           // in the last evaluation's re-simulated steps

  // Scratch of the run being simulated (epoch stamps avoid clearing).
  std::vector<plan_detail::NodeMark> node_mark_;  // by node, plus one
  std::vector<uint32_t> transient_epoch_, touch_epoch_;
  std::vector<int> over_keys_;
  uint32_t over_stamp_ = 0, cache_stamp_ = 0, transient_stamp_ = 0;
  std::vector<char> same_;  // commit: per window step, which lists are unchanged
  // commit, by group storage: its one new touch entry among the steps whose lists change (where
  // epoch == move_stamp_), or that it has several, or that its entry has been placed; one record per
  // storage, so that the three passes over a moved cascade's storages read one line each
  struct Move {
    uint32_t epoch;
    int entry;
  };
  std::vector<Move> move_;
  uint32_t move_stamp_ = 0;
  std::vector<int> extension_;  // evaluate: keys a release's extension restores
};

}  // namespace ration::memory
