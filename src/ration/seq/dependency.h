// dependency.h — how each layer of a sequence model depends on time, and the buffer that follows from it
// (docs/METHODS.md, "Temporal-dependency buffers for sequence models").
// Owns: the three dependency types, a layer's declaration (type, L, floats per step) and the sequence plan
//       built from the declarations: buffer length (1, L + 1 or T) and bytes per layer, the full-sequence
//       and streamed totals, and the error for a type-3 layer in a model asked to stream.
// Does not own: which layers a model has (each model's sequence_layers()) or the buffers themselves
//       (seq/ring_buffer.h).
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

}  // namespace ration::seq
