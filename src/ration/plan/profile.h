// profile.h — one measured step: what every node produced, saved and cost, and the memory measured at
// every node boundary of forward and backward. The budget planner plans from this, never from guesses.
// Owns: ProfilePolicy (a StepPolicy that keeps everything and records), StepProfile (the trace).
// Does not own: the nodes' positions in the step (StepOrder, stamped by the step runtime before
//       ProfilePolicy sees a node) or when the step begins and ends (train::StepRuntime::profile).
//
// Keys: a graph value is named within a step by (producer ordinal, output index); ordinals count the
// recorded nodes of the step from 0 in creation order (step_order.h), so the same model on a
// same-shaped batch gives the same keys every step. Storages: tensors that share memory (views) map to one storage id; a
// "group" is a saved storage, owned by the node that allocated it (the unit the planner keeps or drops).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ration/core/value.h"
#include "ration/core/saved_value.h"
#include "ration/core/step_order.h"
#include "ration/core/step_policy.h"

namespace ration::memory {

// A graph value within a step: which node produced it and which of its outputs it is.
struct ValueKey {
  int64_t producer = -1;  // the producing node's position in the step; -1: a leaf or constant
  int output = 0;         // index among that node's outputs
  bool is_leaf() const { return producer < 0; }
  friend bool operator<(const ValueKey& a, const ValueKey& b) {
    return a.producer != b.producer ? a.producer < b.producer : a.output < b.output;
  }
  friend bool operator==(const ValueKey& a, const ValueKey& b) { return a.producer == b.producer && a.output == b.output; }
  friend bool operator!=(const ValueKey& a, const ValueKey& b) { return !(a == b); }
};

struct ProfiledNode {
  std::string op;
  std::string scope;              // module path ("blocks.3.attn")
  double forward_ms = 0;          // measured
  double backward_ms = 0;         // measured
  std::vector<ValueKey> inputs;   // undefined inputs omitted
  std::vector<int64_t> output_storage;     // storage id of each output (-1: undefined)
  std::vector<int64_t> allocated_storage;  // storages this node's forward allocated (not views of inputs)
  std::vector<ValueKey> saved;    // values its backward reads
  int64_t peak_bytes = 0;         // measured peak during its forward (interval since the previous node)
  int64_t end_bytes = 0;          // measured live bytes when its forward returned
};

struct ProfiledStorage {
  int64_t bytes = 0;
  int64_t allocated_by = -1;      // node ordinal (-1: leaf, constant or allocated outside the graph)
};

struct StepProfile {
  std::vector<ProfiledNode> nodes;                // by ordinal
  std::vector<ProfiledStorage> storages;          // by storage id
  std::map<ValueKey, int64_t> value_storage;      // every value seen -> storage id
  // Last forward ordinal during which model code still held the Value (absent: held past forward).
  std::map<ValueKey, int64_t> value_last_alive;
  std::vector<int64_t> backward_order;            // node ordinals in execution order
  std::vector<int64_t> backward_peak_bytes;       // measured peak during each backward node (same order)
  std::vector<int64_t> backward_start_bytes;      // measured live bytes as each backward node starts
  int64_t baseline_bytes = 0;                     // measured before forward
  // All byte figures exclude Category::Data (the dataset held in host memory); see allocator.h.
  int64_t measured_peak_bytes = 0;                // whole step
  double forward_ms = 0, backward_ms = 0;

  int64_t storage_of(const ValueKey& k) const;
};

class ProfilePolicy : public StepPolicy {
 public:
  // `order` numbers the step's nodes (the runtime stamps each node before this policy sees it).
  explicit ProfilePolicy(const StepOrder& order);
  void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) override;
  void before_backward_node(Node& node) override;
  void after_backward_node(Node& node) override;
  // Call after backward returned.
  StepProfile finish();

 private:
  int64_t storage_id(const at::Tensor& t);
  ValueKey key_of(const SavedValue& v) const;
  const StepOrder& order_;
  StepProfile profile_;
  struct Seen {
    int64_t id;
    c10::weak_intrusive_ptr<c10::StorageImpl> weak;  // a freed-and-reused address is a new storage
  };
  std::unordered_map<const void*, Seen> storage_ids_;
  void sweep_dead_values(int64_t now);
  std::vector<std::pair<ValueKey, std::weak_ptr<ValueImpl>>> live_values_;
  int64_t excluded_bytes_ = 0;  // host-side dataset storage (Category::Data): not device memory
  double backward_start_ms_ = 0;
  int64_t current_backward_ = -1;
};

}  // namespace ration::memory
