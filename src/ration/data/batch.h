// batch.h — one training or evaluation batch, as every dataset produces and every model consumes.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "ration/core/value.h"

namespace ration::data {

// One multi-hot sparse field of a batch (click-through data): the feature ids of every sample, bag after
// bag, and where each sample's bag starts (as ops::embedding_bag takes them).
struct SparseBag {
  at::Tensor ids;      // (n) int64 feature ids (64-bit hashes or raw ids; any value)
  at::Tensor offsets;  // (B) int64, offsets[0] = 0, non-decreasing
};

struct Batch {
  Value input;    // images (B, 1, 28, 28) float32, tokens (B, T) int64, or dense features (B, F) float32
  // Further inputs of every item, after `input` (tensor files whose "inputs" is a list: inputs[1], inputs[2],
  // ...), each (B, ...); empty for every other dataset.
  std::vector<Value> extra_inputs;
  Value target;   // labels (B) int64, or next tokens (B, T) int64
  int64_t items = 0;  // images, tokens or samples in the batch (for throughput)
  std::vector<SparseBag> sparse;  // click-through data only: one bag per sparse field
};

}  // namespace ration::data
