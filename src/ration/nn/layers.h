// layers.h — the standard layers every model is built from.
// Owns: Linear, Conv2d, MaxPool2d, AvgPool2d, LayerNorm, BatchNorm2d, Embedding, Dropout,
//       MultiHeadAttention (causal), TransformerBlock (pre-LN, GPT-2), LSTM and GRU (multi-layer,
//       batch-first), their parameter shapes, names and initialisation.
// Does not own: the maths of any op (ration/ops/ops.h) — layers only compose ops; never ATen directly
//       for differentiable work.
//
// Conventions: every forward() opens `ScopeGuard scope(name())` (see module.h). Parameters are created
// float32 on CPU with PyTorch's default initialisation drawn from ATen's default generator
// (at::manual_seed makes it reproducible); Module::to() moves them. Names follow PyTorch
// ("weight", "bias", "weight_ih_l0", ...) so state can be compared with torch.nn layer by layer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ration/nn/module.h"

namespace ration::nn {

// y = x W^T + b. x (..., in) -> (..., out). weight (out, in), bias (out).
// Init: kaiming_uniform(a=sqrt(5)) i.e. U(-1/sqrt(in), 1/sqrt(in)) for both, as torch.nn.Linear.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Value forward(const Value& x);
  Value weight;
  Value bias;  // undefined when bias = false
  int64_t in_features, out_features;
};

// 2-D convolution, NCHW. x (B, C_in, H, W) -> (B, C_out, H', W'). weight (C_out, C_in, k, k), bias (C_out).
// Init: U(-1/sqrt(C_in k k), 1/sqrt(C_in k k)) as torch.nn.Conv2d.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1, int64_t padding = 0,
         bool bias = true);
  Value forward(const Value& x);
  Value weight;
  Value bias;
  int64_t in_channels, out_channels, kernel_size, stride, padding;
};

// Max pooling; stride defaults to the kernel size. No parameters.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Value forward(const Value& x);
  int64_t kernel_size, stride, padding;
};

// Average pooling; stride defaults to the kernel size. No parameters.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Value forward(const Value& x);
  int64_t kernel_size, stride, padding;
};

// Layer norm over the last dimension. x (..., D). weight ones (D), bias zeros (D).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Value forward(const Value& x);
  Value weight, bias;
  int64_t dim;
  double eps;
};

// Batch norm over (B, H, W) per channel. x (B, C, H, W). weight ones (C), bias zeros (C).
// Buffers running_mean zeros (C), running_var ones (C): training mode normalises with batch statistics
// and updates them (momentum, unbiased variance, as torch); eval mode normalises with them.
// (torch's num_batches_tracked is not kept: momentum is always a fixed number here.)
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Value forward(const Value& x);
  Value weight, bias;
  at::Tensor running_mean;  // (C)
  at::Tensor running_var;   // (C)
  int64_t channels;
  double eps, momentum;
};

// Lookup table. indices int64 (...) -> (..., dim). weight (num, dim) ~ N(0, 1) as torch.nn.Embedding.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);
  Value forward(const Value& indices);
  Value weight;
  int64_t num_embeddings, dim;
};

// Zeroes elements with probability p in training mode and scales the rest by 1/(1-p); identity in eval.
class Dropout : public Module {
 public:
  explicit Dropout(double p);
  Value forward(const Value& x);
  double p;
};

// Causal multi-head self-attention, GPT-2 layout: one fused projection `qkv` (C -> 3C, split in q, k, v
// in that order), ops::causal_attention per head (dropout on the attention weights), output
// projection `proj` (C -> C) and residual dropout. x (B, T, C) -> (B, T, C).
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t n_embd, int64_t n_head, double dropout = 0.0);
  Value forward(const Value& x);
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> resid_drop;
  int64_t n_embd, n_head;
  double attn_dropout;
  int64_t window = 0;  // sliding-window attention over the current and previous `window` steps; 0 = full causal
};

// GPT-2 feed-forward: fc (C -> 4C), GELU (exact erf form), proj (4C -> C), dropout.
class TransformerMLP : public Module {
 public:
  TransformerMLP(int64_t n_embd, double dropout = 0.0);
  Value forward(const Value& x);
  std::shared_ptr<Linear> fc, proj;
  std::shared_ptr<Dropout> drop;
};

// Pre-LN transformer block: x = x + attn(ln1(x)); x = x + mlp(ln2(x)). x (B, T, C) -> (B, T, C).
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t n_embd, int64_t n_head, double dropout = 0.0);
  Value forward(const Value& x);
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<MultiHeadAttention> attn;
  std::shared_ptr<TransformerMLP> mlp;
};

// Multi-layer recurrent nets, batch-first: x (B, T, I) -> outputs of the last layer (B, T, H).
// Initial states are zeros. Unrolled over time with ops::lstm_cell_projected / ops::gru_cell (one graph
// node per step per layer; an LSTM layer's input projection is one linear node over the sequence). Parameters per layer l, PyTorch names and gate layouts: weight_ih_l{l} (G H, I or H),
// weight_hh_l{l} (G H, H), bias_ih_l{l} (G H), bias_hh_l{l} (G H), G = 4 (LSTM: i, f, g, o) or
// 3 (GRU: r, z, n); init U(-1/sqrt(H), 1/sqrt(H)). `dropout` applies to the outputs of every layer
// but the last, in training mode (as torch.nn.LSTM).
class RecurrentBase : public Module {
 public:
  int64_t input_size, hidden_size, num_layers;
  double dropout;
  std::vector<Value> w_ih, w_hh, b_ih, b_hh;  // one per layer

 protected:
  RecurrentBase(int64_t input_size, int64_t hidden_size, int64_t num_layers, double dropout, int64_t gates);
  // One time step of layer l: (x_t (B, I), state) -> new state; state[0] is h (B, H), the step output.
  // x_t is the layer's input at step t, or what `Project` made of it.
  using Step = std::function<Values(int64_t layer, const Value& x_t, const Values& state)>;
  // What the steps of layer l read, from the layer's whole input (B, T*W) of width W per step: T column
  // blocks (B, W) when unset.
  using Project = std::function<Values(int64_t layer, const Value& input, int64_t steps, int64_t width)>;
  // Runs all layers over all steps from zero states (`num_states` tensors of (B, H) per layer).
  Value unroll(const Value& x, const char* what, int num_states, const Step& step, const Project& project = {});
};

// The steps of an LSTM layer read the input's projection x w_ih^T + b_ih, computed for the whole sequence
// (or a streamed chunk) in one matmul, as torch.nn.LSTM does (ops::lstm_cell_projected).
class LSTM : public RecurrentBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, double dropout = 0.0);
  Value forward(const Value& x);
  // Layer l's input (B, T*W) -> T blocks (B, 4H) of x w_ih^T + b_ih.
  Values project_inputs(int64_t layer, const Value& input, int64_t steps, int64_t width);
};

class GRU : public RecurrentBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, double dropout = 0.0);
  Value forward(const Value& x);
};

}  // namespace ration::nn
