// sequence_layers.cpp — see sequence_layers.h.
#include "ration/nn/sequence_layers.h"

#include <cmath>

#include "ration/base/check.h"
#include "ration/ops/ops.h"
#include "ration/ops/recurrent.h"

namespace ration::nn {

namespace {
at::Tensor uniform(std::vector<int64_t> shape, double bound) {
  return at::empty(shape, at::kFloat).uniform_(-bound, bound);
}
// (B, n, W) ring-buffer steps as a graph input without gradient.
Value steps_value(const at::Tensor& t) { return Value(t, false); }
}  // namespace

// ---- CausalConv1d -----------------------------------------------------------------------------------
CausalConv1d::CausalConv1d(int64_t in, int64_t out, int64_t k, int64_t d)
    : in_channels(in), out_channels(out), kernel_size(k), dilation(d) {
  RATION_CHECK(in > 0 && out > 0 && k >= 1 && d >= 1, "causal conv needs positive channels, kernel_size >= 1 and ",
               "dilation >= 1; got in ", in, ", out ", out, ", kernel ", k, ", dilation ", d);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in * k));
  weight = register_parameter("weight", uniform({out, in, k}, bound));  // (C_out, C_in, k)
  bias = register_parameter("bias", uniform({out}, bound));             // (C_out)
}

Value CausalConv1d::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 3 && x.size(2) == in_channels, "causal conv expects (B, T, ", in_channels, "); got ",
               x.sizes());
  Value y = ops::conv1d_causal(ops::transpose(x, 1, 2), weight, bias, dilation);  // (B, C_out, T)
  return ops::transpose(y, 1, 2);                                                  // (B, T, C_out)
}

Value CausalConv1d::forward_chunk(const Value& x, seq::RingBuffer& past) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 3 && x.size(2) == in_channels, "causal conv expects (B, C, ", in_channels, "); got ",
               x.sizes());
  seq::note_op("conv1d_causal", window() > 0 ? seq::TimeAccess::CausalWindow : seq::TimeAccess::Pointwise, window());
  Value context;
  if (window() > 0 && past.filled() > 0)
    context = steps_value(past.last(window()).transpose(1, 2).contiguous());  // (B, C_in, P)
  Value y = ops::conv1d_causal(ops::transpose(x, 1, 2), weight, bias, dilation, context);  // (B, C_out, C)
  past.push(x.tensor().detach());
  return ops::transpose(y, 1, 2);  // (B, C, C_out)
}

seq::LayerDependency CausalConv1d::dependency(const std::string& path) const {
  seq::LayerDependency d;
  d.layer = path;
  d.type = window() > 0 ? seq::Dependency::Window : seq::Dependency::PerStep;
  d.window = window();
  d.step_floats = in_channels;
  d.holds = "input";
  d.carries = window() > 0;
  return d;
}

// ---- GatedConvBlock ---------------------------------------------------------------------------------
GatedConvBlock::GatedConvBlock(int64_t channels, int64_t kernel_size, int64_t dilation) {
  conv = register_module("conv", std::make_shared<CausalConv1d>(channels, 2 * channels, kernel_size, dilation));
  out = register_module("out", std::make_shared<Linear>(channels, channels));
}

Value GatedConvBlock::gate(const Value& x, const Value& conv_out) {
  Values ab = ops::split(conv_out, x.size(2), 2);                    // 2 x (B, T, C)
  Value gated = ops::mul(ops::tanh(ab[0]), ops::sigmoid(ab[1]));    // (B, T, C)
  return x + out->forward(gated);                                    // (B, T, C)
}

Value GatedConvBlock::forward(const Value& x) {
  ScopeGuard scope(name());
  return gate(x, conv->forward(x));
}

Value GatedConvBlock::forward_chunk(const Value& x, seq::RingBuffer& past) {
  ScopeGuard scope(name());
  seq::note_op("tanh * sigmoid, linear", seq::TimeAccess::Pointwise, 0, ".out");
  return gate(x, conv->forward_chunk(x, past));
}

// ---- Bidirectional ----------------------------------------------------------------------------------
Bidirectional::Bidirectional(RecurrentCell c, int64_t in, int64_t hidden)
    : cell(c), input_size(in), hidden_size(hidden) {
  RATION_CHECK(in > 0 && hidden > 0, "bidirectional recurrence needs positive sizes; got input ", in, ", hidden ",
               hidden);
  const int64_t g = (c == RecurrentCell::LSTM ? 4 : 3) * hidden;
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (int dir = 0; dir < 2; ++dir) {
    const std::string s = dir == 0 ? "_l0" : "_l0_reverse";
    w_ih[dir] = register_parameter("weight_ih" + s, uniform({g, in}, bound));      // (G H, I)
    w_hh[dir] = register_parameter("weight_hh" + s, uniform({g, hidden}, bound));  // (G H, H)
    b_ih[dir] = register_parameter("bias_ih" + s, uniform({g}, bound));            // (G H)
    b_hh[dir] = register_parameter("bias_hh" + s, uniform({g}, bound));            // (G H)
  }
}

