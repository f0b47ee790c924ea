// lstm_lm.cpp — the "lstm_lm" family (see lstm_lm.h): config reading, layers, forward.
#include "ration/models/lstm_lm.h"

#include "ration/base/check.h"
#include "ration/data/batch.h"
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
  o.unroll = cfg.get_choice("model.unroll", "sequence", {"sequence", "step"}) == "step" ? Unroll::Step : Unroll::Sequence;
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

Value LSTMLM::loss(const data::Batch& batch) {
  if (options.unroll == Unroll::Sequence) return LanguageModel::loss(batch);
  ScopeGuard scope(name());
  RATION_CHECK(batch.input.defined() && batch.input.dim() == 2 && batch.input.dtype() == at::kLong &&
                   batch.target.defined() && batch.target.sizes() == batch.input.sizes() &&
                   batch.target.dtype() == at::kLong,
               "lstm_lm expects int64 tokens (B, T) and targets of the same shape; got ", batch.input.sizes(), " and ",
               batch.target.sizes());
  const at::Tensor tokens = to_model(batch.input, *this).tensor(), targets = to_model(batch.target, *this).tensor();
  const int64_t B = tokens.size(0), T = tokens.size(1), H = options.hidden_size;
  RATION_CHECK(T > 0, "lstm_lm needs at least one time step; got ", tokens.sizes());
  const at::TensorOptions opts = parameter_options();
  std::vector<Value> h, c;  // per layer (B, H)
  for (int64_t l = 0; l < options.n_layer; ++l) {
    h.emplace_back(at::zeros({B, H}, opts));
    c.emplace_back(at::zeros({B, H}, opts));
  }
  Value total;
  for (int64_t t = 0; t < T; ++t) {
    Value x = embed->forward(Value(tokens.select(1, t).contiguous()));  // (B, E)
    {
      ScopeGuard cells(lstm->name());
      for (int64_t l = 0; l < options.n_layer; ++l) {
        if (l > 0 && lstm->is_training() && lstm->dropout > 0.0) x = ops::dropout(x, lstm->dropout, true);
        Values hc = ops::lstm_cell(x, h[l], c[l], lstm->w_ih[l], lstm->w_hh[l], lstm->b_ih[l], lstm->b_hh[l]);
        h[l] = hc[0];
        c[l] = hc[1];
        x = h[l];
      }
    }
    Value step_loss = ops::cross_entropy(head->forward(drop->forward(x)), Value(targets.select(1, t).contiguous()));
    total = t == 0 ? step_loss : ops::add(total, step_loss);
  }
  return ops::mul_scalar(total, 1.0 / static_cast<double>(T));  // the mean over all B T tokens
}

Value LSTMLM::stream_logits(const Value& tokens, seq::StreamBuffers& buffers) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "lstm_lm expects tokens (B, C); got ", tokens.sizes());
  std::vector<seq::RingBuffer*> state;
  for (int64_t l = 0; l < options.n_layer; ++l) state.push_back(&buffers.of("lstm.l" + std::to_string(l)));
  seq::note_op_of("embed", "embedding", seq::TimeAccess::Pointwise);
  Value x = embed->forward(tokens);         // (B, C, E)
  Value h = nn::lstm_chunk(*lstm, x, state);  // (B, C, H)
  seq::note_op_of("head", "dropout, linear", seq::TimeAccess::Pointwise);
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
