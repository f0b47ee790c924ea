// mlp.h — "mlp": flatten (B, C, H, W) -> hidden Linear+ReLU+Dropout layers -> Linear to classes.
// Config: model.in_features (784), model.hidden ([256, 128]), model.dropout (0.0), model.num_classes (10).
// Parameter names: hidden.0.weight, hidden.1.bias, ..., out.weight, out.bias.
#pragma once
#include <memory>
#include <vector>

#include "ration/models/families.h"
#include "ration/nn/layers.h"

namespace ration::models {

struct MLPOptions {
  int64_t in_features = 784;
  std::vector<int64_t> hidden = {256, 128};
  double dropout = 0.0;
  int64_t num_classes = 10;
  static MLPOptions from_config(Config& cfg);
};

class MLP : public Classifier {
 public:
  explicit MLP(const MLPOptions& options);
  Value logits(const Value& images) override;
  std::string family() const override { return "mlp"; }

  MLPOptions options;
  std::vector<std::shared_ptr<nn::Linear>> hidden;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> out;
};

}  // namespace ration::models
