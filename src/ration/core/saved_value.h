// saved_value.h — the one handle through which every tensor saved for backward passes.
// Owns: SavedValue (state machine resident/dropped/offloaded/released, pending-use count, version
//       check, recompute on demand) and MemoryPolicy (the thread's hook into forward, backward and
//       recompute; train::StepRuntime installs one with PolicyScope so model code never changes, and
//       tests may install their own).
// Does not own: the decision of what to drop (planner) or how to offload (offload engine).
//
// States:
//   Unsaved   — referenced only as a recompute input; holds no data.
//   Resident  — data held in memory (saved in forward, or rebuilt by recompute / fetched back).
//   Dropped   — data freed by policy; backward rebuilds it by re-running the producer. A re-run made
//               only to feed another re-run may leave it Dropped (MemoryPolicy::store_rebuilt).
//   Offloaded — data moved to another tier by policy; backward fetches it back (policy->fetch).
//   Released  — backward consumed its last use; a later backward through it is an error.
// Leaves and constants (no producer) are pinned: always Resident, never released.
//
// Ownership: a handle holds its producer node weakly. A graph is owned from its outputs backwards (a
// Value holds its grad_fn; a node holds its inputs' handles and, through its edges, their producers),
// so a node that saves its own output forms no cycle and the whole graph goes with its last Value,
// whether or not backward ran. While a handle is read — by the consumer that saved it, or by a re-run
// rebuilding a consumer's input — that consumer is alive and holds the producer through its edge, so a
// dropped value can always be rebuilt (docs/ARCHITECTURE.md, Between core and memory).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ration {

class Node;

// Processes on which a saved value is identical (e.g. the input of a tensor-parallel layer): the offload
// engine may store 1/size() of it per process and rebuild it by all-gather (docs/METHODS.md, Sharded
// offload over a process group).
// Implemented over c10d in dist/; every process must fetch such values in the same order.
class ReplicaGroup {
 public:
  virtual ~ReplicaGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every process passes a 1-D uint8 shard of the same length; returns the shards
  // concatenated in rank order (length size() * shard length).
  virtual at::Tensor all_gather(const at::Tensor& shard) = 0;
};

enum class SavedState { Unsaved, Resident, Dropped, Offloaded, Released };
const char* to_string(SavedState s);

class SavedValue {
 public:
  SavedValue(std::shared_ptr<Node> producer, int output_nr, int64_t nbytes);
  // A pinned handle for a leaf or constant.
  explicit SavedValue(const at::Tensor& leaf);
  SavedValue(const SavedValue&) = delete;
  SavedValue& operator=(const SavedValue&) = delete;

  uint64_t id() const { return id_; }
  SavedState state() const { return state_; }
  bool pinned() const { return producer_seq_ == 0; }
  // The producer node; null for a pinned handle, or once the graph it belonged to is gone.
  std::shared_ptr<Node> producer() const { return producer_.lock(); }
  int output_nr() const { return output_nr_; }
  const std::string& label() const { return label_; }

  // Forward: a node saves this value (data is the tensor as produced). Returns its version now.
  uint32_t save(const at::Tensor& data);
  // Backward: the tensor, rebuilt or fetched if needed; checks it was not modified in place.
  at::Tensor unpack(uint32_t expected_version);
  // Recompute: the tensor for use as a producer's input; not stored unless backward still awaits it.
  at::Tensor materialize();
  // Backward finished one use; frees the data after the last one (unless retained).
  void release_use(bool retain);
  // A re-run of the producer rebuilt this value: stored (and accounted as a saved activation) when the
  // policy dropped it and backward still awaits it (Dropped); otherwise ignored.
  void accept_rebuilt(const at::Tensor& data);

  // Policy actions.
  void drop();                               // Resident -> Dropped (data freed)
  void mark_offloaded();                     // Resident -> Offloaded (policy holds the copy)
  void restore(const at::Tensor& data);      // Dropped/Offloaded -> Resident
  void offload_failed();                     // Offloaded -> Dropped (the tier lost it: recompute)
  const at::Tensor& data() const { return data_; }
  // Processes holding the same value (null: this process only).
  void set_replicas(std::shared_ptr<ReplicaGroup> group) { replicas_ = std::move(group); }
  const std::shared_ptr<ReplicaGroup>& replicas() const { return replicas_; }

 private:
  std::shared_ptr<Node> live_producer() const;  // the producer, which must be alive (asserted)
  uint64_t id_;
  std::weak_ptr<Node> producer_;
  uint64_t producer_seq_ = 0;
  int output_nr_ = 0;
  at::Tensor data_;
  SavedState state_ = SavedState::Unsaved;
  int pending_uses_ = 0;
  int64_t nbytes_ = 0;
  std::string label_;
  std::shared_ptr<ReplicaGroup> replicas_;
};

// The memory runtime's policy hook. Default: keep everything resident.
class MemoryPolicy {
 public:
  virtual ~MemoryPolicy() = default;
  // A node finished its forward; `node.saved` lists the values it saved. `inputs` / `outputs` are the
  // tensors it consumed and produced (all outputs, internal ones included).
  virtual void after_forward_node(Node& /*node*/, const std::vector<at::Tensor>& /*inputs*/,
                                  const std::vector<at::Tensor>& /*outputs*/) {}
  // Backward is about to run `node` (prefetch point).
  virtual void before_backward_node(Node& /*node*/) {}
  // Backward finished `node` and released what it no longer needs.
  virtual void after_backward_node(Node& /*node*/) {}
  // Backward needs an Offloaded value: return its data, or, when the copy was lost (a full or failing
  // tier), mark it Dropped (SavedValue::offload_failed) and return an undefined tensor: unpack then
  // rebuilds it by recompute like any dropped value.
  virtual at::Tensor fetch(SavedValue& value);
  // A value was rebuilt by recompute (for accounting).
  virtual void on_recompute(Node& /*node*/, double /*ms*/) {}
  // Recompute is re-running `producer` to rebuild an input of another re-run (not a value backward
  // reads right now): true (default) stores its dropped, still-awaited outputs back into their handles
  // and keeps its outputs in the node's RecomputeCache; false makes the re-run transient: its outputs
  // live only while the consumer that asked for them runs, and a later need re-runs it again
  // (Revolve-style recompute without storing).
  virtual bool store_rebuilt(Node& /*producer*/) { return true; }
};

MemoryPolicy* current_policy();  // null when none installed
class PolicyScope {
 public:
  explicit PolicyScope(MemoryPolicy* policy);
  ~PolicyScope();
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;

 private:
  MemoryPolicy* prev_;
};

}  // namespace ration
