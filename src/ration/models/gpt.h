// gpt.h — "gpt": nanoGPT-style byte-level language model.
// tokens (B, T) -> wte(tokens) + wpe(0..T-1) -> dropout -> n_layer pre-LN TransformerBlocks -> ln_f
// -> lm head -> logits (B, T, V).
// Config: model.vocab_size (data.vocab_size or 256), model.n_layer (4), model.n_head (4), model.n_embd (128),
//         model.block_size (128), model.dropout (0.0), model.tie_weights (true).
// lm head: tied (default, as GPT-2/nanoGPT) means logits = x wte.weight^T with no extra parameter and no
// "lm_head.*" name, the one wte.weight receiving gradient from both uses; untied adds lm_head.weight (V, C),
// no bias. Init as nanoGPT: every 2-D weight N(0, 0.02), residual projections (attn.proj, mlp.proj)
// N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm 1/0.
// model.attention_window = L (0, default: full causal attention) makes every block attend only the current
// and previous L steps (type 2 in docs/METHODS.md, "Temporal-dependency buffers for sequence models"); L must
// be below block_size. Windowed, the sequence may be longer than block_size: position t uses
// wpe[t mod block_size], and the model streams with a key/value ring buffer of L + 1 steps per block.
// Parameter count: V C + block_size C + n_layer (12 C^2 + 13 C) + 2 C (+ V C untied).
#pragma once
#include <memory>
#include <vector>

#include "ration/models/families.h"
#include "ration/nn/layers.h"
#include "ration/seq/streamable.h"

namespace ration::dist {
class TensorParallelBlock;
}

namespace ration::models {

struct GPTOptions {
  int64_t vocab_size = 256;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 128;
  double dropout = 0.0;
  bool tie_weights = true;
  int64_t attention_window = 0;
  static GPTOptions from_config(Config& cfg);
};

class GPT : public LanguageModel, public seq::Streamable {
 public:
  explicit GPT(const GPTOptions& options);
  Value logits(const Value& tokens) override;
  std::string family() const override { return "gpt"; }
  int64_t vocab_size() const override { return options.vocab_size; }
  std::vector<seq::LayerDependency> sequence_layers() const override;
  Value stream_logits(const Value& tokens, seq::StreamBuffers& buffers) override;
  // Pipeline units: 0 the embedding (wte, wpe, dropout), 1..n_layer the blocks, n_layer + 1 the head
  // (ln_f and the lm head; tied, it uses wte too).
  int64_t pipeline_units() const override { return options.n_layer + 2; }
  Value pipeline_unit(int64_t unit, const Value& x) override;
  std::string pipeline_unit_name(int64_t unit) const override;
  std::vector<std::string> pipeline_unit_modules(int64_t unit) const override;
  // Tensor parallel (distributed/tensor_parallel_block.h): every block's attention heads and MLP columns
  // split over `group`, the embeddings, ln_f and the head replicated. Needs model.n_head (and 4 n_embd)
  // divisible by the group's size. Streaming (stream_logits) is refused once split.
  std::string shard_tensor_parallel(const dist::World& group) override;
  int64_t tensor_split_dim(const std::string& name) const override;
  int64_t tensor_split_parts(const std::string& name) const override;

  GPTOptions options;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied
  // Set by shard_tensor_parallel: block i's forward over its shards (it holds blocks[i]); empty otherwise.
  std::vector<std::shared_ptr<dist::TensorParallelBlock>> tensor_parallel_blocks;

 private:
  Value embed(const Value& tokens, int64_t start);  // tokens (B, T) at positions start.. -> (B, T, C)
  Value head(const Value& x);                       // ln_f and the lm head: (B, T, C) -> (B, T, V)
  Value block(size_t i, const Value& x);            // block i, whole or over its shards: (B, T, C) -> (B, T, C)
};

}  // namespace ration::models
