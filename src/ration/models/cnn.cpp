// cnn.cpp — the "cnn" family (see cnn.h): config reading, conv blocks, classifier head, forward.
#include "ration/models/cnn.h"

#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::models {

CNNOptions CNNOptions::from_config(Config& cfg) {
  CNNOptions o;
  o.in_channels = published_int(cfg, "data.image_channels", o.in_channels);
  o.in_channels = cfg.get_int("model.in_channels", o.in_channels);
  o.image_size = cfg.get_int("model.image_size", o.image_size);
  o.channels = cfg.get_int_list("model.channels", o.channels);
  o.kernel_size = cfg.get_int("model.kernel_size", o.kernel_size);
  o.fc_hidden = cfg.get_int("model.fc_hidden", o.fc_hidden);
  o.dropout = cfg.get_double("model.dropout", o.dropout);
  o.num_classes = published_int(cfg, "data.num_classes", o.num_classes);
  o.num_classes = cfg.get_int("model.num_classes", o.num_classes);
  return o;
}

ConvBlock::ConvBlock(int64_t in_channels, int64_t out_channels, int64_t kernel_size) {
  RATION_CHECK(kernel_size % 2 == 1, "cnn: model.kernel_size must be odd for same padding; got ", kernel_size);
  conv = register_module("conv",
                         std::make_shared<nn::Conv2d>(in_channels, out_channels, kernel_size, 1, kernel_size / 2));
  bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(out_channels));
  pool = register_module("pool", std::make_shared<nn::MaxPool2d>(2));
}

Value ConvBlock::forward(const Value& x) {
  ScopeGuard scope(name());
  return pool->forward(ops::relu(bn->forward(conv->forward(x))));
}

CNN::CNN(const CNNOptions& o) : options(o) {
  RATION_CHECK(!o.channels.empty(), "cnn: model.channels needs at least one entry, e.g. [32, 64]");
  int64_t c = o.in_channels, s = o.image_size;
  for (size_t i = 0; i < o.channels.size(); ++i) {
    blocks.push_back(register_module("blocks." + std::to_string(i),
                                     std::make_shared<ConvBlock>(c, o.channels[i], o.kernel_size)));
    c = o.channels[i];
    s /= 2;
    RATION_CHECK(s > 0, "cnn: model.image_size ", o.image_size, " is too small for ", o.channels.size(),
                 " 2x2 pools");
  }
  flat_features = c * s * s;
  fc = register_module("fc", std::make_shared<nn::Linear>(flat_features, o.fc_hidden));
  drop = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  out = register_module("out", std::make_shared<nn::Linear>(o.fc_hidden, o.num_classes));
}

Value CNN::logits(const Value& images) {
  ScopeGuard scope(name());
  RATION_CHECK(images.dim() == 4 && images.size(1) == options.in_channels && images.size(2) == options.image_size &&
                   images.size(3) == options.image_size,
               "cnn expects (B, ", options.in_channels, ", ", options.image_size, ", ", options.image_size,
               ") images (model.in_channels, model.image_size); got ", images.sizes());
  Value x = images;
  for (auto& block : blocks) x = block->forward(x);  // (B, C_i, S_i, S_i)
  return head(x);
}

Value CNN::head(const Value& features) {
  Value x = ops::flatten(features, 1);               // (B, flat_features)
  x = drop->forward(ops::relu(fc->forward(x)));      // (B, fc_hidden)
  return out->forward(x);                            // (B, num_classes)
}

Value CNN::pipeline_unit(int64_t unit, const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(unit >= 0 && unit < pipeline_units(), "cnn: no pipeline unit ", unit, " (it has ", pipeline_units(), ")");
  if (unit < static_cast<int64_t>(blocks.size())) return blocks[static_cast<size_t>(unit)]->forward(x);
  return head(x);
}

std::string CNN::pipeline_unit_name(int64_t unit) const {
  return unit < static_cast<int64_t>(blocks.size()) ? "blocks." + std::to_string(unit) : std::string("head");
}

std::vector<std::string> CNN::pipeline_unit_modules(int64_t unit) const {
  if (unit < static_cast<int64_t>(blocks.size())) return {"blocks." + std::to_string(unit)};
  return {"fc", "drop", "out"};
}

}  // namespace ration::models
