// native_ops.cpp — see native_ops.h. One small function per aten op; each returns nullopt for the calls
// ration's op does not cover (the generic node then runs them exactly as libtorch would).
#include "ration/torchscript/native_ops.h"

#include <algorithm>
#include <map>

#include "ration/ops/ops.h"
#include "ration/ops/recurrent.h"

namespace ration::torchscript {

Value NodeArgs::value(size_t i) const {
  const c10::IValue& v = args_.at(i);
  return v.isNone() ? Value() : value_of_(v.toTensor());
}

Values NodeArgs::values(size_t i) const {
  Values out;
  for (const c10::IValue& e : args_.at(i).toListRef()) out.push_back(e.isNone() ? Value() : value_of_(e.toTensor()));
  return out;
}

double NodeArgs::number(size_t i) const {
  const c10::IValue& v = args_.at(i);
  if (v.isDouble()) return v.toDouble();
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return static_cast<double>(v.toInt());
}

std::vector<int64_t> NodeArgs::ints(size_t i) const {
  const c10::IValue& v = args_.at(i);
  if (v.isInt()) return {v.toInt()};
  return v.toIntVector();
}

namespace {

using Out = std::optional<Values>;  // a native op's outputs
using Out1 = std::optional<Value>;  // an op with one output

bool all_ones(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x != 1) return false;
  return true;
}
bool pair_or_empty(const std::vector<int64_t>& v) { return v.empty() || v.size() == 2; }

// ---- linear algebra and convolution ----------------------------------------------------------------------
Out1 linear(const NodeArgs& a) { return ops::linear(a.value(0), a.value(1), a.value(2)); }
Out1 matmul(const NodeArgs& a) { return ops::matmul(a.value(0), a.value(1)); }
Out1 bmm(const NodeArgs& a) { return ops::bmm(a.value(0), a.value(1)); }

// conv2d(input, weight, bias, stride, padding, dilation, groups); padding "same"/"valid" goes generic.
Out1 conv2d(const NodeArgs& a) {
  if (a.is_string(4) || a.value(0).dim() != 4) return std::nullopt;
  const auto stride = a.ints(3), padding = a.ints(4), dilation = a.ints(5);
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) return std::nullopt;
  return ops::conv2d(a.value(0), a.value(1), a.value(2), stride, padding, dilation, a.integer(6));
}

// max_pool2d(input, kernel, stride, padding, dilation, ceil_mode)
Out1 max_pool2d(const NodeArgs& a) {
  const auto kernel = a.ints(1), stride = a.ints(2), padding = a.ints(3);
  if (a.value(0).dim() != 4 || kernel.size() != 2 || !pair_or_empty(stride) || padding.size() != 2 ||
      !all_ones(a.ints(4)) || a.boolean(5))
    return std::nullopt;
  return ops::max_pool2d(a.value(0), kernel, stride, padding);
}

// avg_pool2d(input, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
Out1 avg_pool2d(const NodeArgs& a) {
  const auto kernel = a.ints(1), stride = a.ints(2), padding = a.ints(3);
  if (a.value(0).dim() != 4 || kernel.size() != 2 || !pair_or_empty(stride) || padding.size() != 2 || a.boolean(4) ||
      !a.boolean(5) || !a.is_none(6))
    return std::nullopt;
  return ops::avg_pool2d(a.value(0), kernel, stride, padding);
}

// ---- activations ---------------------------------------------------------------------------------------
Out1 relu(const NodeArgs& a) { return ops::relu(a.value(0)); }
Out1 tanh(const NodeArgs& a) { return ops::tanh(a.value(0)); }
Out1 sigmoid(const NodeArgs& a) { return ops::sigmoid(a.value(0)); }
Out1 gelu(const NodeArgs& a) { return ops::gelu(a.value(0), a.size() > 1 ? a.str(1) : "none"); }
// softmax(input, dim, dtype): a dtype conversion goes generic.
Out1 softmax(const NodeArgs& a) {
  if (a.size() > 2 && !a.is_none(2)) return std::nullopt;
  return ops::softmax(a.value(0), a.integer(1));
}
Out1 log_softmax(const NodeArgs& a) {
  if (a.size() > 2 && !a.is_none(2)) return std::nullopt;
  return ops::log_softmax(a.value(0), a.integer(1));
}

