// lstm_lm.cpp — the "lstm_lm" family (see lstm_lm.h): config reading, layers, forward.
#include "ration/models/lstm_lm.h"

#include "ration/core/check.h"
#include "ration/nn/sequence_layers.h"
#include "ration/ops/ops.h"

namespace ration::models {

LSTMLMOptions LSTMLMOptions::from_config(Config& cfg) {
  LSTMLMOptions o;
  o.vocab_size = published_int(cfg, "data.vocab_size", o.vocab_size);
  o.vocab_size = cfg.get_int("model.vocab_size", o.vocab_size);
  o.n_embd = cfg.get_int("model.n_embd", o.n_embd);
  o.hidden_size = cfg.get_int("model.hidden_size", o.hidden_size);
  o.n_layer = cfg.get_int("model.n_layer", o.n_layer);
  o.dropout = cfg.get_double("model.dropout", o.dropout);
  return o;
}

LSTMLM::LSTMLM(const LSTMLMOptions& o) : options(o) {
  embed = register_module("embed", std::make_shared<nn::Embedding>(o.vocab_size, o.n_embd));
  lstm = register_module("lstm", std::make_shared<nn::LSTM>(o.n_embd, o.hidden_size, o.n_layer, o.dropout));
  drop = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  head = register_module("head", std::make_shared<nn::Linear>(o.hidden_size, o.vocab_size));
}

Value LSTMLM::logits(const Value& tokens) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "lstm_lm expects tokens (B, T); got ", tokens.sizes());
  Value x = embed->forward(tokens);  // (B, T, E)
  Value h = lstm->forward(x);        // (B, T, H)
  return head->forward(drop->forward(h));  // (B, T, V)
}

Value LSTMLM::stream_logits(const Value& tokens, seq::StreamBuffers& buffers) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "lstm_lm expects tokens (B, C); got ", tokens.sizes());
  std::vector<seq::RingBuffer*> state;
  for (int64_t l = 0; l < options.n_layer; ++l) state.push_back(&buffers.of("lstm.l" + std::to_string(l)));
  Value x = embed->forward(tokens);         // (B, C, E)
  Value h = nn::lstm_chunk(*lstm, x, state);  // (B, C, H)
  return head->forward(drop->forward(h));   // (B, C, V)
}

std::vector<seq::LayerDependency> LSTMLM::sequence_layers() const {
  std::vector<seq::LayerDependency> out;
  out.push_back({"embed", seq::Dependency::PerStep, 0, options.n_embd, "output", false});
  for (int64_t l = 0; l < options.n_layer; ++l)
    out.push_back({"lstm.l" + std::to_string(l), seq::Dependency::PerStep, 0, 2 * options.hidden_size, "h, c", true});
  out.push_back({"head", seq::Dependency::PerStep, 0, options.vocab_size, "logits", false});
  return out;
}

}  // namespace ration::models
