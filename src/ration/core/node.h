// node.h — one recorded op in the graph, and apply_op(), the single way ops enter it.
// Owns: Node (forward closure for recompute, backward closure, edges, saved references, RNG seed,
//       measured forward time, module scope), OpSpec, ForwardCtx, BackwardCtx.
// Does not own: residency of saved tensors (core/saved_value.h decides keep/drop/offload).
//
// An op is defined in one place (ops/*.cpp) as: a forward closure inputs -> outputs, a backward closure
// grad_outputs -> grad_inputs, and OpSpec listing which inputs/outputs backward reads. Outputs past
// `visible_outputs` are internal (e.g. layer_norm's mean/rstd, dropout's mask): they are never returned
// to the caller but can be saved like any other. Because the forward closure is kept, any node can be
// re-run from its inputs (recompute); RNG-consuming ops get a recorded seed so the rerun is identical.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ration/core/value.h"

namespace ration {

class SavedValue;
class ReplicaGroup;

struct ForwardCtx {
  // Set for ops whose OpSpec says uses_rng: a generator seeded from the node's recorded seed.
  std::optional<at::Generator> generator;
};

class BackwardCtx;
using ForwardFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs, ForwardCtx& ctx)>;
using BackwardFn =
    std::function<std::vector<at::Tensor>(BackwardCtx& ctx, const std::vector<at::Tensor>& grad_outputs)>;

struct OpSpec {
  std::string name;
  int visible_outputs = 1;         // leading outputs returned as Values
  std::vector<int> save_inputs;    // indexes of inputs backward reads
  std::vector<int> save_outputs;   // indexes of outputs (visible or internal) backward reads
  bool uses_rng = false;           // forward draws random numbers (gets ForwardCtx::generator)
  // Saved inputs identical on every process of `replicas` (tensor parallel): marked when saved, before
  // any memory policy sees the node, so every process makes the same offload decision.
  std::vector<int> replicated_inputs;
  std::shared_ptr<ReplicaGroup> replicas;
};

// An edge: where the gradient for one input goes. Its strong hold on the producer is also what keeps a
// producer alive while the consumer may need its output rebuilt (saved handles hold producers weakly).
struct Edge {
  std::shared_ptr<Node> node;        // non-leaf: producer node of the input
  int output_nr = 0;
  std::shared_ptr<ValueImpl> leaf;   // leaf requiring grad: accumulate here
  bool valid() const { return node != nullptr || leaf != nullptr; }
};

struct TensorMeta {
  std::vector<int64_t> sizes;
  at::TensorOptions options;
};

// A reference from a node to a saved handle, with the version the tensor had when it was saved.
struct SavedRef {
  std::shared_ptr<SavedValue> value;
  uint32_t version = 0;
  bool is_output = false;
  int index = 0;  // input or output index
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  OpSpec spec;
  uint64_t seq = 0;                  // creation order; backward runs highest first
  // Position in the training step that recorded it (0 = the step's first node), stamped once by the
  // step's memory runtime (memory::StepOrder); -1 when no runtime was driving the step.
  int64_t ordinal = -1;
  std::string scope;                 // module path at creation ("blocks.3.mlp")
  ForwardFn forward;
  BackwardFn backward;
  std::optional<uint64_t> rng_seed;
  double forward_ms = 0;             // measured time of the forward closure

  std::vector<std::shared_ptr<SavedValue>> inputs;  // one per input (null if undefined): recompute source
  std::vector<Edge> next_edges;                     // one per input: gradient routing
  std::vector<TensorMeta> input_meta;               // to check gradient shapes
  std::vector<TensorMeta> output_meta;              // all outputs, to zero-fill missing gradients
  std::vector<std::weak_ptr<SavedValue>> outputs;   // handles of outputs, created lazily
  std::vector<std::weak_ptr<ValueImpl>> output_values;  // the Values handed to model code (lifetime probes)
  std::vector<SavedRef> saved;                      // what backward reads
  bool released = false;                            // backward ran and freed its saved values


  // Re-run forward from the inputs (recursively rebuilding any input that is not resident) with the
  // recorded RNG seed. Outputs whose handles are dropped but still awaited by backward are stored back
  // into those handles (SavedValue::accept_rebuilt), unless the re-run is transient: `store_required` false (the outputs only feed
  // another re-run) and the policy's store_rebuilt(*this) says no; a transient re-run stores nothing
  // and is not remembered by the RecomputeCache. All outputs are returned.
  std::vector<at::Tensor> recompute(bool store_required = false);

  // Get or create the shared handle for output j.
  std::shared_ptr<SavedValue> output_handle(int j);
};

class BackwardCtx {
 public:
  explicit BackwardCtx(Node& node) : node_(node) {}
  // Saved input i / output j, made resident if it was dropped or offloaded.
  at::Tensor input(int i);
  at::Tensor output(int j);
  bool needs_input_grad(int i) const;
  const Node& node() const { return node_; }

 private:
  at::Tensor unpack(bool is_output, int index);
  Node& node_;
};

// Run an op: in engine mode records a Node (when any input requires grad and grad mode is on); in oracle
// mode runs the forward on torch-autograd tensors. Returns the visible outputs.
Values apply_op(const OpSpec& spec, const Values& inputs, ForwardFn forward, BackwardFn backward);

// While one backward node runs, every producer re-run to rebuild its saved values is remembered, so
// values sharing producers (q, k, v split from one projection) are rebuilt once. The engine opens one
// cache per backward node; the tensors it holds are freed when that node finishes.
class RecomputeCache {
 public:
  RecomputeCache();
  ~RecomputeCache();
  RecomputeCache(const RecomputeCache&) = delete;
  RecomputeCache& operator=(const RecomputeCache&) = delete;
  static RecomputeCache* current();
  const std::vector<at::Tensor>* find(const Node* node) const;
  void insert(const Node* node, std::vector<at::Tensor> outputs);

 private:
  std::unordered_map<const Node*, std::vector<at::Tensor>> entries_;
  RecomputeCache* prev_;
};

// Module scope: nodes record the dotted path of the modules active when they are created.
class ScopeGuard {
 public:
  explicit ScopeGuard(const std::string& name);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  size_t prev_len_;
};
const std::string& current_scope();

// Seeds for RNG-consuming ops come from one stream; set it for reproducible runs.
void manual_seed(uint64_t seed);
uint64_t next_op_seed();
at::Generator make_generator(uint64_t seed, const at::Device& device);

}  // namespace ration