// ---- normalisation and regularisation --------------------------------------------------------------------
// layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)
Out1 layer_norm(const NodeArgs& a) {
  return ops::layer_norm(a.value(0), a.ints(1), a.value(2), a.value(3), a.number(4));
}
// batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled): the
// running statistics are the module's own buffers, updated in place as PyTorch does.
Out1 batch_norm(const NodeArgs& a) {
  if (a.value(0).dim() < 2 || (a.is_none(3) && !a.boolean(5))) return std::nullopt;
  const at::Tensor mean = a.is_none(3) ? at::Tensor() : a.value(3).tensor();
  const at::Tensor var = a.is_none(4) ? at::Tensor() : a.value(4).tensor();
  return ops::batch_norm(a.value(0), a.value(1), a.value(2), mean, var, a.boolean(5), a.number(6), a.number(7));
}
// dropout(input, p, train)
Out1 dropout(const NodeArgs& a) { return ops::dropout(a.value(0), a.number(1), a.boolean(2)); }
// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
Out1 embedding(const NodeArgs& a) {
  if (a.boolean(3) || a.boolean(4)) return std::nullopt;
  return ops::embedding(a.value(0), a.value(1), a.integer(2));
}

// ---- elementwise (alpha other than 1 and rounding modes go generic) ---------------------------------------
Out1 add(const NodeArgs& a) {
  if (a.size() > 2 && a.number(2) != 1.0) return std::nullopt;
  return a.is_tensor(1) ? ops::add(a.value(0), a.value(1)) : ops::add_scalar(a.value(0), a.number(1));
}
Out1 sub(const NodeArgs& a) {
  if (a.size() > 2 && a.number(2) != 1.0) return std::nullopt;
  return a.is_tensor(1) ? ops::sub(a.value(0), a.value(1)) : ops::add_scalar(a.value(0), -a.number(1));
}
Out1 mul(const NodeArgs& a) {
  return a.is_tensor(1) ? ops::mul(a.value(0), a.value(1)) : ops::mul_scalar(a.value(0), a.number(1));
}
// div(input, other): a tensor or a scalar (x / s, which rounds differently from x * (1 / s)); a rounding mode
// goes generic.
Out1 div(const NodeArgs& a) {
  if (a.size() != 2) return std::nullopt;
  return a.is_tensor(1) ? ops::div(a.value(0), a.value(1)) : ops::div_scalar(a.value(0), a.number(1));
}

// ---- shape -----------------------------------------------------------------------------------------------
Out1 view(const NodeArgs& a) { return ops::view(a.value(0), a.ints(1)); }
Out1 reshape(const NodeArgs& a) { return ops::reshape(a.value(0), a.ints(1)); }
Out1 flatten(const NodeArgs& a) { return ops::flatten(a.value(0), a.integer(1), a.integer(2)); }
Out1 transpose(const NodeArgs& a) { return ops::transpose(a.value(0), a.integer(1), a.integer(2)); }
Out1 permute(const NodeArgs& a) { return ops::permute(a.value(0), a.ints(1)); }
Out1 cat(const NodeArgs& a) { return ops::cat(a.values(0), a.integer(1)); }
// The dimension d of x (negative counts from the end; `extra` = 1 for a position among dim() + 1), or -1.
int64_t dim_of(const Value& x, int64_t d, int64_t extra = 0) {
  const int64_t n = x.dim() + extra;
  if (d < 0) d += n;
  return d >= 0 && d < n ? d : -1;
}

// slice(input, dim, start, end, step): None bounds are the whole dimension, negative ones count from its end.
Out1 slice(const NodeArgs& a) {
  if (a.size() != 5 || !a.is_tensor(0)) return std::nullopt;  // aten::slice.t slices a list
  const Value x = a.value(0);
  if (x.dim() == 0) return std::nullopt;
  const int64_t dim = dim_of(x, a.integer(1));
  if (dim < 0) return std::nullopt;
  const int64_t len = x.size(dim);
  auto bound = [&](size_t i, int64_t none) {
    if (a.is_none(i)) return none;
    const int64_t v = a.integer(i);
    return std::clamp(v < 0 ? v + len : v, int64_t{0}, len);
  };
  const int64_t start = bound(2, 0), end = std::max(start, bound(3, len));
  return ops::slice(x, dim, start, end, a.integer(4));
}
// contiguous(input, memory_format): a contiguous input is itself (no node); otherwise a flat copy (reshape of a
// tensor no view can flatten copies it) viewed back to its shape, whose backward is the gradient's reshape.
// nn.MultiheadAttention calls it on every head split; as a generic node its backward re-ran the copy.
Out1 contiguous(const NodeArgs& a) {
  if (a.size() > 1 && !a.is_none(1) && a.integer(1) != static_cast<int64_t>(at::MemoryFormat::Contiguous))
    return std::nullopt;
  const Value x = a.value(0);
  if (x.tensor().is_contiguous()) return x;
  return ops::view(ops::reshape(x, {-1}), x.sizes().vec());
}

