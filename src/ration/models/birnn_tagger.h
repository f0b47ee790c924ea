// birnn_tagger.h — "birnn_tagger": tokens (B, T) -> embed -> tanh(causal convolution, kernel k) -> bidirectional
// GRU (hidden H) -> head Linear -> logits (B, T, V): one label per step read from the whole sequence (a tagger).
// The sequence model with a type-3 layer (docs/METHODS.md, "Temporal-dependency buffers for sequence models"):
// embed and head are type 1, the front end type 2 (L = k - 1), the bidirectional GRU type 3. Chunk-wise it
// keeps the front end's L + 1 inputs and, for the GRU, a buffer of T steps of [its input, its reverse state]:
// chunks fill the inputs, finish_logits runs the reverse direction over the buffer and then the forward one
// chunk by chunk, handing out each chunk's logits; they equal the full-sequence forward's. Memory grows with T
// by that buffer alone (T (E + H) floats per row).
// On next-byte text (data.kind = "text") its reverse direction sees the byte it is asked to predict: it is a
// tagger, not a language model; the family exists to run and measure a whole-sequence layer.
// Config: model.vocab_size (data.vocab_size or 256), model.n_embd (64), model.hidden_size (64),
//         model.kernel_size (3).
// Parameter names: embed.weight, front.weight (E, E, k), front.bias, birnn.weight_ih_l0, ...,
//         birnn.bias_hh_l0_reverse, head.weight (V, 2H), head.bias.
#pragma once
#include <memory>

#include "ration/models/families.h"
#include "ration/nn/sequence_layers.h"
#include "ration/seq/streamable.h"

namespace ration::models {

struct BiRNNTaggerOptions {
  int64_t vocab_size = 256;
  int64_t n_embd = 64;
  int64_t hidden_size = 64;
  int64_t kernel_size = 3;
  static BiRNNTaggerOptions from_config(Config& cfg);
};

class BiRNNTagger : public LanguageModel, public seq::Streamable {
 public:
  explicit BiRNNTagger(const BiRNNTaggerOptions& options);
  Value logits(const Value& tokens) override;
  std::string family() const override { return "birnn_tagger"; }
  int64_t vocab_size() const override { return options.vocab_size; }
  std::vector<seq::LayerDependency> sequence_layers() const override;
  // Runs embed and the front end and fills the GRU's buffer; returns an undefined Value (see the header).
  Value stream_logits(const Value& tokens, seq::StreamBuffers& buffers) override;
  void finish_logits(seq::StreamBuffers& buffers, int64_t chunk,
                     const std::function<void(const at::Tensor&)>& emit) override;

  BiRNNTaggerOptions options;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::CausalConv1d> front;
  std::shared_ptr<nn::Bidirectional> birnn;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace ration::models
