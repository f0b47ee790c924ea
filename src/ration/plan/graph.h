// plan/graph.h — one measured step (profile.h) as the planner reads it: flat arrays of 32-bit ids,
// built in one pass over the profile per plan. A profile keeps each node's lists in vectors of their own
// and its values' storages in maps; a plan walks them several times (groups and their costs, the
// incremental peak's static data, every whole-step simulation), and at thousands of nodes those walks
// miss the core's caches on every node. This form is a few hundred bytes per layer, read in order.
// Owns: value numbering (saved leaves, then node outputs by position), each value's storage, each node's
//       saved values, inputs and allocations, the per-node and per-storage figures the planner reads.
// Does not own: what the figures mean (profile.h), the rules that use them (plan/simulator.h,
//       plan/incremental.h, plan/context.h).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "ration/plan/profile.h"

namespace ration::memory {

namespace plan_detail {
// Read-only lists by index, stored back to back (one allocation, walked in order) instead of one vector
// each: the re-run walk reads a node's inputs, outputs and allocations from neighbouring lines.
template <class T>
struct Lists {
  struct Span {
    const T* b;
    const T* e;
    const T* begin() const { return b; }
    const T* end() const { return e; }
    size_t size() const { return static_cast<size_t>(e - b); }
    bool empty() const { return b == e; }
    const T& operator[](size_t i) const { return b[i]; }
    const T& front() const { return *b; }
  };
  // Built in index order: add() a list's items, then close() it.
  void add(T v) { items.push_back(v); }
  void close() { start.push_back(static_cast<uint32_t>(items.size())); }
  // Lists 0..n-1 from (index, item) pairs, each list keeping the pairs' order.
  static Lists grouped(size_t n, const std::vector<std::pair<size_t, T>>& pairs) {
    Lists l;
    l.start.assign(n + 1, 0);
    for (const auto& pr : pairs) ++l.start[pr.first + 1];
    for (size_t i = 0; i < n; ++i) l.start[i + 1] += l.start[i];
    l.items.resize(pairs.size());
    std::vector<size_t> at(l.start.begin(), l.start.end() - 1);
    for (const auto& pr : pairs) l.items[at[pr.first]++] = pr.second;
    return l;
  }
  Span operator[](size_t i) const { return {items.data() + start[i], items.data() + start[i + 1]}; }
  std::vector<uint32_t> start{0};
  std::vector<T> items;
};

}  // namespace plan_detail

// Every node output numbered by position: node o's outputs are slots base[o] .. base[o + 1] - 1, so
// per-value tables are vectors indexed by slot instead of maps keyed by ValueKey.
struct OutputSlots {
  static constexpr size_t kNone = static_cast<size_t>(-1);
  explicit OutputSlots(const StepProfile& p);
  size_t size() const { return base.back(); }
  size_t first(size_t node) const { return base[node]; }
  // kNone: a leaf, or an index past its node's outputs.
  size_t slot(const ValueKey& k) const {
    if (k.is_leaf() || static_cast<size_t>(k.producer) + 1 >= base.size() || k.output < 0) return kNone;
    const size_t i = base[static_cast<size_t>(k.producer)] + static_cast<size_t>(k.output);
    return i < base[static_cast<size_t>(k.producer) + 1] ? i : kNone;
  }
  std::vector<size_t> base;  // by node, plus one past the last
};

// Per storage: the first forward ordinal whose node saves it and the last one (its first use in backward).
struct SaveSpan {
  std::vector<int64_t> saved_at, first_use;  // -1: never saved
};

struct PlanGraph {
  explicit PlanGraph(const StepProfile& profile);
  PlanGraph(const PlanGraph&) = delete;
  PlanGraph& operator=(const PlanGraph&) = delete;

  const StepProfile& profile;  // names (op, scope) and the backward figures (already flat vectors)
  size_t nodes = 0, storages = 0, steps = 0;  // steps: backward nodes