// ---- reductions: mean/sum(input, dtype) and mean/sum(input, dims, keepdim, dtype) --------------------------
Out1 mean(const NodeArgs& a) {
  if (a.size() == 2) return a.is_none(1) ? Out1(ops::mean(a.value(0))) : std::nullopt;
  if (a.size() != 4 || !a.is_none(3) || a.is_none(1) || a.is_string(1)) return std::nullopt;
  return ops::mean(a.value(0), a.ints(1), a.boolean(2));
}
Out1 sum(const NodeArgs& a) {
  if (a.size() == 2) return a.is_none(1) ? Out1(ops::sum(a.value(0))) : std::nullopt;
  if (a.size() != 4 || !a.is_none(3) || a.is_none(1) || a.is_string(1)) return std::nullopt;
  return ops::sum(a.value(0), a.ints(1), a.boolean(2));
}

// ---- losses (mean reduction) -------------------------------------------------------------------------------
// cross_entropy_loss(input, target, weight, reduction, ignore_index, label_smoothing); reduction 1 = mean.
Out1 cross_entropy(const NodeArgs& a) {
  if (a.value(0).dim() != 2 || !a.is_none(2) || a.integer(3) != 1 || a.number(5) != 0.0 ||
      a.value(1).dtype() != at::kLong)
    return std::nullopt;
  return ops::cross_entropy(a.value(0), a.value(1), a.integer(4));
}
Out1 mse_loss(const NodeArgs& a) {
  if (a.integer(2) != 1 || a.value(0).sizes() != a.value(1).sizes()) return std::nullopt;
  return ops::mse_loss(a.value(0), a.value(1));
}

// ---- recurrent ---------------------------------------------------------------------------------------------
// lstm(input, hx [h0, c0], params, has_biases, num_layers, dropout, train, bidirectional, batch_first) ->
// (output, h_n, c_n), as torch.nn.LSTM: params per layer and direction w_ih (4H, I), w_hh (4H, H)[, b_ih, b_hh];
// h0, c0 (L D, B, H). Unrolled as nn::LSTM is: each layer's (and direction's) input projection is one linear
// node over the whole sequence, then one lstm_cell_projected node per step, so the planner sees every
// step's saved values. A layer's outputs are kept as rows (B T, D H) in the input's order — row b T + t
// batch-first, t B + b time-major — which is what the next layer's projection reads. Packed sequences
// (aten::lstm.data) and projections (proj_size: five weights per layer) go generic.
struct LstmShape {
  int64_t batch, steps, hidden, layers, directions, per_layer;
  bool batch_first;
};

// The T steps' projections (B, 4H) of one layer and direction, read from the rows.
Values lstm_projections(const LstmShape& s, const Value& rows, const Value& w_ih, const Value& b_ih) {
  const int64_t G = 4 * s.hidden;
  const Value gx = ops::linear(rows, w_ih, b_ih);  // (B T, 4H) or (T B, 4H)
  return s.batch_first ? ops::split(ops::reshape(gx, {s.batch, s.steps * G}), G, 1) : ops::split(gx, s.batch, 0);
}

// The layer's outputs as rows (B T, D H) or (T B, D H) from each direction's T step outputs (B, H).
Value lstm_rows(const LstmShape& s, const std::vector<Values>& hs) {
  if (!s.batch_first) {
    Values per_direction;
    for (const Values& h : hs) per_direction.push_back(ops::cat(h, 0));  // (T B, H)
    return per_direction.size() == 1 ? per_direction[0] : ops::cat(per_direction, 1);
  }
  Values pieces;  // step t of every direction, side by side: (B, T D H)
  for (int64_t t = 0; t < s.steps; ++t)
    for (const Values& h : hs) pieces.push_back(h[static_cast<size_t>(t)]);
  return ops::reshape(ops::cat(pieces, 1), {s.batch * s.steps, s.directions * s.hidden});
}

