// streamable.cpp — StreamBuffers (see streamable.h).
#include "ration/seq/streamable.h"

#include <algorithm>

#include "ration/base/check.h"

namespace ration::seq {

StreamBuffers::StreamBuffers(const std::vector<LayerDependency>& layers, int64_t batch,
                             const at::TensorOptions& options, int64_t seq_len)
    : batch_(batch), seq_len_(seq_len) {
  for (const LayerDependency& d : layers) {
    if (!d.carries) continue;
    RATION_CHECK(d.type != Dependency::WholeSequence || seq_len > 0, "layer '", d.layer,
                 "' depends on the whole sequence (type 3): its buffer holds T steps, so it streams only when the "
                 "sequence length T is given");
    buffers_[d.layer] = std::make_unique<RingBuffer>(d.layer, batch, buffer_steps(d, std::max<int64_t>(seq_len, 1)),
                                                     d.step_floats, options);
  }
}

RingBuffer& StreamBuffers::of(const std::string& layer) {
  auto it = buffers_.find(layer);
  RATION_CHECK(it != buffers_.end(), "no stream buffer for layer '", layer,
               "' (the model's sequence_layers() must declare it with carries = true)");
  return *it->second;
}

int64_t StreamBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& [name, b] : buffers_) total += b->bytes();
  return total;
}

void StreamBuffers::clear() {
  for (auto& [name, b] : buffers_) b->clear();
  position = 0;
}

}  // namespace ration::seq
