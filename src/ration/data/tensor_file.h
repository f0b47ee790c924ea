// tensor_file.h — data.kind = "tensors": a dataset read from a file PyTorch's torch.save wrote.
// Owns: TensorFile — the file's dictionary {"inputs": Tensor or list/tuple of Tensors, "target": Tensor},
//       every tensor with the items along dim 0, held in host memory (Category::Data), and batches of
//       chosen items (index_select on dim 0, the same indices for every tensor). inputs[0] is
//       Batch::input, inputs[1..] are Batch::extra_inputs, in the file's order.
// Does not own: order, shuffling and resuming (data/dataset.h's Loader), what the model does with them.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ration/data/dataset.h"

namespace ration::data {

class TensorFile : public Dataset {
 public:
  // Errors name the file and the missing or malformed key.
  explicit TensorFile(const std::string& path);
  int64_t size() const override { return target_.size(0); }
  Batch get(const std::vector<int64_t>& indices) const override;
  // int64 targets (classes): evaluation reports accuracy.
  bool class_target() const { return target_.scalar_type() == at::kLong; }
  size_t num_inputs() const { return inputs_.size(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<at::Tensor> inputs_;  // each (N, ...)
  at::Tensor target_;               // (N, ...)
};

}  // namespace ration::data
