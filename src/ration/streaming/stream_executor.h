// stream_executor.h — runs a language model over a sequence of any length chunk by chunk, with the
// per-layer ring buffers its dependency analysis sizes (docs/METHODS.md, "Temporal-dependency buffers for
// sequence models").
// Owns: the chunk loop (chunk C >= 1), the buffers' lifetime (type-3 buffers of T steps when T is given),
//       scoring a byte stream (bits per byte), sampling (generate), the measured peak of each run (counting
//       allocator), and tracing a model's stream step to derive its layers' types from the operators they
//       run (trace_temporal_types), checked against the model's declarations before any stream starts.
// Does not own: any model's maths (each model's Streamable::stream_logits) or the buffer sizes
//       (seq/dependency.h).
#pragma once
#include <cstdint>
#include <functional>
#include <istream>
#include <memory>
#include <string>

#include "ration/models/model.h"
#include "ration/seq/streamable.h"

namespace ration::seq {

struct StreamMemory {
  int64_t peak_bytes = 0;     // measured peak during the run (counting allocator; parameters included)
  int64_t buffers_bytes = 0;  // the ring buffers' bytes
};

class StreamExecutor {
 public:
  // Throws ration::Error when the model's family does not stream, chunk < 1, a layer's declaration disagrees
  // with the operators it runs (trace_temporal_types), or a layer is type 3 (named) and seq_len is 0.
  // seq_len = T > 0: type-3 layers get buffers of T steps, and the stream may be at most T steps long.
  StreamExecutor(models::Model& model, int64_t chunk, int64_t batch = 1, int64_t seq_len = 0);
  // tokens (B, n), the n steps after those already fed -> logits (B, n, V), computed chunk by chunk.
  // Runs in whatever grad mode the caller set (training through a stream keeps each chunk's graph). A model
  // whose outputs wait for the whole sequence (type 3, e.g. birnn_tagger) returns an undefined tensor: its
  // logits come from finish().
  at::Tensor feed(const at::Tensor& tokens);
  // One chunk (B, c <= chunk) as a graph value: logits (B, c, V) (undefined when they wait for finish()).
  // Advances the position.
  Value feed_chunk(const Value& tokens);
  // After the last chunk: the logits the model still owes (type 3), (B, c <= chunk, V) pieces in time order
  // handed to `emit`; no grad. finish() returns them concatenated (B, n, V) (undefined when none are owed).
  void finish(const std::function<void(const at::Tensor&)>& emit);
  at::Tensor finish();
  void reset() { buffers_->clear(); }
  StreamBuffers& buffers() { return *buffers_; }
  int64_t chunk() const { return chunk_; }
  int64_t position() const { return buffers_->position; }
  // Tokens the model knows: bytes must lie in [0, vocab_size()) (a language model's model.vocab_size; 256
  // for a model that does not say).
  int64_t vocab_size() const;

 private:
  models::Model& model_;
  Streamable& streamable_;
  int64_t chunk_;
  std::vector<LayerDependency> layers_;
  std::unique_ptr<StreamBuffers> buffers_;
};

// Runs one probe chunk of `probe_steps` tokens through the model's stream step (and finish) with an OpTrace
// recording, derives each layer's type from the operators it ran and checks the model's declarations
// against it (seq::check_declarations: an error names the layer and the operator). Returns the derived
// layers, in the order they ran.
std::vector<DerivedLayer> trace_temporal_types(models::Model& model, int64_t probe_steps = 4);

struct StreamScore {
  double bits_per_byte = 0;
  int64_t tokens = 0;  // bytes predicted (the stream's length minus one)
  double seconds = 0;
  StreamMemory memory;
};
// Bits per byte of a byte stream read C bytes at a time: mean of -log2 p(byte t+1 | bytes ..t), no grad.
// Memory does not grow with the stream's length for type-1/2 models. `what` names the input in errors.
StreamScore score_bytes(StreamExecutor& executor, std::istream& in, const std::string& what);

struct Generated {
  std::string text;     // the sampled continuation (without the prompt)
  int64_t tokens = 0;   // sampled (fewer than asked when `on_token` stopped it)
  double seconds = 0;
  StreamMemory memory;
};
// Feeds `prompt` then samples `n_tokens` bytes one step at a time (temperature 0: argmax), no grad.
// `on_token`, if given, sees each byte as it is sampled (to show it at once) and returns false to stop.
Generated generate(StreamExecutor& executor, const std::string& prompt, int64_t n_tokens, double temperature,
                   uint64_t seed, const std::function<bool(char)>& on_token = {});

// The loss of steps [start, start + n) of inputs/targets (B, T), fed as the executor's next chunk: mean
// cross entropy over the chunk's B n tokens times n / T, so that the chunks of one sequence sum to its
// mean (the factor is left out when n = T: one chunk is exactly the full-sequence loss).
Value chunk_loss(StreamExecutor& executor, const at::Tensor& inputs, const at::Tensor& targets, int64_t start,
                 int64_t n);

// Truncated backpropagation through time over targets (B, T) for inputs (B, T): chunk by chunk, each chunk's
// mean-weighted cross entropy is backpropagated before the next chunk runs, so the graph never spans more
// than one chunk; state and the last L inputs carry across chunks as data (gradients stop at chunk
// boundaries). Gradients accumulate into the parameters (call zero_grad first). Returns the mean loss over
// all B T tokens. With chunk >= T it is ordinary backpropagation through the whole sequence.
double truncated_bptt(StreamExecutor& executor, const at::Tensor& inputs, const at::Tensor& targets);

}  // namespace ration::seq
