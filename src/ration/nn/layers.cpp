// layers.cpp — construction (shapes, names, initialisation) and forward of the layers in layers.h.
// Owns: composition of ops into layers. Does not own op maths (ops/*.cpp) or naming rules (module.cpp).
#include "ration/nn/layers.h"

#include <atomic>
#include <cmath>
#include <string>

#include "ration/base/check.h"
#include "ration/nn/observe.h"
#include "ration/ops/ops.h"
#include "ration/ops/recurrent.h"

namespace ration::nn {
namespace {

std::atomic<LayerObserver*> installed_observer{nullptr};

// The layer's output, observed in backward when an observer is installed (nn/observe.h).
Value observed(const Value& y, const std::string& layer) {
  LayerObserver* o = installed_observer.load();
  if (o == nullptr) return y;
  return ops::observe_grad(y, [o, layer](const at::Tensor& g) { o->output_grad(layer, g); });
}

// U(-bound, bound) from ATen's default generator, float32 CPU.
at::Tensor uniform(std::vector<int64_t> shape, double bound) {
  return at::empty(shape, at::kFloat).uniform_(-bound, bound);
}

}  // namespace

LayerObserver* layer_observer() { return installed_observer.load(); }
LayerObserverScope::LayerObserverScope(LayerObserver* observer) : previous_(installed_observer.exchange(observer)) {}
LayerObserverScope::~LayerObserverScope() { installed_observer.store(previous_); }

// ---- Linear ---------------------------------------------------------------------------------------
Linear::Linear(int64_t in, int64_t out, bool with_bias) : in_features(in), out_features(out) {
  RATION_CHECK(in > 0 && out > 0, "Linear needs positive sizes; got in=", in, " out=", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", uniform({out, in}, bound));  // (out, in)
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));  // (out)
}

Value Linear::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear(", in_features, " -> ", out_features,
               ") expects input (..., ", in_features, "); got ", x.sizes());
  if (LayerObserver* o = layer_observer()) o->linear_input(name(), x.tensor());
  return observed(ops::linear(x, weight, bias), name());
}

// ---- Conv2d ---------------------------------------------------------------------------------------
Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, int64_t stride_, int64_t padding_, bool with_bias)
    : in_channels(in), out_channels(out), kernel_size(k), stride(stride_), padding(padding_) {
  RATION_CHECK(in > 0 && out > 0 && k > 0 && stride_ > 0 && padding_ >= 0, "Conv2d: bad configuration in=", in,
               " out=", out, " kernel=", k, " stride=", stride_, " padding=", padding_);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in * k * k));
  weight = register_parameter("weight", uniform({out, in, k, k}, bound));  // (C_out, C_in, k, k)
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));  // (C_out)
}

Value Conv2d::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 4 && x.size(1) == in_channels, "Conv2d(", in_channels, " -> ", out_channels,
               ") expects input (B, ", in_channels, ", H, W); got ", x.sizes());
  if (LayerObserver* o = layer_observer()) o->conv_input(name(), *this, x.tensor());
  return observed(ops::conv2d(x, weight, bias, {stride, stride}, {padding, padding}), name());
}

// ---- pooling --------------------------------------------------------------------------------------
MaxPool2d::MaxPool2d(int64_t k, int64_t stride_, int64_t padding_)
    : kernel_size(k), stride(stride_ > 0 ? stride_ : k), padding(padding_) {
  RATION_CHECK(k > 0 && padding_ >= 0 && 2 * padding_ <= k, "MaxPool2d: bad kernel ", k, " / padding ", padding_,
               " (padding must be at most half the kernel)");
}

Value MaxPool2d::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 4, "MaxPool2d expects (B, C, H, W); got ", x.sizes());
  return ops::max_pool2d(x, {kernel_size, kernel_size}, {stride, stride}, {padding, padding});
}

AvgPool2d::AvgPool2d(int64_t k, int64_t stride_, int64_t padding_)
    : kernel_size(k), stride(stride_ > 0 ? stride_ : k), padding(padding_) {
  RATION_CHECK(k > 0 && padding_ >= 0 && 2 * padding_ <= k, "AvgPool2d: bad kernel ", k, " / padding ", padding_,
               " (padding must be at most half the kernel)");
}

Value AvgPool2d::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 4, "AvgPool2d expects (B, C, H, W); got ", x.sizes());
  return ops::avg_pool2d(x, {kernel_size, kernel_size}, {stride, stride}, {padding, padding});
}

// ---- normalisation --------------------------------------------------------------------------------
LayerNorm::LayerNorm(int64_t dim_, double eps_) : dim(dim_), eps(eps_) {
  RATION_CHECK(dim_ > 0, "LayerNorm needs a positive size; got ", dim_);
  weight = register_parameter("weight", at::ones({dim_}, at::kFloat));  // (D)
  bias = register_parameter("bias", at::zeros({dim_}, at::kFloat));     // (D)
}

