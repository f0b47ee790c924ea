// ring_buffer.cpp — see ring_buffer.h.
#include "ration/seq/ring_buffer.h"

#include <ATen/core/grad_mode.h>

#include "ration/base/check.h"
#include "ration/core/value.h"

namespace ration::seq {

RingBuffer::RingBuffer(std::string layer, int64_t batch, int64_t capacity, int64_t width,
                       const at::TensorOptions& options)
    : layer_(std::move(layer)), capacity_(capacity) {
  RATION_CHECK(batch >= 1 && capacity >= 1 && width >= 1, "ring buffer for layer '", layer_,
               "' needs positive batch, capacity and width; got ", batch, ", ", capacity, ", ", width);
  data_ = at::zeros({batch, capacity, width}, options.requires_grad(false));
}

void RingBuffer::push(const at::Tensor& steps) {
  RATION_CHECK(steps.dim() == 3 && steps.size(0) == data_.size(0) && steps.size(2) == data_.size(2),
               "ring buffer for layer '", layer_, "' takes steps (B=", data_.size(0), ", n, width=", data_.size(2),
               "); got ", steps.sizes());
  at::NoGradGuard no_grad;
  const int64_t n = steps.size(1);
  const int64_t take = std::min(n, capacity_);
  const at::Tensor kept = steps.narrow(1, n - take, take);
  // Write in at most two contiguous runs: [next_, capacity) then [0, ...).
  const int64_t first = std::min(take, capacity_ - next_);
  data_.narrow(1, next_, first).copy_(kept.narrow(1, 0, first));
  if (take > first) data_.narrow(1, 0, take - first).copy_(kept.narrow(1, first, take - first));
  next_ = (next_ + take) % capacity_;
  overwritten_ = overwritten_ || filled_ + n > capacity_;
  filled_ = std::min(capacity_, filled_ + n);
}

at::Tensor RingBuffer::last(int64_t n) const {
  const int64_t m = std::min(n, filled_);
  if (m == 0) return data_.narrow(1, 0, 0).clone();
  const int64_t start = ((next_ - m) % capacity_ + capacity_) % capacity_;
  const int64_t first = std::min(m, capacity_ - start);
  if (first == m) return data_.narrow(1, start, m).clone();
  return at::cat({data_.narrow(1, start, first), data_.narrow(1, 0, m - first)}, 1);
}

at::Tensor RingBuffer::held() const {
  RATION_CHECK(!overwritten_, "layer '", layer_, "' was given more than the ", capacity_,
               " steps its buffer holds; a whole-sequence (type 3) layer needs the sequence length T up front");
  return data_.narrow(1, 0, filled_);
}

void RingBuffer::clear() {
  data_.zero_();
  filled_ = 0;
  next_ = 0;
  overwritten_ = false;
}

}  // namespace ration::seq
