// gpt.cpp — the "gpt" family (see gpt.h): config reading, nanoGPT initialisation, forward.
#include "ration/models/gpt.h"

#include <cmath>

#include "ration/base/check.h"
#include "ration/distributed/tensor_parallel_block.h"
#include "ration/nn/sequence_layers.h"
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
  o.attention_window = cfg.get_int("model.attention_window", o.attention_window);
  RATION_CHECK(o.attention_window >= 0 && o.attention_window < o.block_size, "gpt: model.attention_window must be ",
               "0 (full attention) or a window L with 0 < L < model.block_size (", o.block_size, "); got ",
               o.attention_window, " in ", cfg.origin());
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
  for (auto& block : blocks) block->attn->window = o.attention_window;
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
  RATION_CHECK(T <= options.block_size || options.attention_window > 0, "gpt: sequence length ", T,
               " exceeds model.block_size ", options.block_size,
               " (raise model.block_size, shorten the data's sequence length, or set model.attention_window)");
  Value x = drop->forward(embed(tokens, 0));          // (B, T, C)
  for (size_t i = 0; i < blocks.size(); ++i) x = block(i, x);  // (B, T, C)
  return head(x);                                               // (B, T, V)
}

Value GPT::pipeline_unit(int64_t unit, const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(unit >= 0 && unit < pipeline_units(), "gpt: no pipeline unit ", unit, " (it has ", pipeline_units(), ")");
  if (unit == 0) {
    RATION_CHECK(x.dim() == 2 && x.size(1) <= options.block_size, "gpt expects tokens (B, T) with T <= ",
                 options.block_size, "; got ", x.sizes());
    return drop->forward(embed(x, 0));
  }
  if (unit <= options.n_layer) return block(static_cast<size_t>(unit - 1), x);
  return head(x);
}

std::string GPT::pipeline_unit_name(int64_t unit) const {
  if (unit == 0) return "embedding";
  if (unit <= options.n_layer) return "blocks." + std::to_string(unit - 1);
  return "head";
}

std::vector<std::string> GPT::pipeline_unit_modules(int64_t unit) const {
  if (unit == 0) return {"wte", "wpe", "drop"};
  if (unit <= options.n_layer) return {"blocks." + std::to_string(unit - 1)};
  if (lm_head) return {"ln_f", "lm_head"};
  return {"ln_f", "wte"};
}

Value GPT::block(size_t i, const Value& x) {
  return tensor_parallel_blocks.empty() ? blocks[i]->forward(x) : tensor_parallel_blocks[i]->forward(x);
}

std::string GPT::shard_tensor_parallel(const dist::World& group) {
  const int64_t t = group.size();
  if (!tensor_parallel_blocks.empty()) return "gpt: the blocks are already split over a tensor-parallel group";
  // Each rank holds n_head / T whole heads (attn.qkv's rows, attn.proj's columns) and 4 n_embd / T of the
  // MLP's hidden columns (mlp.fc's rows, mlp.proj's columns).
  if (options.n_head % t != 0 || (4 * options.n_embd) % t != 0)
    return "model.n_head = " + std::to_string(options.n_head) + " (and 4 x model.n_embd = " +
           std::to_string(4 * options.n_embd) + ") must be divisible by parallel.tensor = " + std::to_string(t) +
           ": each tensor-parallel rank holds n_head / T whole attention heads and 4 n_embd / T MLP columns; "
           "hint: set parallel.tensor to a divisor of model.n_head";
  for (auto& b : blocks) tensor_parallel_blocks.push_back(std::make_shared<dist::TensorParallelBlock>(b, group));
  return {};
}

// "blocks.<i>.<name in the block>" -> the block's layout; the embeddings, ln_f and the head are whole.
namespace {
std::string name_in_block(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return {};
  const size_t dot = name.find('.', 7);
  return dot == std::string::npos ? std::string() : name.substr(dot + 1);
}
}  // namespace

int64_t GPT::tensor_split_dim(const std::string& name) const {
  const std::string local = name_in_block(name);
  return local.empty() ? -1 : dist::block_split_dim(local);
}

int64_t GPT::tensor_split_parts(const std::string& name) const {
  const std::string local = name_in_block(name);
  return local.empty() ? 1 : dist::block_split_parts(local);
}

Value GPT::embed(const Value& tokens, int64_t start) {
  const int64_t T = tokens.size(1);
  at::Tensor pos = at::arange(start, start + T, at::TensorOptions().dtype(at::kLong).device(tokens.tensor().device()));
  if (options.attention_window > 0) pos = pos.remainder(options.block_size);
  return wte->forward(tokens) + wpe->forward(Value(pos));  // (B, T, C) + (T, C)
}

Value GPT::head(const Value& x_in) {
  Value x = ln_f->forward(x_in);              // (B, T, C)
  if (lm_head) return lm_head->forward(x);    // (B, T, V)
  ScopeGuard head_scope("lm_head");
  return ops::linear(x, wte->weight, Value());  // tied: (B, T, C) x (V, C)^T -> (B, T, V)
}

Value GPT::stream_logits(const Value& tokens, seq::StreamBuffers& buffers) {
  ScopeGuard scope(name());
  RATION_CHECK(tokens.dim() == 2, "gpt expects tokens (B, C); got ", tokens.sizes());
  RATION_CHECK(options.attention_window > 0 || buffers.position + tokens.size(1) <= options.block_size,
               "gpt with full attention streams at most model.block_size = ", options.block_size, " steps; step ",
               buffers.position + tokens.size(1), " asked (set model.attention_window to stream further)");
  RATION_CHECK(tensor_parallel_blocks.empty(), "gpt: streaming runs whole blocks; this model's blocks are split ",
               "over a tensor-parallel group (parallel.tensor > 1)");
  seq::note_op_of("wte+wpe", "embedding + position embedding", seq::TimeAccess::Pointwise);
  Value x = drop->forward(embed(tokens, buffers.position));  // (B, C, E)
  for (auto& block : blocks) {
    ScopeGuard block_scope(block->name());
    Value h = x + nn::attention_chunk(*block->attn, block->ln1->forward(x), buffers.of(block->name() + ".attn"));
    seq::note_op("layer_norm, linear, gelu, linear", seq::TimeAccess::Pointwise, 0, ".mlp");
    x = h + block->mlp->forward(block->ln2->forward(h));  // (B, C, E)
  }
  seq::note_op_of("lm_head", "layer_norm, linear", seq::TimeAccess::Pointwise);
  return head(x);  // (B, C, V)
}

std::vector<seq::LayerDependency> GPT::sequence_layers() const {
  const int64_t C = options.n_embd, L = options.attention_window;
  std::vector<seq::LayerDependency> out;
  out.push_back({"wte+wpe", seq::Dependency::PerStep, 0, C, "output", false});
  for (const auto& block : blocks) {
    seq::LayerDependency attn{block->name() + ".attn", L > 0 ? seq::Dependency::Window : seq::Dependency::WholeSequence,
                              L, 2 * C, "keys, values", true};
    out.push_back(attn);
    out.push_back({block->name() + ".mlp", seq::Dependency::PerStep, 0, 4 * C, "hidden", false});
  }
  out.push_back({"lm_head", seq::Dependency::PerStep, 0, options.vocab_size, "logits", false});
  return out;
}

}  // namespace ration::models
