#include "ration/plan/graph.h"

#include <algorithm>

#include "ration/base/check.h"

namespace ration::memory {

OutputSlots::OutputSlots(const StepProfile& p) : base(p.nodes.size() + 1, 0) {
  for (size_t o = 0; o < p.nodes.size(); ++o) base[o + 1] = base[o] + p.nodes[o].output_storage.size();
}

PlanGraph::PlanGraph(const StepProfile& p)
    : profile(p), nodes(p.nodes.size()), storages(p.storages.size()), steps(p.backward_order.size()), slots(p) {
  RATION_ASSERT(storages < (size_t{1} << 31) && slots.size() < (size_t{1} << 30), "plan graph: profile too large");
  std::vector<ValueKey> leaf_seen, leaf_inputs;
  std::vector<int> out_storage;
  read_nodes(leaf_seen, leaf_inputs, out_storage);
  number_values(leaf_seen, leaf_inputs, out_storage);
  read_value_maps();
  derive_save_spans();
  derive_times();
}

void PlanGraph::read_nodes(std::vector<ValueKey>& leaf_seen, std::vector<ValueKey>& leaf_inputs,
                           std::vector<int>& out_storage) {
  auto output_value = [&](const ValueKey& k) {
    const size_t i = slots.slot(k);
    return i == OutputSlots::kNone ? -1 : static_cast<int>(i);  // a slot until the leaves are counted
  };
  peak_bytes.reserve(nodes);
  end_bytes.reserve(nodes);
  forward_ms.reserve(nodes);
  backward_ms.reserve(nodes);
  out_storage.reserve(slots.size());
  output_node.reserve(slots.size());
  for (const ProfiledNode& n : profile.nodes) {
    for (const ValueKey& k : n.saved) {
      if (k.is_leaf()) {
        saved.add(-2 - static_cast<int>(leaf_seen.size()));
        leaf_seen.push_back(k);
      } else {
        saved.add(output_value(k));
      }
    }
    saved.close();
    for (const ValueKey& k : n.inputs) {
      if (k.is_leaf()) {
        inputs.add({-2 - static_cast<int>(leaf_inputs.size()), static_cast<int>(k.producer), k.output});
        leaf_inputs.push_back(k);
      } else {
        inputs.add({output_value(k), static_cast<int>(k.producer), k.output});
      }
    }
    inputs.close();
    for (int64_t s : n.allocated_storage) allocated.add(static_cast<int>(s));
    allocated.close();
    for (int64_t s : n.output_storage) {
      out_storage.push_back(static_cast<int>(s));
      output_node.push_back(static_cast<int>(peak_bytes.size()));
    }
    peak_bytes.push_back(n.peak_bytes);
    end_bytes.push_back(n.end_bytes);
    forward_ms.push_back(n.forward_ms);
    backward_ms.push_back(n.backward_ms);
  }
}

void PlanGraph::number_values(const std::vector<ValueKey>& leaf_seen, const std::vector<ValueKey>& leaf_inputs,
                              const std::vector<int>& out_storage) {
  leaves = leaf_seen;
  std::sort(leaves.begin(), leaves.end());
  leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
  const int nl = static_cast<int>(leaves.size());
  for (int& v : saved.items) v = v <= -2 ? value(leaf_seen[static_cast<size_t>(-2 - v)]) : v < 0 ? -1 : v + nl;
  for (Input& in : inputs.items)
    in.value = in.value <= -2 ? value(leaf_inputs[static_cast<size_t>(-2 - in.value)]) : in.value < 0 ? -1 : in.value + nl;
  // A leaf's storage is the value map's (as StepProfile::storage_of reads it: read_value_maps), an
  // output's its node's.
  storage.assign(leaves.size(), -1);
  storage.insert(storage.end(), out_storage.begin(), out_storage.end());
}

// The value map, the last-alive map and the saved leaves ascend by key: walked side by side.
void PlanGraph::read_value_maps() {
  const StepProfile& p = profile;
  recorded_storage.assign(slots.size(), -1);
  last_alive.assign(storages, -1);
  auto alive = p.value_last_alive.begin();
  auto leaf = leaves.begin();
  for (const auto& [key, s] : p.value_storage) {
    while (alive != p.value_last_alive.end() && alive->first < key) ++alive;
    if (key.is_leaf()) {
      while (leaf != leaves.end() && *leaf < key) ++leaf;
      if (leaf != leaves.end() && *leaf == key) storage[static_cast<size_t>(leaf - leaves.begin())] = static_cast<int>(s);
      continue;
    }
    if (const size_t i = slots.slot(key); i != OutputSlots::kNone) recorded_storage[i] = static_cast<int>(s);
    if (s < 0) continue;
    const int64_t last = alive == p.value_last_alive.end() || alive->first != key ? static_cast<int64_t>(nodes) : alive->second;
    last_alive[static_cast<size_t>(s)] = std::max(last_alive[static_cast<size_t>(s)], last);
  }
}

// Save spans two ways: by each value's storage as the profile reads it (the copy timeline's), and by
// the simulator's keys (a node output's storage as the value map records it).
void PlanGraph::derive_save_spans() {
  key_storage.assign(values(), -1);
  for (size_t k = 0; k < leaves.size(); ++k) key_storage[k] = storage[k];
  for (size_t i = 0; i < recorded_storage.size(); ++i) key_storage[leaves.size() + i] = recorded_storage[i];
  backward_reads.assign(values(), 0);
  for (SaveSpan* sp : {&span, &key_span}) {
    sp->saved_at.assign(storages, -1);
    sp->first_use.assign(storages, -1);
  }
  auto saved_by = [](SaveSpan& sp, int64_t s, size_t k) {
    if (s < 0) return;
    if (sp.saved_at[static_cast<size_t>(s)] < 0) sp.saved_at[static_cast<size_t>(s)] = static_cast<int64_t>(k);
    sp.first_use[static_cast<size_t>(s)] = static_cast<int64_t>(k);
  };
  for (size_t k = 0; k < nodes; ++k) {
    for (const int v : saved[k]) {
      if (v < 0) {
        if (saved_not_output < 0) saved_not_output = static_cast<int64_t>(k);
        continue;
      }
      ++backward_reads[static_cast<size_t>(v)];
      saved_by(span, storage[static_cast<size_t>(v)], k);
      saved_by(key_span, key_storage[static_cast<size_t>(v)], k);
    }
  }
}

// When each forward node ends and each backward step starts (measured times, summed), and the first
// backward step at or below each ordinal.
void PlanGraph::derive_times() {
  forward_end.resize(nodes);
  double t = 0;
  for (size_t k = 0; k < nodes; ++k) forward_end[k] = (t += forward_ms[k]);
  const auto& bo = profile.backward_order;
  backward_start.resize(bo.size());
  std::vector<int64_t> min_ordinal(bo.size());  // by step: the lowest ordinal among the steps so far
  t = 0;
  for (size_t j = 0; j < bo.size(); ++j) {
    backward_start[j] = t;
    t += backward_ms[static_cast<size_t>(bo[j])];
    min_ordinal[j] = j == 0 ? bo[j] : std::min(min_ordinal[j - 1], bo[j]);
  }
  // The running minimum does not increase: ordinals from its value at j up to its value before j are
  // first reached at j; those below its last value never are (the last step, as the executor issues).
  first_step_below_.assign(nodes, bo.empty() ? 0 : bo.size() - 1);
  int64_t above = static_cast<int64_t>(nodes);
  for (size_t j = 0; j < bo.size(); ++j) {
    const int64_t m = std::max<int64_t>(min_ordinal[j], 0);
    for (int64_t x = m; x < above; ++x) first_step_below_[static_cast<size_t>(x)] = j;
    above = std::min(above, m);
  }
}

int PlanGraph::value(const ValueKey& key) const {
  if (key.is_leaf()) {
    const auto it = std::lower_bound(leaves.begin(), leaves.end(), key);
    return it != leaves.end() && *it == key ? static_cast<int>(it - leaves.begin()) : -1;
  }
  const size_t i = slots.slot(key);
  return i == OutputSlots::kNone ? -1 : static_cast<int>(leaves.size() + i);
}

}  // namespace ration::memory
