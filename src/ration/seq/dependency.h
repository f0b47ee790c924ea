// dependency.h — how each layer of a sequence model depends on time, and the buffer that follows from it
// (docs/METHODS.md, "Temporal-dependency buffers for sequence models").
// Owns: the three dependency types, a layer's declaration (type, L, floats per step) and the sequence plan
//       built from the declarations: buffer length (1, L + 1 or T) and bytes per layer, the full-sequence
//       and streamed totals, and the error for a type-3 layer in a model asked to stream without T.
//       The derivation of the types from the operators: each operator a layer runs notes its access on
//       the time axis (note_op, while an OpTrace records), a layer's type follows from its operators'
//       (derive_types), and a declaration that disagrees is an error naming the layer and the operator
//       (check_declarations).
// Does not own: which layers a model has (each model's sequence_layers()), running a model to trace it
//       (streaming/stream_executor.h: trace_temporal_types) or the buffers themselves (seq/ring_buffer.h).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ration::seq {

enum class Dependency : int {
  PerStep = 1,        // type 1: the current step only (pointwise layers; recurrent cells given their state)
  Window = 2,         // type 2: the current step and the previous L (causal convolution, windowed attention)
  WholeSequence = 3,  // type 3: every step (bidirectional recurrence, full attention, sequence pooling)
};
const char* to_string(Dependency d);

// One layer's declaration. `step_floats` is what the layer must hold per time step and batch row between
// chunks when streaming (a recurrent layer's carried state, a convolution's input, attention's keys and
// values) — and, in full-sequence execution, per step of the whole sequence.
struct LayerDependency {
  std::string layer;   // module path, e.g. "blocks.0.attn"
  Dependency type = Dependency::PerStep;
  int64_t window = 0;  // L (type 2 only)
  int64_t step_floats = 0;
  std::string holds;   // what the buffer holds, e.g. "h, c", "input", "keys, values"
  // Whether the buffer lives across chunks (a recurrent state, a convolution's past inputs, cached keys and
  // values). A pointwise layer's one-step buffer is its working memory inside a chunk.
  bool carries = false;
};

// Buffer length in steps for sequence length T: 1, L + 1 or T.
int64_t buffer_steps(const LayerDependency& d, int64_t seq_len);

struct SequencePlanRow {
  LayerDependency layer;
  int64_t buffer_steps = 0;
  int64_t buffer_bytes = 0;    // buffer_steps x step_floats x batch x element size
  int64_t full_seq_bytes = 0;  // T x step_floats x batch x element size
};

struct SequencePlan {
  int64_t seq_len = 0, batch = 1, element_size = 4;
  std::vector<SequencePlanRow> rows;
  int64_t streamed_bytes = 0;  // sum of buffer_bytes
  int64_t full_seq_bytes = 0;  // sum of full_seq_bytes
  // The first type-3 layer, empty when the model can stream.
  std::string whole_sequence_layer() const;
  std::string to_table() const;
  nlohmann::json to_json() const;
};

SequencePlan plan_sequence(const std::vector<LayerDependency>& layers, int64_t seq_len, int64_t batch,
                           int64_t element_size);

// Throws ration::Error naming the first type-3 layer (and `model`) when one is present.
void require_streamable(const std::vector<LayerDependency>& layers, const std::string& model);

// ---- types derived from the operators -----------------------------------------------------------------
// How one operator reads the time axis when it produces step t.
enum class TimeAccess : int {
  Pointwise = 0,      // step t only (embedding, linear, norms, activations)                       -> type 1
  CarriedState = 1,   // step t and its own state after step t - 1 (a forward recurrence's cell)    -> type 1
  CausalWindow = 2,   // steps t - L .. t (causal convolution, windowed attention)                   -> type 2
  WholeSequence = 3,  // steps after t or every earlier step (full attention, a backward recurrence,
                      // pooling over time)                                                          -> type 3
};
const char* to_string(TimeAccess a);
Dependency dependency_of(TimeAccess a);

// One operator as a layer ran it: its layer (module path), a name, its time access and L (CausalWindow).
struct OpAccess {
  std::string layer, op;
  TimeAccess access = TimeAccess::Pointwise;
  int64_t window = 0;
};

// Records the operators noted on this thread while it lives (one at a time per thread).
class OpTrace {
 public:
  OpTrace();
  ~OpTrace();
  OpTrace(const OpTrace&) = delete;
  OpTrace& operator=(const OpTrace&) = delete;
  const std::vector<OpAccess>& ops() const { return ops_; }
  void add(OpAccess op);

 private:
  std::vector<OpAccess> ops_;
  OpTrace* previous_;
};
// Notes an operator of `layer` with its time access where it runs; nothing when no OpTrace records. The
// first form names the layer by the current module scope (core's ScopeGuard path) plus `suffix`.
void note_op(const std::string& op, TimeAccess access, int64_t window = 0, const std::string& suffix = "");
void note_op_of(const std::string& layer, const std::string& op, TimeAccess access, int64_t window = 0);

// A layer's type derived from its operators: the highest of theirs; L the sum of its windows (stacked
// causal windows add up). Layers in the order their first operator ran; an operator noted twice (once per
// step or chunk) is listed once.
struct DerivedLayer {
  std::string layer;
  Dependency type = Dependency::PerStep;
  int64_t window = 0;
  std::vector<OpAccess> ops;
};
std::vector<DerivedLayer> derive_types(const std::vector<OpAccess>& ops);
// Per layer its operators, each with its time access and the type it gives, and the layer's type.
std::string derived_table(const std::vector<DerivedLayer>& layers);
nlohmann::json derived_json(const std::vector<DerivedLayer>& layers);

// Throws ration::Error when a declaration of `model` disagrees with the derivation: a declared type or L
// other than the derived one (naming the layer and the operator that decides it), a declared layer no
// operator ran in, or an operator of a layer that is not declared.
void check_declarations(const std::vector<LayerDependency>& declared, const std::vector<DerivedLayer>& derived,
                        const std::string& model);

}  // namespace ration::seq
