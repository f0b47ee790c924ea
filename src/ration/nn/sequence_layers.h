// sequence_layers.h — layers over time that declare their temporal dependency, and the chunk-by-chunk
// forms of the recurrent and attention layers (docs/METHODS.md, "Temporal-dependency buffers for
// sequence models").
// Owns: CausalConv1d (type 2, L = (k - 1) dilation), GatedConvBlock (the tcn_lm block), Bidirectional
//       (GRU or LSTM in both directions, type 3), and the streaming forms lstm_chunk / attention_chunk
//       that continue a sequence from a ring buffer. Each notes the operators it runs with their access to
//       the time axis (seq::note_op), from which the layers' types are derived.
// Does not own: the maths of any op (ops/), the buffers' sizes (seq/dependency.h) or the chunk loop
//       (streaming/stream_executor.h).
#pragma once
#include <memory>
#include <string>

#include "ration/nn/layers.h"
#include "ration/seq/dependency.h"
#include "ration/seq/ring_buffer.h"

namespace ration::nn {

// Causal convolution over time, batch-first like the rest of the sequence models: x (B, T, C_in) ->
// (B, T, C_out); y[t] reads x[t - L .. t]. weight (C_out, C_in, k), bias (C_out),
// init U(-1/sqrt(C_in k), 1/sqrt(C_in k)) as torch.nn.Conv1d.
class CausalConv1d : public Module {
 public:
  CausalConv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t dilation = 1);
  Value forward(const Value& x);
  // The same for the chunk after the steps in `past` (its input ring buffer, width C_in); pushes x.
  Value forward_chunk(const Value& x, seq::RingBuffer& past);
  int64_t window() const { return (kernel_size - 1) * dilation; }  // L
  seq::LayerDependency dependency(const std::string& path) const;
  Value weight, bias;
  int64_t in_channels, out_channels, kernel_size, dilation;
};

// tcn_lm's residual block: x + out(tanh(a) * sigmoid(b)), [a, b] = CausalConv1d(x) (C -> 2C).
// x (B, T, C) -> (B, T, C).
class GatedConvBlock : public Module {
 public:
  GatedConvBlock(int64_t channels, int64_t kernel_size, int64_t dilation);
  Value forward(const Value& x);
  Value forward_chunk(const Value& x, seq::RingBuffer& past);
  std::shared_ptr<CausalConv1d> conv;
  std::shared_ptr<Linear> out;

 private:
  Value gate(const Value& x, const Value& conv_out);
};

// A recurrence run forward and backward over the sequence, outputs concatenated: x (B, T, I) -> (B, T, 2H).
// One layer. Parameters as torch.nn.GRU/LSTM(bidirectional=True): weight_ih_l0, weight_hh_l0, bias_ih_l0,
// bias_hh_l0 and the same with suffix "_reverse"; init U(-1/sqrt(H), 1/sqrt(H)). Output t reads every
// step (the reverse direction starts at T - 1): type 3. Chunk-wise, its buffer holds T steps of
// [input, reverse state] (I + H floats): the inputs as the chunks arrive, the reverse states once the
// sequence is complete (reverse_into), then the forward direction runs chunk by chunk (forward_chunk).
enum class RecurrentCell { GRU, LSTM };
class Bidirectional : public Module {
 public:
  Bidirectional(RecurrentCell cell, int64_t input_size, int64_t hidden_size);
  Value forward(const Value& x);
  seq::LayerDependency dependency(const std::string& path) const;
  // The reverse direction over the whole sequence x (B, T, I), its states written to rev (B, T, H) (a view
  // of the layer's buffer). The same cells as forward(), step for step.
  void reverse_into(const Value& x, at::Tensor rev);
  // The forward direction over a chunk x (B, C, I) from the state (h, c) after the previous chunk (zeros
  // at the start; c unused by a GRU), which it advances: (B, C, H).
  Value forward_chunk(const Value& x, Value& h, Value& c);
  RecurrentCell cell;
  int64_t input_size, hidden_size;
  Value w_ih[2], w_hh[2], b_ih[2], b_hh[2];  // [0] forward, [1] reverse

 private:
  Values run(int dir, const Values& steps);  // T x (B, I) -> T x (B, H) in time order
  void step(int dir, const Value& x, Value& h, Value& c);  // one cell: x (B, I), state (B, H)
  const char* cell_name() const { return cell == RecurrentCell::LSTM ? "lstm_cell" : "gru_cell"; }
};

// LSTM over a chunk x (B, C, I) continuing from the carried state of each layer l in `state[l]`
// (ring buffers of one step, width 2H: [h, c]); returns (B, C, H) and writes the new states. The same
// cells as LSTM::forward step by step, so the results equal the full-sequence forward bit for bit.
Value lstm_chunk(LSTM& lstm, const Value& x, std::vector<seq::RingBuffer*> state);

// Causal self-attention over a chunk x (B, C, C_embd) whose keys and values continue from `kv` (a ring
// buffer of L + 1 steps, width 2 C_embd: [k, v]); the window is attn.window. Pushes the chunk's k, v.
Value attention_chunk(MultiHeadAttention& attn, const Value& x, seq::RingBuffer& kv);

}  // namespace ration::nn