Value LayerNorm::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() >= 1 && x.size(-1) == dim, "LayerNorm(", dim, ") expects input (..., ", dim, "); got ",
               x.sizes());
  return ops::layer_norm(x, {dim}, weight, bias, eps);
}

BatchNorm2d::BatchNorm2d(int64_t c, double eps_, double momentum_) : channels(c), eps(eps_), momentum(momentum_) {
  RATION_CHECK(c > 0, "BatchNorm2d needs a positive channel count; got ", c);
  weight = register_parameter("weight", at::ones({c}, at::kFloat));  // (C)
  bias = register_parameter("bias", at::zeros({c}, at::kFloat));     // (C)
  running_mean = register_buffer("running_mean", at::zeros({c}, at::kFloat));  // (C)
  running_var = register_buffer("running_var", at::ones({c}, at::kFloat));     // (C)
}

Value BatchNorm2d::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 4 && x.size(1) == channels, "BatchNorm2d(", channels, ") expects (B, ", channels,
               ", H, W); got ", x.sizes());
  return ops::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
}

// ---- Embedding, Dropout ---------------------------------------------------------------------------
Embedding::Embedding(int64_t num, int64_t dim_) : num_embeddings(num), dim(dim_) {
  RATION_CHECK(num > 0 && dim_ > 0, "Embedding needs positive sizes; got ", num, " x ", dim_);
  weight = register_parameter("weight", at::randn({num, dim_}, at::kFloat));  // (num, dim)
}

Value Embedding::forward(const Value& indices) {
  ScopeGuard scope(name());
  RATION_CHECK(indices.dtype() == at::kLong, "Embedding expects int64 indices; got ", indices.dtype());
  return ops::embedding(weight, indices);
}

Dropout::Dropout(double p_) : p(p_) {
  RATION_CHECK(p_ >= 0.0 && p_ < 1.0, "dropout probability must be in [0, 1); got ", p_);
}

Value Dropout::forward(const Value& x) {
  // No node (and no RNG draw) when dropout cannot change anything.
  if (!is_training() || p == 0.0) return x;
  ScopeGuard scope(name());
  return ops::dropout(x, p, true);
}

// ---- attention and the transformer block ------------------------------------------------------------
MultiHeadAttention::MultiHeadAttention(int64_t n_embd_, int64_t n_head_, double dropout)
    : n_embd(n_embd_), n_head(n_head_), attn_dropout(dropout) {
  RATION_CHECK(n_head_ > 0 && n_embd_ % n_head_ == 0, "attention: n_embd (", n_embd_,
               ") must be a multiple of n_head (", n_head_, ")");
  qkv = register_module("qkv", std::make_shared<Linear>(n_embd_, 3 * n_embd_));
  proj = register_module("proj", std::make_shared<Linear>(n_embd_, n_embd_));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(dropout));
}

Value MultiHeadAttention::forward(const Value& x) {
  ScopeGuard scope(name());
  RATION_CHECK(x.dim() == 3 && x.size(2) == n_embd, "attention expects (B, T, ", n_embd, "); got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), C = n_embd, H = n_head, D = C / H;
  Values qkv_parts = ops::split(qkv->forward(x), C, 2);  // 3 x (B, T, C)
  auto to_heads = [&](const Value& t) { return ops::transpose(ops::reshape(t, {B, T, H, D}), 1, 2); };
  Value q = to_heads(qkv_parts[0]);  // (B, H, T, D)
  Value k = to_heads(qkv_parts[1]);  // (B, H, T, D)
  Value v = to_heads(qkv_parts[2]);  // (B, H, T, D)
  Value y = ops::causal_attention(q, k, v, attn_dropout, is_training(), window);  // (B, H, T, D)
  y = ops::reshape(ops::transpose(y, 1, 2), {B, T, C});                   // (B, T, C)
  return resid_drop->forward(proj->forward(y));
}

TransformerMLP::TransformerMLP(int64_t n_embd, double dropout) {
  fc = register_module("fc", std::make_shared<Linear>(n_embd, 4 * n_embd));
  proj = register_module("proj", std::make_shared<Linear>(4 * n_embd, n_embd));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Value TransformerMLP::forward(const Value& x) {
  ScopeGuard scope(name());
  return drop->forward(proj->forward(ops::gelu(fc->forward(x))));
}

TransformerBlock::TransformerBlock(int64_t n_embd, int64_t n_head, double dropout) {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(n_embd));
  attn = register_module("attn", std::make_shared<MultiHeadAttention>(n_embd, n_head, dropout));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(n_embd));
  mlp = register_module("mlp", std::make_shared<TransformerMLP>(n_embd, dropout));
}

