// gpt.cpp — the "gpt" family (see gpt.h): config reading, nanoGPT initialisation, forward.
#include "ration/models/gpt.h"

#include <cmath>

#include "ration/core/check.h"
#include "ration/ops/ops.h"

namespace ration::models {

GPTOptions GPTOptions::from_config(Config& cfg) {
  GPTOptions o;
  o.vocab_size = published_int(cfg, "data.vocab_size", o.vocab_size);
  o.vocab_size = cfg.get_int("model.vocab_size", o.vocab_size);
  o.n_layer = cfg.get_int("model.n_layer", o.n_layer);
  o.n_head = cfg.get_int("model.n_head", o.n_head);
  o.n_embd = cfg.get_int("model.n_embd", o.n_embd);
  o.block_size = cfg.get_int("model.block_size", o.block_size);
  o.dropout = cfg.get_double("model.dropout", o.dropout);
  o.tie_weights = cfg.get_bool("model.tie_weights", o.tie_weights);
  return o;
}

GPT::GPT(const GPTOptions& o) : options(o) {
  RATION_CHECK(o.vocab_size > 0 && o.n_layer > 0 && o.block_size > 0, "gpt: vocab_size, n_layer and block_size ",
               "must be positive; got ", o.vocab_size, ", ", o.n_layer, ", ", o.block_size);
  wte = register_module("wte", std::make_shared<nn::Embedding>(o.vocab_size, o.n_embd));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(o.block_size, o.n_embd));
  drop = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  for (int64_t i = 0; i < o.n_layer; ++i) {
    blocks.push_back(register_module("blocks." + std::to_string(i),
                                     std::make_shared<nn::TransformerBlock>(o.n_embd, o.n_head, o.dropout)));
  }
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(o.n_embd));
  if (!o.tie_weights) lm_head = register_module("lm_head", std::make_shared<nn::Linear>(o.n_embd, o.vocab_size, false));

  // nanoGPT init: 2-D weights N(0, 0.02); residual projections scaled by 1/sqrt(2 n_layer); biases 0.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer));
  for (auto& [path, p] : named_parameters()) {
    const bool residual = path.size() >= 11 && path.compare(path.size() - 11, 11, "proj.weight") == 0;
    if (p.dim() == 2) p.tensor().normal_(0.0, residual ? residual_std : 0.02);
    else if (path.size() >= 4 && path.compare(path.size() - 4, 4, "bias") == 0) p.tensor().zero_();
  }
}

Value GPT::logits(const Value& tokens) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "gpt expects tokens (B, T); got ", tokens.sizes());
  const int64_t T = tokens.size(1);
  RATION_CHECK(T <= options.block_size, "gpt: sequence length ", T, " exceeds model.block_size ", options.block_size,
               " (raise model.block_size or shorten the data's sequence length)");
  Value positions(at::arange(T, at::TensorOptions().dtype(at::kLong).device(tokens.tensor().device())));  // (T)
  Value x = wte->forward(tokens) + wpe->forward(positions);  // (B, T, C) + (T, C)
  x = drop->forward(x);                                      // (B, T, C)
  for (auto& block : blocks) x = block->forward(x);          // (B, T, C)
  x = ln_f->forward(x);                                      // (B, T, C)
  if (lm_head) return lm_head->forward(x);                   // (B, T, V)
  ScopeGuard head_scope("lm_head");
  return ops::linear(x, wte->weight, Value());  // tied: (B, T, C) x (V, C)^T -> (B, T, V)
}

}  // namespace ration::models
