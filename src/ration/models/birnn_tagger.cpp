// birnn_tagger.cpp — the "birnn_tagger" family (see birnn_tagger.h): config, layers, full and chunk-wise forward.
#include "ration/models/birnn_tagger.h"

#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::models {

BiRNNTaggerOptions BiRNNTaggerOptions::from_config(Config& cfg) {
  BiRNNTaggerOptions o;
  o.vocab_size = published_int(cfg, "data.vocab_size", o.vocab_size);
  o.vocab_size = cfg.get_int("model.vocab_size", o.vocab_size);
  o.n_embd = cfg.get_int("model.n_embd", o.n_embd);
  o.hidden_size = cfg.get_int("model.hidden_size", o.hidden_size);
  o.kernel_size = cfg.get_int("model.kernel_size", o.kernel_size);
  RATION_CHECK(o.vocab_size > 0 && o.n_embd > 0 && o.hidden_size > 0 && o.kernel_size >= 1, "birnn_tagger: ",
               "model.vocab_size, model.n_embd, model.hidden_size must be positive and model.kernel_size >= 1; got ",
               o.vocab_size, ", ", o.n_embd, ", ", o.hidden_size, ", ", o.kernel_size, " in ", cfg.origin());
  return o;
}

BiRNNTagger::BiRNNTagger(const BiRNNTaggerOptions& o) : options(o) {
  embed = register_module("embed", std::make_shared<nn::Embedding>(o.vocab_size, o.n_embd));
  front = register_module("front", std::make_shared<nn::CausalConv1d>(o.n_embd, o.n_embd, o.kernel_size));
  birnn = register_module("birnn", std::make_shared<nn::Bidirectional>(nn::RecurrentCell::GRU, o.n_embd, o.hidden_size));
  head = register_module("head", std::make_shared<nn::Linear>(2 * o.hidden_size, o.vocab_size));
}

Value BiRNNTagger::logits(const Value& tokens) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "birnn_tagger expects tokens (B, T); got ", tokens.sizes());
  Value x = ops::tanh(front->forward(embed->forward(tokens)));  // (B, T, E)
  return head->forward(birnn->forward(x));                       // (B, T, 2H) -> (B, T, V)
}

Value BiRNNTagger::stream_logits(const Value& tokens, seq::StreamBuffers& buffers) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "birnn_tagger expects tokens (B, C); got ", tokens.sizes());
  seq::note_op_of("embed", "embedding", seq::TimeAccess::Pointwise);
  Value x = ops::tanh(front->forward_chunk(embed->forward(tokens), buffers.of("front")));  // (B, C, E)
  const int64_t B = x.size(0), C = x.size(1);
  // [input, reverse state]: the states are written once the sequence is complete.
  buffers.of("birnn").push(at::cat({x.tensor().detach(), at::zeros({B, C, options.hidden_size}, x.tensor().options())}, 2));
  return Value();
}

void BiRNNTagger::finish_logits(seq::StreamBuffers& buffers, int64_t chunk,
                                const std::function<void(const at::Tensor&)>& emit) {
  ScopeGuard scope(name());
  RATION_CHECK(chunk >= 1, "birnn_tagger: chunk must be >= 1; got ", chunk);
  const int64_t E = options.n_embd, H = options.hidden_size;
  const at::Tensor held = buffers.of("birnn").held();  // (B, T, E + H), a view
  const int64_t T = held.size(1);
  if (T == 0) return;
  const Value x(held.narrow(2, 0, E), false);          // (B, T, E)
  at::Tensor reverse = held.narrow(2, E, H);           // (B, T, H)
  birnn->reverse_into(x, reverse);
  Value h, c;  // the forward direction's state, carried from chunk to chunk
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t n = std::min(chunk, T - s);
    Value forward = birnn->forward_chunk(Value(x.tensor().narrow(1, s, n), false), h, c);  // (B, n, H)
    Value both = ops::cat({forward, Value(reverse.narrow(1, s, n).contiguous(), false)}, 2);  // (B, n, 2H)
    seq::note_op_of("head", "linear", seq::TimeAccess::Pointwise);
    emit(head->forward(both).tensor());  // (B, n, V)
  }
}

std::vector<seq::LayerDependency> BiRNNTagger::sequence_layers() const {
  std::vector<seq::LayerDependency> out;
  out.push_back({"embed", seq::Dependency::PerStep, 0, options.n_embd, "output", false});
  out.push_back(front->dependency("front"));
  out.push_back(birnn->dependency("birnn"));
  out.push_back({"head", seq::Dependency::PerStep, 0, options.vocab_size, "logits", false});
  return out;
}

}  // namespace ration::models