void Bidirectional::step(int dir, const Value& x, Value& h, Value& c) {
  if (cell == RecurrentCell::LSTM) {
    Values hc = ops::lstm_cell(x, h, c, w_ih[dir], w_hh[dir], b_ih[dir], b_hh[dir]);
    h = hc[0];
    c = hc[1];
  } else {
    h = ops::gru_cell(x, h, w_ih[dir], w_hh[dir], b_ih[dir], b_hh[dir]);
  }
}

Values Bidirectional::run(int dir, const Values& steps) {
  // The forward direction reads step t and its own state; the reverse one, started at T - 1, reads every
  // later step.
  seq::note_op(std::string(cell_name()) + (dir == 0 ? " (forward)" : " (reverse)"),
               dir == 0 ? seq::TimeAccess::CarriedState : seq::TimeAccess::WholeSequence);
  const int64_t B = steps.front().size(0), T = static_cast<int64_t>(steps.size());
  const at::TensorOptions opts = w_ih[0].tensor().options();
  Value h(at::zeros({B, hidden_size}, opts)), c(at::zeros({B, hidden_size}, opts));  // (B, H) each
  Values out(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    const size_t t = static_cast<size_t>(dir == 0 ? i : T - 1 - i);
    step(dir, steps[t], h, c);
    out[t] = h;
  }
  return out;
}

void Bidirectional::reverse_into(const Value& x, at::Tensor rev) {
  ScopeGuard scope(name());
  seq::note_op(std::string(cell_name()) + " (reverse)", seq::TimeAccess::WholeSequence);
  RATION_CHECK(x.dim() == 3 && x.size(2) == input_size && rev.dim() == 3 && rev.size(1) == x.size(1) &&
                   rev.size(2) == hidden_size, "bidirectional reverse pass expects x (B, T, ", input_size,
               ") and states (B, T, ", hidden_size, "); got ", x.sizes(), " and ", rev.sizes());
  const int64_t B = x.size(0), T = x.size(1);
  const at::TensorOptions opts = w_ih[1].tensor().options();
  Value h(at::zeros({B, hidden_size}, opts)), c(at::zeros({B, hidden_size}, opts));  // (B, H) each
  for (int64_t t = T - 1; t >= 0; --t) {
    step(1, Value(x.tensor().select(1, t), false), h, c);
    rev.select(1, t).copy_(h.tensor());
  }
}

Value Bidirectional::forward_chunk(const Value& x, Value& h, Value& c) {
  ScopeGuard scope(name());
  seq::note_op(std::string(cell_name()) + " (forward)", seq::TimeAccess::CarriedState);
  RATION_CHECK(x.dim() == 3 && x.size(2) == input_size && x.size(1) > 0, "bidirectional chunk expects (B, C > 0, ",
               input_size, "); got ", x.sizes());
  const int64_t B = x.size(0), C = x.size(1);
  const at::TensorOptions opts = w_ih[0].tensor().options();
  if (!h.defined()) h = Value(at::zeros({B, hidden_size}, opts));
  if (!c.defined()) c = Value(at::zeros({B, hidden_size}, opts));
  Values hs;
  hs.reserve(static_cast<size_t>(C));
  for (int64_t t = 0; t < C; ++t) {
    step(0, Value(x.tensor().select(1, t), false), h, c);
    hs.push_back(h);
  }
  return ops::reshape(ops::cat(hs, 1), {B, C, hidden_size});  // (B, C, H)
}

Value Bidirectional::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 3 && x.size(2) == input_size && x.size(1) > 0, "bidirectional recurrence expects (B, T > 0, ",
               input_size, "); got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), H = hidden_size;
  Values steps = ops::split(ops::reshape(x, {B, T * input_size}), input_size, 1);  // T x (B, I)
  Values fwd = run(0, steps), bwd = run(1, steps);                                  // T x (B, H) each
  Values both;
  both.reserve(static_cast<size_t>(2 * T));
  for (int64_t t = 0; t < T; ++t) {
    both.push_back(fwd[static_cast<size_t>(t)]);
    both.push_back(bwd[static_cast<size_t>(t)]);
  }
  return ops::reshape(ops::cat(both, 1), {B, T, 2 * H});  // (B, T, 2H)
}

seq::LayerDependency Bidirectional::dependency(const std::string& path) const {
  seq::LayerDependency d;
  d.layer = path;
  d.type = seq::Dependency::WholeSequence;
  d.step_floats = input_size + hidden_size;
  d.holds = "input, reverse h";
  d.carries = true;
  return d;
}

