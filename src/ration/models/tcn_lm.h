// tcn_lm.h — "tcn_lm": tokens (B, T) -> embed -> n_layer GatedConvBlocks (causal convolution of kernel k,
// dilation growth^i in block i) -> LayerNorm -> head Linear -> logits (B, T, V).
// Every block is type 2 (docs/METHODS.md, "Temporal-dependency buffers for sequence models") with
// L_i = (k - 1) growth^i, so the model streams with one ring buffer of L_i + 1 steps per block; its
// receptive field is 1 + sum L_i.
// Config: model.vocab_size (data.vocab_size or 256), model.n_embd (64), model.n_layer (4),
//         model.kernel_size (3), model.dilation_growth (2).
// Parameter names: embed.weight, blocks.<i>.conv.weight (2C, C, k), blocks.<i>.conv.bias,
//         blocks.<i>.out.weight, blocks.<i>.out.bias, ln_f.weight, ln_f.bias, head.weight, head.bias.
#pragma once
#include <memory>
#include <vector>

#include "ration/models/families.h"
#include "ration/nn/sequence_layers.h"
#include "ration/seq/streamable.h"

namespace ration::models {

struct TCNLMOptions {
  int64_t vocab_size = 256;
  int64_t n_embd = 64;
  int64_t n_layer = 4;
  int64_t kernel_size = 3;
  int64_t dilation_growth = 2;
  static TCNLMOptions from_config(Config& cfg);
};

class TCNLM : public LanguageModel, public seq::Streamable {
 public:
  explicit TCNLM(const TCNLMOptions& options);
  Value logits(const Value& tokens) override;
  std::string family() const override { return "tcn_lm"; }
  int64_t vocab_size() const override { return options.vocab_size; }
  std::vector<seq::LayerDependency> sequence_layers() const override;
  Value stream_logits(const Value& tokens, seq::StreamBuffers& buffers) override;
  int64_t receptive_field() const;

  TCNLMOptions options;
  std::shared_ptr<nn::Embedding> embed;
  std::vector<std::shared_ptr<nn::GatedConvBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace ration::models
