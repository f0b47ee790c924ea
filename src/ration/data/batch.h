// batch.h — one training or evaluation batch, as every dataset produces and every model consumes.
#pragma once
#include <cstdint>

#include "ration/core/value.h"

namespace ration::data {

struct Batch {
  Value input;    // images (B, 1, 28, 28) float32, or tokens (B, T) int64
  Value target;   // labels (B) int64, or next tokens (B, T) int64
  int64_t items = 0;  // images or tokens in the batch (for throughput)
};

}  // namespace ration::data
