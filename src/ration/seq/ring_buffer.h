// ring_buffer.h — a layer's buffer for streaming: the last `capacity` steps of a (B, width) signal.
// Owns: one fixed (B, capacity, width) tensor allocated once, the write position and fill count.
// Does not own: what the steps mean (the layer that reads and pushes them) or how long the buffer is
//       (seq/dependency.h decides: 1, L + 1 or T steps).
// Buffers hold data, not graph values: pushed steps are copied without gradient (gradients stop at chunk
// boundaries).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace ration::seq {

class RingBuffer {
 public:
  RingBuffer(std::string layer, int64_t batch, int64_t capacity, int64_t width, const at::TensorOptions& options);

  // Append steps (B, n, width), n >= 1; only the last `capacity` are kept.
  void push(const at::Tensor& steps);
  // The last min(n, filled()) steps in time order: (B, m, width), a new tensor.
  at::Tensor last(int64_t n) const;
  // Every step pushed, in time order, as a view into the buffer (no copy; writable): only while no step has
  // been overwritten (a type-3 buffer of T steps given at most T); throws naming the layer otherwise.
  at::Tensor held() const;
  int64_t filled() const { return filled_; }
  int64_t capacity() const { return capacity_; }
  int64_t bytes() const { return static_cast<int64_t>(data_.nbytes()); }
  void clear();

 private:
  std::string layer_;
  int64_t capacity_, filled_ = 0, next_ = 0;  // next_: slot the next step is written to
  bool overwritten_ = false;                  // a push went past the capacity
  at::Tensor data_;                           // (B, capacity, width)
};

}  // namespace ration::seq
