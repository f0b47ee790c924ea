// fashion_mnist.h — Fashion-MNIST from its four gzipped IDX files.
// Owns: reading and validating DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (magic numbers,
//       28x28 images, image and label counts that agree with each other and with the bytes present,
//       labels in 0..9), and normalising batches.
// Memory: the images stay uint8 (N, 28, 28) as memory::Category::Data; get() makes float32 per batch:
//   input  (B, 1, 28, 28) float32 = (x / 255 - 0.2860) / 0.3530
//   target (B) int64 in 0..9
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "ration/data/dataset.h"

namespace ration::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

class FashionMnist : public Dataset {
 public:
  enum class Split { Train, Test };
  static constexpr double kMean = 0.2860;
  static constexpr double kStd = 0.3530;
  static constexpr int64_t kSide = 28;
  static constexpr int64_t kClasses = 10;

  // Throws ration::Error naming the file and what was expected when a file is missing or malformed.
  explicit FashionMnist(Split split, const std::string& dir = kFashionMnistDir);

  int64_t size() const override { return labels_.size(0); }
  Batch get(const std::vector<int64_t>& indices) const override;

  const at::Tensor& raw_images() const { return images_; }  // (N, 28, 28) uint8
  const at::Tensor& labels() const { return labels_; }      // (N) int64

 private:
  at::Tensor images_;  // (N, 28, 28) uint8
  at::Tensor labels_;  // (N) int64
};

// The file names of a split, e.g. "train-images-idx3-ubyte.gz".
std::string fashion_mnist_images_file(FashionMnist::Split split);
std::string fashion_mnist_labels_file(FashionMnist::Split split);

}  // namespace ration::data
