// lstm_lm.h — "lstm_lm": tokens (B, T) -> embed -> LSTM (n_layer, hidden_size, batch-first) -> dropout
// -> head Linear -> logits (B, T, V).
// Config: model.vocab_size (data.vocab_size or 256), model.n_embd (64), model.hidden_size (256),
//         model.n_layer (2), model.dropout (0.0; also between LSTM layers).
// Parameter names: embed.weight, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, ..., head.weight.
#pragma once
#include <memory>

#include "ration/models/families.h"
#include "ration/nn/layers.h"

namespace ration::models {

struct LSTMLMOptions {
  int64_t vocab_size = 256;
  int64_t n_embd = 64;
  int64_t hidden_size = 256;
  int64_t n_layer = 2;
  double dropout = 0.0;
  static LSTMLMOptions from_config(Config& cfg);
};

class LSTMLM : public LanguageModel {
 public:
  explicit LSTMLM(const LSTMLMOptions& options);
  Value logits(const Value& tokens) override;
  std::string family() const override { return "lstm_lm"; }
  int64_t vocab_size() const override { return options.vocab_size; }

  LSTMLMOptions options;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace ration::models
