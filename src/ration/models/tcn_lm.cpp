// tcn_lm.cpp — the "tcn_lm" family (see tcn_lm.h): config reading, layers, full and streamed forward.
#include "ration/models/tcn_lm.h"

#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::models {

TCNLMOptions TCNLMOptions::from_config(Config& cfg) {
  TCNLMOptions o;
  o.vocab_size = published_int(cfg, "data.vocab_size", o.vocab_size);
  o.vocab_size = cfg.get_int("model.vocab_size", o.vocab_size);
  o.n_embd = cfg.get_int("model.n_embd", o.n_embd);
  o.n_layer = cfg.get_int("model.n_layer", o.n_layer);
  o.kernel_size = cfg.get_int("model.kernel_size", o.kernel_size);
  o.dilation_growth = cfg.get_int("model.dilation_growth", o.dilation_growth);
  RATION_CHECK(o.vocab_size > 0 && o.n_embd > 0 && o.n_layer > 0, "tcn_lm: model.vocab_size, model.n_embd and ",
               "model.n_layer must be positive; got ", o.vocab_size, ", ", o.n_embd, ", ", o.n_layer, " in ",
               cfg.origin());
  RATION_CHECK(o.kernel_size >= 1 && o.dilation_growth >= 1, "tcn_lm: model.kernel_size and model.dilation_growth ",
               "must be >= 1; got ", o.kernel_size, ", ", o.dilation_growth, " in ", cfg.origin());
  return o;
}

TCNLM::TCNLM(const TCNLMOptions& o) : options(o) {
  embed = register_module("embed", std::make_shared<nn::Embedding>(o.vocab_size, o.n_embd));
  int64_t dilation = 1;
  for (int64_t i = 0; i < o.n_layer; ++i) {
    blocks.push_back(register_module("blocks." + std::to_string(i),
                                     std::make_shared<nn::GatedConvBlock>(o.n_embd, o.kernel_size, dilation)));
    dilation *= o.dilation_growth;
  }
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(o.n_embd));
  head = register_module("head", std::make_shared<nn::Linear>(o.n_embd, o.vocab_size));
}

Value TCNLM::logits(const Value& tokens) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "tcn_lm expects tokens (B, T); got ", tokens.sizes());
  Value x = embed->forward(tokens);                  // (B, T, C)
  for (auto& block : blocks) x = block->forward(x);  // (B, T, C)
  return head->forward(ln_f->forward(x));            // (B, T, V)
}

Value TCNLM::stream_logits(const Value& tokens, seq::StreamBuffers& buffers) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "tcn_lm expects tokens (B, C); got ", tokens.sizes());
  seq::note_op_of("embed", "embedding", seq::TimeAccess::Pointwise);
  Value x = embed->forward(tokens);  // (B, C, E)
  for (auto& block : blocks) x = block->forward_chunk(x, buffers.of(block->name() + ".conv"));
  seq::note_op_of("ln_f", "layer_norm", seq::TimeAccess::Pointwise);
  seq::note_op_of("head", "linear", seq::TimeAccess::Pointwise);
  return head->forward(ln_f->forward(x));  // (B, C, V)
}

std::vector<seq::LayerDependency> TCNLM::sequence_layers() const {
  std::vector<seq::LayerDependency> out;
  out.push_back({"embed", seq::Dependency::PerStep, 0, options.n_embd, "output", false});
  for (const auto& block : blocks) {
    out.push_back(block->conv->dependency(block->name() + ".conv"));
    out.push_back({block->name() + ".out", seq::Dependency::PerStep, 0, options.n_embd, "output", false});
  }
  out.push_back({"ln_f", seq::Dependency::PerStep, 0, options.n_embd, "output", false});
  out.push_back({"head", seq::Dependency::PerStep, 0, options.vocab_size, "logits", false});
  return out;
}

int64_t TCNLM::receptive_field() const {
  int64_t r = 1;
  for (const auto& block : blocks) r += block->conv->window();
  return r;
}

}  // namespace ration::models