Out lstm_checked(const NodeArgs& a, const LstmShape& s, const Values& hx, const Values& params) {
  Value rows = ops::reshape(a.value(0), {s.batch * s.steps, a.value(0).size(2)});
  const Values h0 = ops::split(hx[0], 1, 0), c0 = ops::split(hx[1], 1, 0);  // L D x (1, B, H)
  Values h_n, c_n;
  const bool biases = s.per_layer == 4;
  for (int64_t l = 0; l < s.layers; ++l) {
    std::vector<Values> hs;
    for (int64_t d = 0; d < s.directions; ++d) {
      const size_t k = static_cast<size_t>((l * s.directions + d) * s.per_layer);
      const Values gx = lstm_projections(s, rows, params[k], biases ? params[k + 2] : Value());
      const size_t at = static_cast<size_t>(l * s.directions + d);
      Value h = ops::reshape(h0[at], {s.batch, s.hidden}), c = ops::reshape(c0[at], {s.batch, s.hidden});
      Values out(static_cast<size_t>(s.steps));
      for (int64_t i = 0; i < s.steps; ++i) {
        const size_t t = static_cast<size_t>(d == 0 ? i : s.steps - 1 - i);  // the reverse direction reads back
        const Values hc = ops::lstm_cell_projected(gx[t], h, c, params[k + 1], biases ? params[k + 3] : Value());
        h = out[t] = hc[0];
        c = hc[1];
      }
      h_n.push_back(ops::reshape(h, {1, s.batch, s.hidden}));
      c_n.push_back(ops::reshape(c, {1, s.batch, s.hidden}));
      hs.push_back(std::move(out));
    }
    rows = lstm_rows(s, hs);
    const double p = a.number(5);
    if (a.boolean(6) && p > 0.0 && l + 1 < s.layers) rows = ops::dropout(rows, p, true);
  }
  const int64_t width = s.directions * s.hidden;
  const Value output = ops::reshape(rows, s.batch_first ? std::vector<int64_t>{s.batch, s.steps, width}
                                                        : std::vector<int64_t>{s.steps, s.batch, width});
  return Values{output, ops::cat(h_n, 0), ops::cat(c_n, 0)};
}

Out lstm(const NodeArgs& a) {
  if (a.size() != 9 || !a.is_tensor(0) || a.value(0).dim() != 3) return std::nullopt;
  const Values hx = a.values(1), params = a.values(2);
  LstmShape s{};
  s.batch_first = a.boolean(8);
  s.layers = a.integer(4);
  s.directions = a.boolean(7) ? 2 : 1;
  s.per_layer = a.boolean(3) ? 4 : 2;
  s.batch = a.value(0).size(s.batch_first ? 0 : 1);
  s.steps = a.value(0).size(s.batch_first ? 1 : 0);
  if (hx.size() != 2 || !hx[0].defined() || !hx[1].defined() || hx[0].dim() != 3 || s.steps == 0 ||
      static_cast<int64_t>(params.size()) != s.layers * s.directions * s.per_layer)
    return std::nullopt;
  s.hidden = hx[0].size(2);
  if (hx[0].size(0) != s.layers * s.directions || hx[0].size(1) != s.batch || hx[1].sizes() != hx[0].sizes())
    return std::nullopt;
  for (size_t k = 1; k < params.size(); k += static_cast<size_t>(s.per_layer))
    if (params[k].dim() != 2 || params[k].size(0) != 4 * s.hidden || params[k].size(1) != s.hidden)
      return std::nullopt;  // w_hh (4H, H); a projection makes it (4H, P)
  return lstm_checked(a, s, hx, params);
}

std::vector<int64_t> sizes_without(const Value& x, int64_t dim) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.erase(sizes.begin() + dim);
  return sizes;
}

// select(input, dim, index) = slice of one, reshaped without that dimension (views both; e.g. out[:, -1]).
Out1 select(const NodeArgs& a) {
  if (a.size() != 3 || !a.is_tensor(0) || a.is_string(1)) return std::nullopt;  // select.Dimname goes generic
  const Value x = a.value(0);
  const int64_t dim = dim_of(x, a.integer(1));
  if (dim < 0) return std::nullopt;
  const int64_t len = x.size(dim), i = a.integer(2) < 0 ? a.integer(2) + len : a.integer(2);
  if (i < 0 || i >= len) return std::nullopt;  // the generic node raises PyTorch's own index error
  return ops::reshape(ops::slice(x, dim, i, i + 1), sizes_without(x, dim));
}