// ---- streaming forms of LSTM and attention ----------------------------------------------------------
Value lstm_chunk(LSTM& lstm, const Value& x, std::vector<seq::RingBuffer*> state) {
  ScopeGuard scope(lstm.name());
  RATION_CHECK(x.dim() == 3 && x.size(2) == lstm.input_size && x.size(1) > 0, "LSTM chunk expects (B, C > 0, ",
               lstm.input_size, "); got ", x.sizes());
  RATION_CHECK(static_cast<int64_t>(state.size()) == lstm.num_layers, "LSTM chunk needs one state buffer per layer (",
               lstm.num_layers, "); got ", state.size());
  const int64_t B = x.size(0), C = x.size(1), H = lstm.hidden_size;
  const at::TensorOptions opts = lstm.w_ih[0].tensor().options();
  for (int64_t l = 0; l < lstm.num_layers; ++l)
    seq::note_op("lstm_cell", seq::TimeAccess::CarriedState, 0, ".l" + std::to_string(l));
  // Exactly the ops of RecurrentBase::unroll, started from the carried state instead of zeros.
  Value layer_input = ops::reshape(x, {B, C * lstm.input_size});  // (B, C*I)
  int64_t width = lstm.input_size;
  Value flat;
  for (int64_t l = 0; l < lstm.num_layers; ++l) {
    const Values inputs = lstm.project_inputs(l, layer_input, C, width);  // C x (B, 4H)
    seq::RingBuffer& buf = *state[static_cast<size_t>(l)];
    Value h, c;
    if (buf.filled() == 0) {
      h = Value(at::zeros({B, H}, opts));
      c = Value(at::zeros({B, H}, opts));
    } else {
      const at::Tensor hc = buf.last(1).reshape({B, 2 * H});  // (B, 2H)
      h = Value(hc.narrow(1, 0, H).contiguous());
      c = Value(hc.narrow(1, H, H).contiguous());
    }
    Values hs;
    hs.reserve(static_cast<size_t>(C));
    for (const Value& gx_t : inputs) {
      Values next = ops::lstm_cell_projected(gx_t, h, c, lstm.w_hh[l], lstm.b_hh[l]);
      h = next[0];
      c = next[1];
      hs.push_back(h);
    }
    buf.push(at::cat({h.tensor(), c.tensor()}, 1).detach().reshape({B, 1, 2 * H}));
    flat = ops::cat(hs, 1);  // (B, C*H)
    if (l + 1 < lstm.num_layers) {
      if (lstm.is_training() && lstm.dropout > 0.0) flat = ops::dropout(flat, lstm.dropout, true);
      layer_input = flat;
      width = H;
    }
  }
  return ops::reshape(flat, {B, C, H});  // (B, C, H)
}

Value attention_chunk(MultiHeadAttention& attn, const Value& x, seq::RingBuffer& kv) {
  ScopeGuard scope(attn.name());
  // Windowed: the last L steps' keys and values; full attention (window 0): every earlier step's, from a
  // type-3 buffer of T steps.
  seq::note_op("causal_attention", attn.window > 0 ? seq::TimeAccess::CausalWindow : seq::TimeAccess::WholeSequence,
               attn.window);
  RATION_CHECK(x.dim() == 3 && x.size(2) == attn.n_embd, "attention expects (B, C, ", attn.n_embd, "); got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), C = attn.n_embd, H = attn.n_head, D = C / H;
  Values qkv_parts = ops::split(attn.qkv->forward(x), C, 2);  // 3 x (B, T, C)
  Value k = qkv_parts[1], v = qkv_parts[2];
  RATION_CHECK(attn.window > 0 || kv.filled() + T <= kv.capacity(), "attention layer '", attn.name(),
               "' attends the whole sequence: its buffer holds ", kv.capacity(), " steps, the stream is longer");
  const at::Tensor past = kv.last(attn.window > 0 ? attn.window : kv.capacity());  // (B, P, 2C)
  const int64_t P = past.size(1);
  if (P > 0) {
    k = ops::cat({steps_value(past.narrow(2, 0, C).contiguous()), k}, 1);  // (B, P + T, C)
    v = ops::cat({steps_value(past.narrow(2, C, C).contiguous()), v}, 1);  // (B, P + T, C)
  }
  kv.push(at::cat({qkv_parts[1].tensor(), qkv_parts[2].tensor()}, 2).detach());
  auto to_heads = [&](const Value& t) { return ops::transpose(ops::reshape(t, {B, t.size(1), H, D}), 1, 2); };
  Value y = ops::causal_attention(to_heads(qkv_parts[0]), to_heads(k), to_heads(v), attn.attn_dropout,
                                  attn.is_training(), attn.window);  // (B, H, T, D)
  y = ops::reshape(ops::transpose(y, 1, 2), {B, T, C});               // (B, T, C)
  return attn.resid_drop->forward(attn.proj->forward(y));
}

}  // namespace ration::nn
