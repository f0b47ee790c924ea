// streamable.h — what a model offers to run chunk by chunk (docs/METHODS.md, "Temporal-dependency
// buffers for sequence models").
// Owns: the Streamable interface (declare the layers' temporal dependencies; run one chunk against the
//       buffers) and StreamBuffers, the set of per-layer ring buffers for one stream, sized from the
//       declarations.
// Does not own: the chunk loop, scoring or sampling (streaming/stream_executor.h), or any model's maths.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ration/core/value.h"
#include "ration/seq/dependency.h"
#include "ration/seq/ring_buffer.h"

namespace ration::seq {

// The buffers of one stream: one RingBuffer per declared layer that carries something between chunks
// (LayerDependency::carries), length 1 (type 1) or L + 1 (type 2). Built only for streamable layers.
class StreamBuffers {
 public:
  StreamBuffers(const std::vector<LayerDependency>& layers, int64_t batch, const at::TensorOptions& options);
  // The buffer of `layer`; throws naming the layer when it was not declared.
  RingBuffer& of(const std::string& layer);
  int64_t bytes() const;
  int64_t batch() const { return batch_; }
  int64_t position = 0;  // steps already consumed by the stream (the next chunk starts here)
  void clear();

 private:
  int64_t batch_;
  std::map<std::string, std::unique_ptr<RingBuffer>> buffers_;
};

class Streamable {
 public:
  virtual ~Streamable() = default;
  // Every sequence layer with its type, L and per-step floats, in forward order.
  virtual std::vector<LayerDependency> sequence_layers() const = 0;
  // tokens (B, C): the C steps after buffers.position -> logits (B, C, V), the same as the full-sequence
  // forward's logits for those steps. Reads and pushes the buffers; the caller advances buffers.position.
  virtual Value stream_logits(const Value& tokens, StreamBuffers& buffers) = 0;
};

}  // namespace ration::seq
