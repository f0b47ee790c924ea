// lstm_lm.h — "lstm_lm": tokens (B, T) -> embed -> LSTM (n_layer, hidden_size, batch-first) -> dropout
// -> head Linear -> logits (B, T, V).
// Config: model.vocab_size (data.vocab_size or 256), model.n_embd (64), model.hidden_size (256),
//         model.n_layer (2), model.dropout (0.0; also between LSTM layers), model.unroll ("sequence").
// Training graph (model.unroll): "sequence" runs the embedding, the head and the loss once over the
// whole sequence (fast; their saved tensors grow with T); "step" builds every time step on its own
// (embedding row, cells, head, loss of that step, added to a running sum), so the step's graph is a chain
// over time whose every saved value belongs to one step: the budget planner can then keep a few steps'
// states and recompute the rest from them (docs/METHODS.md, "Temporal-dependency buffers for sequence
// models", "Full BPTT under a budget"). Both give the same loss up to rounding; evaluation and
// streaming are the same in both.
// Streams (docs/METHODS.md, "Temporal-dependency buffers for sequence models"): every layer is type 1,
// each LSTM layer carrying its (h, c) in a one-step buffer, so streamed logits equal the full forward's.
// Parameter names: embed.weight, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, ..., head.weight.
#pragma once
#include <memory>

#include "ration/models/families.h"
#include "ration/nn/layers.h"
#include "ration/seq/streamable.h"

namespace ration::models {

// How the training graph is unrolled over time (see the header comment).
enum class Unroll { Sequence, Step };

struct LSTMLMOptions {
  int64_t vocab_size = 256;
  int64_t n_embd = 64;
  int64_t hidden_size = 256;
  int64_t n_layer = 2;
  double dropout = 0.0;
  Unroll unroll = Unroll::Sequence;
  static LSTMLMOptions from_config(Config& cfg);
};

class LSTMLM : public LanguageModel, public seq::Streamable {
 public:
  explicit LSTMLM(const LSTMLMOptions& options);
  Value logits(const Value& tokens) override;
  // Mean cross entropy; with Unroll::Step built step by step (see the header comment).
  Value loss(const data::Batch& batch) override;
  std::string family() const override { return "lstm_lm"; }
  int64_t vocab_size() const override { return options.vocab_size; }
  std::vector<seq::LayerDependency> sequence_layers() const override;
  Value stream_logits(const Value& tokens, seq::StreamBuffers& buffers) override;

  LSTMLMOptions options;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace ration::models