Value TransformerBlock::forward(const Value& x) {
  ScopeGuard scope(name());
  Value h = x + attn->forward(ln1->forward(x));  // (B, T, C)
  return h + mlp->forward(ln2->forward(h));      // (B, T, C)
}

// ---- recurrent ------------------------------------------------------------------------------------
RecurrentBase::RecurrentBase(int64_t in, int64_t hidden, int64_t layers, double dropout_, int64_t gates)
    : input_size(in), hidden_size(hidden), num_layers(layers), dropout(dropout_) {
  RATION_CHECK(in > 0 && hidden > 0 && layers > 0, "recurrent layer needs positive sizes; got input ", in,
               ", hidden ", hidden, ", layers ", layers);
  RATION_CHECK(dropout_ >= 0.0 && dropout_ < 1.0, "recurrent dropout must be in [0, 1); got ", dropout_);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string s = "_l" + std::to_string(l);
    const int64_t layer_in = l == 0 ? in : hidden;
    w_ih.push_back(register_parameter("weight_ih" + s, uniform({gates * hidden, layer_in}, bound)));  // (G H, I)
    w_hh.push_back(register_parameter("weight_hh" + s, uniform({gates * hidden, hidden}, bound)));    // (G H, H)
    b_ih.push_back(register_parameter("bias_ih" + s, uniform({gates * hidden}, bound)));              // (G H)
    b_hh.push_back(register_parameter("bias_hh" + s, uniform({gates * hidden}, bound)));              // (G H)
  }
}

Value RecurrentBase::unroll(const Value& x, const char* what, int num_states, const Step& step,
                            const Project& project) {
  RATION_CHECK(x.dim() == 3 && x.size(2) == input_size, what, " expects batch-first input (B, T, ", input_size,
               "); got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), H = hidden_size;
  RATION_CHECK(T > 0, what, " needs at least one time step; got ", x.sizes());
  const at::TensorOptions opts = w_ih[0].tensor().options();
  // (B, T, I) -> (B, T*I): each layer's input, T column blocks (B, width) side by side.
  Value layer_input = ops::reshape(x, {B, T * input_size});
  int64_t width = input_size;
  Value flat;  // (B, T*H): the step outputs of the current layer side by side
  for (int64_t l = 0; l < num_layers; ++l) {
    const Values inputs = project ? project(l, layer_input, T, width) : ops::split(layer_input, width, 1);
    Values state;
    for (int s = 0; s < num_states; ++s) state.emplace_back(at::zeros({B, H}, opts));  // (B, H)
    Values hs;  // T x (B, H)
    hs.reserve(static_cast<size_t>(T));
    for (const Value& x_t : inputs) {
      state = step(l, x_t, state);
      hs.push_back(state[0]);
    }
    flat = ops::cat(hs, 1);  // (B, T*H)
    if (l + 1 < num_layers) {
      if (is_training() && dropout > 0.0) flat = ops::dropout(flat, dropout, true);
      layer_input = flat;
      width = H;
    }
  }
  return ops::reshape(flat, {B, T, H});  // (B, T, H)
}

LSTM::LSTM(int64_t in, int64_t hidden, int64_t layers, double dropout_)
    : RecurrentBase(in, hidden, layers, dropout_, 4) {}

Values LSTM::project_inputs(int64_t l, const Value& input, int64_t steps, int64_t width) {
  const size_t i = static_cast<size_t>(l);
  const int64_t B = input.size(0), G = 4 * hidden_size;
  const Value gx = ops::linear(ops::reshape(input, {B * steps, width}), w_ih[i], b_ih[i]);  // (B*T, 4H), row b*T + t
  return ops::split(ops::reshape(gx, {B, steps * G}), G, 1);                               // T x (B, 4H)
}

Value LSTM::forward(const Value& x) {
  ScopeGuard scope(name());
  return unroll(
      x, "LSTM", 2,
      [this](int64_t l, const Value& gx_t, const Values& hc) {
        const size_t i = static_cast<size_t>(l);
        return ops::lstm_cell_projected(gx_t, hc[0], hc[1], w_hh[i], b_hh[i]);  // {h, c}
      },
      [this](int64_t l, const Value& input, int64_t steps, int64_t width) {
        return project_inputs(l, input, steps, width);
      });
}

GRU::GRU(int64_t in, int64_t hidden, int64_t layers, double dropout_)
    : RecurrentBase(in, hidden, layers, dropout_, 3) {}

Value GRU::forward(const Value& x) {
  ScopeGuard scope(name());
  return unroll(x, "GRU", 1, [this](int64_t l, const Value& x_t, const Values& h) {
    return Values{ops::gru_cell(x_t, h[0], w_ih[l], w_hh[l], b_ih[l], b_hh[l])};
  });
}

}  // namespace ration::nn
