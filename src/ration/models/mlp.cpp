// mlp.cpp — the "mlp" family (see mlp.h): config reading, layers, forward.
#include "ration/models/mlp.h"

#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::models {

MLPOptions MLPOptions::from_config(Config& cfg) {
  MLPOptions o;
  o.in_features = cfg.get_int("model.in_features", o.in_features);
  o.hidden = cfg.get_int_list("model.hidden", o.hidden);
  o.dropout = cfg.get_double("model.dropout", o.dropout);
  o.num_classes = published_int(cfg, "data.num_classes", o.num_classes);
  o.num_classes = cfg.get_int("model.num_classes", o.num_classes);
  return o;
}

MLP::MLP(const MLPOptions& o) : options(o) {
  int64_t width = o.in_features;
  for (size_t i = 0; i < o.hidden.size(); ++i) {
    hidden.push_back(register_module("hidden." + std::to_string(i), std::make_shared<nn::Linear>(width, o.hidden[i])));
    width = o.hidden[i];
  }
  drop = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  out = register_module("out", std::make_shared<nn::Linear>(width, o.num_classes));
}

Value MLP::logits(const Value& images) {
  ScopeGuard scope(name());
  RATION_CHECK(images.dim() >= 2 && images.numel() / images.size(0) == options.in_features, "mlp expects ",
               options.in_features, " features per item (model.in_features); got input ", images.sizes());
  Value x = ops::flatten(images, 1);  // (B, in_features)
  for (auto& layer : hidden) x = drop->forward(ops::relu(layer->forward(x)));  // (B, hidden[i])
  return out->forward(x);  // (B, num_classes)
}

}  // namespace ration::models
