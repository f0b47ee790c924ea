// cnn.h — "cnn": per entry of model.channels a block conv(k, same padding)-BN-ReLU-maxpool(2), then
// flatten -> Linear(fc_hidden)+ReLU+Dropout -> Linear to classes.
// Config: model.in_channels (data.image_channels or 1), model.image_size (28), model.channels ([32, 64]),
//         model.kernel_size (3), model.fc_hidden (128), model.dropout (0.0), model.num_classes (10).
// Parameter names: blocks.0.conv.weight, blocks.0.bn.weight, ..., fc.weight, out.weight;
// buffers blocks.0.bn.running_mean / running_var.
#pragma once
#include <memory>
#include <vector>

#include "ration/models/families.h"
#include "ration/nn/layers.h"

namespace ration::models {

struct CNNOptions {
  int64_t in_channels = 1;
  int64_t image_size = 28;
  std::vector<int64_t> channels = {32, 64};
  int64_t kernel_size = 3;
  int64_t fc_hidden = 128;
  double dropout = 0.0;
  int64_t num_classes = 10;
  static CNNOptions from_config(Config& cfg);
};

// conv -> batch norm -> ReLU -> 2x2 max pool. (B, C_in, S, S) -> (B, C_out, S/2, S/2).
class ConvBlock : public nn::Module {
 public:
  ConvBlock(int64_t in_channels, int64_t out_channels, int64_t kernel_size);
  Value forward(const Value& x);
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::MaxPool2d> pool;
};

class CNN : public Classifier {
 public:
  explicit CNN(const CNNOptions& options);
  Value logits(const Value& images) override;
  std::string family() const override { return "cnn"; }
  // Pipeline units: one per conv block, then the head (flatten, fc, dropout, out).
  int64_t pipeline_units() const override { return static_cast<int64_t>(blocks.size()) + 1; }
  Value pipeline_unit(int64_t unit, const Value& x) override;
  std::string pipeline_unit_name(int64_t unit) const override;
  std::vector<std::string> pipeline_unit_modules(int64_t unit) const override;

  CNNOptions options;
  std::vector<std::shared_ptr<ConvBlock>> blocks;
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> out;
  int64_t flat_features = 0;  // channels.back() * S' * S' after all pools

 private:
  Value head(const Value& features);  // (B, C, S', S') -> logits (B, num_classes)
};

}  // namespace ration::models
