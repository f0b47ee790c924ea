// batch_util.h — synthetic batches for the planner and training tests.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "ration/data/batch.h"

namespace ration::testing {

// Seeded with `seed`: `n` random 1x28x28 images with classes 0-9 (`images`), or `n` random byte sequences of
// `len` tokens whose targets are the next bytes (items = n * len).
inline data::Batch random_batch(bool images, int64_t n, int64_t len, uint64_t seed) {
  at::manual_seed(seed);
  data::Batch b;
  if (images) {
    b.input = Value(at::randn({n, 1, 28, 28}));
    b.target = Value(at::randint(0, 10, {n}, at::kLong));
    b.items = n;
  } else {
    at::Tensor tokens = at::randint(0, 256, {n, len + 1}, at::kLong);
    b.input = Value(tokens.slice(1, 0, len).contiguous());
    b.target = Value(tokens.slice(1, 1, len + 1).contiguous());
    b.items = n * len;
  }
  return b;
}

}  // namespace ration::testing