  // Values: the saved leaves (ascending key), then every node output by slot (OutputSlots).
  OutputSlots slots;
  std::vector<ValueKey> leaves;
  size_t values() const { return leaves.size() + slots.size(); }
  size_t first_output(size_t node) const { return leaves.size() + slots.first(node); }
  // -1: neither a saved leaf nor an output of its node.
  int value(const ValueKey& key) const;
  bool is_leaf(int v) const { return static_cast<size_t>(v) < leaves.size(); }
  // A node output's producer and index among its outputs.
  int producer(int v) const { return output_node[static_cast<size_t>(v) - leaves.size()]; }
  int output(int v) const {
    return static_cast<int>(static_cast<size_t>(v) - first_output(static_cast<size_t>(producer(v))));
  }
  std::vector<int> output_node;  // by output slot: its node
  // By value: its storage as StepProfile::storage_of reads it (-1: none).
  std::vector<int> storage;
  // By output slot: the storage the profile's value map records for it (-1: none, or not recorded).
  std::vector<int> recorded_storage;
  // By storage: the last forward ordinal during which model code held a value on it (nodes: held past
  // forward; -1: no recorded node output on it).
  std::vector<int64_t> last_alive;

  struct Input {
    int value;     // -1: a leaf no backward saves, or an output index past its node's outputs
    int producer;  // -1: a leaf
    int output;
  };
  // An input's storage as StepProfile::storage_of reads it (an input with no id: the profile's map).
  int64_t storage_of(const Input& in) const {
    return in.value >= 0 ? storage[static_cast<size_t>(in.value)] : profile.storage_of(ValueKey{in.producer, in.output});
  }
  plan_detail::Lists<int> saved;        // by node: value ids its backward reads
  plan_detail::Lists<Input> inputs;     // by node
  plan_detail::Lists<int> allocated;    // by node: storages its forward allocated
  std::vector<int64_t> peak_bytes, end_bytes;  // by node (profile.h)
  std::vector<double> forward_ms, backward_ms; // by node
  // Derived once for every plan's tries (the copy queues' timeline reads them on each): the save span;
  // by node, when its forward ends (measured times, summed); by backward step, when it starts.
  SaveSpan span;
  std::vector<double> forward_end, backward_start;
  // The simulator's view of saved values (plan/simulator.h), the same for every simulation: by value, its
  // storage as the value map records it (a leaf's: as the profile reads it) and how many backward nodes
  // read it; by such storage, its save span. `saved_not_output`: the first node that saves a value that
  // is not one of its outputs (-1: none; the simulator refuses such a profile).
  std::vector<int64_t> key_storage;
  std::vector<int> backward_reads;
  SaveSpan key_span;
  int64_t saved_not_output = -1;
  // The first backward step j where some step <= j runs a node whose ordinal is <= `ordinal` (the last
  // step where none does): when a read for that ordinal is issued (the executor's rule).
  size_t first_step_at_or_below(int64_t ordinal) const {
    if (steps == 0) return 0;
    if (ordinal < 0) return steps - 1;
    return static_cast<size_t>(ordinal) < first_step_below_.size() ? first_step_below_[static_cast<size_t>(ordinal)] : 0;
  }

 private:
  // The constructor's steps, in order. One pass over the nodes: their lists and figures, a leaf as
  // -2 - its index in `leaf_seen` (saved lists) or `leaf_inputs` (inputs) until all are known; the outputs'
  // storages into `out_storage`.
  void read_nodes(std::vector<ValueKey>& leaf_seen, std::vector<ValueKey>& leaf_inputs, std::vector<int>& out_storage);
  // The saved leaves numbered, every value id resolved, each value's storage.
  void number_values(const std::vector<ValueKey>& leaf_seen, const std::vector<ValueKey>& leaf_inputs,
                     const std::vector<int>& out_storage);
  void read_value_maps();     // recorded_storage, last_alive and the leaves' storages
  void derive_save_spans();   // key_storage, backward_reads, span, key_span, saved_not_output
  void derive_times();        // forward_end, backward_start, first_step_below_

  std::vector<size_t> first_step_below_;  // by ordinal (first_step_at_or_below)
};

}  // namespace ration::memory