// unsqueeze(input, dim) and squeeze(input, dim) (of a dimension of size 1) as reshapes.
Out1 unsqueeze(const NodeArgs& a) {
  if (a.size() != 2 || !a.is_tensor(0)) return std::nullopt;
  const Value x = a.value(0);
  const int64_t dim = dim_of(x, a.integer(1), 1);
  if (dim < 0) return std::nullopt;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.insert(sizes.begin() + dim, 1);
  return ops::reshape(x, sizes);
}
Out1 squeeze(const NodeArgs& a) {
  if (a.size() != 2 || !a.is_tensor(0) || a.is_tensor(1) || a.is_string(1)) return std::nullopt;
  const Value x = a.value(0);
  const int64_t dim = dim_of(x, a.integer(1));
  if (dim < 0) return std::nullopt;
  if (x.size(dim) != 1) return x;
  return ops::reshape(x, sizes_without(x, dim));
}

// chunk(input, chunks, dim) -> Tensor[]: pieces of ceil(size / chunks) along dim, as at::chunk (views).
Out chunk(const NodeArgs& a) {
  const Value x = a.value(0);
  const int64_t chunks = a.integer(1);
  if (x.dim() == 0 || chunks <= 0) return std::nullopt;
  const int64_t dim = dim_of(x, a.integer(2));
  if (dim < 0 || x.size(dim) == 0) return std::nullopt;
  return ops::split(x, (x.size(dim) + chunks - 1) / chunks, dim);
}

// Ops with one output, as a native op.
template <Out1 (*F)(const NodeArgs&)>
Out one(const NodeArgs& a) {
  const Out1 v = F(a);
  return v ? Out(Values{*v}) : std::nullopt;
}

const std::map<std::string, NativeFn>& table() {
  static const std::map<std::string, NativeFn> t = {
      {"aten::linear", one<linear>}, {"aten::matmul", one<matmul>}, {"aten::bmm", one<bmm>}, {"aten::conv2d", one<conv2d>},
      {"aten::max_pool2d", one<max_pool2d>}, {"aten::avg_pool2d", one<avg_pool2d>},
      {"aten::relu", one<relu>}, {"aten::relu_", one<relu>}, {"aten::tanh", one<tanh>}, {"aten::tanh_", one<tanh>},
      {"aten::sigmoid", one<sigmoid>}, {"aten::sigmoid_", one<sigmoid>}, {"aten::gelu", one<gelu>},
      {"aten::softmax", one<softmax>}, {"aten::log_softmax", one<log_softmax>},
      {"aten::layer_norm", one<layer_norm>}, {"aten::batch_norm", one<batch_norm>},
      {"aten::dropout", one<dropout>}, {"aten::dropout_", one<dropout>}, {"aten::embedding", one<embedding>},
      {"aten::add", one<add>}, {"aten::add_", one<add>}, {"aten::sub", one<sub>}, {"aten::sub_", one<sub>},
      {"aten::mul", one<mul>}, {"aten::mul_", one<mul>}, {"aten::div", one<div>}, {"aten::div_", one<div>},
      {"aten::view", one<view>}, {"aten::reshape", one<reshape>}, {"aten::flatten", one<flatten>},
      {"aten::transpose", one<transpose>}, {"aten::permute", one<permute>}, {"aten::cat", one<cat>}, {"aten::slice", one<slice>}, {"aten::chunk", chunk},
      {"aten::select", one<select>}, {"aten::unsqueeze", one<unsqueeze>}, {"aten::squeeze", one<squeeze>},
      {"aten::contiguous", one<contiguous>},
      {"aten::mean", one<mean>}, {"aten::sum", one<sum>}, {"aten::lstm", lstm},
      {"aten::cross_entropy_loss", one<cross_entropy>}, {"aten::mse_loss", one<mse_loss>},
  };
  return t;
}

}  // namespace

NativeFn find_native(const std::string& kind) {
  auto it = table().find(kind);
  return it == table().end() ? nullptr : it->second;
}

}  // namespace ration::torchscript
