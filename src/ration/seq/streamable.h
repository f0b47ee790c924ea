// streamable.h — what a model offers to run chunk by chunk (docs/METHODS.md, "Temporal-dependency
// buffers for sequence models").
// Owns: the Streamable interface (declare the layers' temporal dependencies; run one chunk against the
//       buffers) and StreamBuffers, the set of per-layer ring buffers for one stream, sized from the
//       declarations.
// Does not own: the chunk loop, scoring or sampling (streaming/stream_executor.h), or any model's maths.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ration/core/value.h"
#include "ration/seq/dependency.h"
#include "ration/seq/ring_buffer.h"

namespace ration::seq {

// The buffers of one stream: one RingBuffer per declared layer that carries something between chunks
// (LayerDependency::carries), length 1 (type 1), L + 1 (type 2) or T (type 3, only with seq_len = T > 0:
// a whole-sequence layer holds every step until the sequence ends).
class StreamBuffers {
 public:
  StreamBuffers(const std::vector<LayerDependency>& layers, int64_t batch, const at::TensorOptions& options,
                int64_t seq_len = 0);
  // The buffer of `layer`; throws naming the layer when it was not declared.
  RingBuffer& of(const std::string& layer);
  int64_t bytes() const;
  int64_t batch() const { return batch_; }
  int64_t seq_len() const { return seq_len_; }  // T of the type-3 buffers (0: none)
  int64_t position = 0;  // steps already consumed by the stream (the next chunk starts here)
  void clear();

 private:
  int64_t batch_, seq_len_;
  std::map<std::string, std::unique_ptr<RingBuffer>> buffers_;
};

class Streamable {
 public:
  virtual ~Streamable() = default;
  // Every sequence layer with its type, L and per-step floats, in forward order.
  virtual std::vector<LayerDependency> sequence_layers() const = 0;
  // tokens (B, C): the C steps after buffers.position -> logits (B, C, V), the same as the full-sequence
  // forward's logits for those steps. Reads and pushes the buffers; the caller advances buffers.position.
  // A model with a type-3 layer returns an undefined Value: its outputs wait for the whole sequence.
  virtual Value stream_logits(const Value& tokens, StreamBuffers& buffers) = 0;
  // After the last chunk: the logits still owed, (B, c, V) pieces in time order, at most `chunk` steps each,
  // handed to `emit` one at a time (equal to the full-sequence forward's). Runs without gradient. Models
  // without a type-3 layer owe nothing.
  virtual void finish_logits(StreamBuffers& buffers, int64_t chunk, const std::function<void(const at::Tensor&)>& emit) {}
};

}  // namespace ration::seq
