// text.h — byte-level language-model data: a corpus of bytes split into train/val, and the windows a
// model trains on.
// Owns: reading one or more files (concatenated, in the order given), the contiguous split (the last
//       val_fraction of the bytes is validation), next-byte windows, and the unigram entropy baseline.
// Vocabulary: the 256 byte values; token = byte.
// A window item at offset o of a split s (bytes (N) uint8) is
//   input  (T) int64 = s[o     : o + T]
//   target (T) int64 = s[o + 1 : o + T + 1]
// TextWindows lists offsets 0, stride, 2*stride, ... (every offset whose target fits). Training uses
// stride 1 with a shuffling Loader, which draws the random offsets deterministically from (seed, epoch)
// and resumes exactly from a LoaderPosition; evaluation uses stride T without shuffling, which covers
// the split once with non-overlapping windows.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ration/data/dataset.h"

namespace ration::data {

inline constexpr const char* kDefaultTextFile = "/usr/share/common-licenses/GPL-3";
inline constexpr int64_t kByteVocab = 256;

class TextCorpus {
 public:
  // Throws ration::Error naming the file when one is missing, unreadable or empty, or when either split
  // would be empty.
  explicit TextCorpus(const std::vector<std::string>& paths = {kDefaultTextFile}, double val_fraction = 0.1);

  const at::Tensor& train() const { return train_; }  // (N_train) uint8
  const at::Tensor& val() const { return val_; }      // (N_val) uint8
  int64_t total_bytes() const { return train_.numel() + val_.numel(); }

  // Entropy of the train split's byte histogram: what a model that ignores context can reach.
  // In bits per byte when `bits`, else nats per byte.
  double unigram_entropy(bool bits = true) const;

 private:
  at::Tensor train_;  // (N_train) uint8, a view of the corpus's first part
  at::Tensor val_;    // (N_val) uint8, the last part
};

class TextWindows : public Dataset {
 public:
  // `split` is a 1-D uint8 tensor (TextCorpus::train() or val()); it is shared, not copied.
  TextWindows(at::Tensor split, int64_t block_size, int64_t stride = 1);

  int64_t size() const override { return count_; }
  // input (B, T) int64, target (B, T) int64 (see the header comment).
  Batch get(const std::vector<int64_t>& indices) const override;
  int64_t offset_of(int64_t index) const { return index * stride_; }

 private:
  at::Tensor split_;  // (N) uint8
  int64_t block_size_;
  int64_t stride_;
  int64_t count_;
};

}  // namespace ration::data
