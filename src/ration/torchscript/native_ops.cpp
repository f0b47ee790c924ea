// native_ops.cpp — see native_ops.h. One small function per aten op; each returns nullopt for the calls
// ration's op does not cover (the generic node then runs them exactly as libtorch would).
#include "ration/torchscript/native_ops.h"

#include <map>

#include "ration/ops/ops.h"

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

using Out = std::optional<Value>;

bool all_ones(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x != 1) return false;
  return true;
}
bool pair_or_empty(const std::vector<int64_t>& v) { return v.empty() || v.size() == 2; }

// ---- linear algebra and convolution ----------------------------------------------------------------------
Out linear(const NodeArgs& a) { return ops::linear(a.value(0), a.value(1), a.value(2)); }
Out matmul(const NodeArgs& a) { return ops::matmul(a.value(0), a.value(1)); }
Out bmm(const NodeArgs& a) { return ops::bmm(a.value(0), a.value(1)); }

// conv2d(input, weight, bias, stride, padding, dilation, groups); padding "same"/"valid" goes generic.
Out conv2d(const NodeArgs& a) {
  if (a.is_string(4) || a.value(0).dim() != 4) return std::nullopt;
  const auto stride = a.ints(3), padding = a.ints(4), dilation = a.ints(5);
  if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) return std::nullopt;
  return ops::conv2d(a.value(0), a.value(1), a.value(2), stride, padding, dilation, a.integer(6));
}

// max_pool2d(input, kernel, stride, padding, dilation, ceil_mode)
Out max_pool2d(const NodeArgs& a) {
  const auto kernel = a.ints(1), stride = a.ints(2), padding = a.ints(3);
  if (a.value(0).dim() != 4 || kernel.size() != 2 || !pair_or_empty(stride) || padding.size() != 2 ||
      !all_ones(a.ints(4)) || a.boolean(5))
    return std::nullopt;
  return ops::max_pool2d(a.value(0), kernel, stride, padding);
}

// avg_pool2d(input, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
Out avg_pool2d(const NodeArgs& a) {
  const auto kernel = a.ints(1), stride = a.ints(2), padding = a.ints(3);
  if (a.value(0).dim() != 4 || kernel.size() != 2 || !pair_or_empty(stride) || padding.size() != 2 || a.boolean(4) ||
      !a.boolean(5) || !a.is_none(6))
    return std::nullopt;
  return ops::avg_pool2d(a.value(0), kernel, stride, padding);
}

// ---- activations ---------------------------------------------------------------------------------------
Out relu(const NodeArgs& a) { return ops::relu(a.value(0)); }
Out tanh(const NodeArgs& a) { return ops::tanh(a.value(0)); }
Out sigmoid(const NodeArgs& a) { return ops::sigmoid(a.value(0)); }
Out gelu(const NodeArgs& a) { return ops::gelu(a.value(0), a.size() > 1 ? a.str(1) : "none"); }
// softmax(input, dim, dtype): a dtype conversion goes generic.
Out softmax(const NodeArgs& a) {
  if (a.size() > 2 && !a.is_none(2)) return std::nullopt;
  return ops::softmax(a.value(0), a.integer(1));
}
Out log_softmax(const NodeArgs& a) {
  if (a.size() > 2 && !a.is_none(2)) return std::nullopt;
  return ops::log_softmax(a.value(0), a.integer(1));
}

// ---- normalisation and regularisation --------------------------------------------------------------------
// layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)
Out layer_norm(const NodeArgs& a) {
  return ops::layer_norm(a.value(0), a.ints(1), a.value(2), a.value(3), a.number(4));
}
// batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled): the
// running statistics are the module's own buffers, updated in place as PyTorch does.
Out batch_norm(const NodeArgs& a) {
  if (a.value(0).dim() < 2 || (a.is_none(3) && !a.boolean(5))) return std::nullopt;
  const at::Tensor mean = a.is_none(3) ? at::Tensor() : a.value(3).tensor();
  const at::Tensor var = a.is_none(4) ? at::Tensor() : a.value(4).tensor();
  return ops::batch_norm(a.value(0), a.value(1), a.value(2), mean, var, a.boolean(5), a.number(6), a.number(7));
}
// dropout(input, p, train)
Out dropout(const NodeArgs& a) { return ops::dropout(a.value(0), a.number(1), a.boolean(2)); }
// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
Out embedding(const NodeArgs& a) {
  if (a.boolean(3) || a.boolean(4)) return std::nullopt;
  return ops::embedding(a.value(0), a.value(1), a.integer(2));
}

// ---- elementwise (alpha other than 1 and rounding modes go generic) ---------------------------------------
Out add(const NodeArgs& a) {
  if (a.size() > 2 && a.number(2) != 1.0) return std::nullopt;
  return a.is_tensor(1) ? ops::add(a.value(0), a.value(1)) : ops::add_scalar(a.value(0), a.number(1));
}
Out sub(const NodeArgs& a) {
  if (a.size() > 2 && a.number(2) != 1.0) return std::nullopt;
  return a.is_tensor(1) ? ops::sub(a.value(0), a.value(1)) : ops::add_scalar(a.value(0), -a.number(1));
}
Out mul(const NodeArgs& a) {
  return a.is_tensor(1) ? ops::mul(a.value(0), a.value(1)) : ops::mul_scalar(a.value(0), a.number(1));
}
Out div(const NodeArgs& a) {
  if (a.size() != 2 || !a.is_tensor(1)) return std::nullopt;  // x / s rounds differently from x * (1 / s)
  return ops::div(a.value(0), a.value(1));
}

// ---- shape -----------------------------------------------------------------------------------------------
Out view(const NodeArgs& a) { return ops::view(a.value(0), a.ints(1)); }
Out reshape(const NodeArgs& a) { return ops::reshape(a.value(0), a.ints(1)); }
Out flatten(const NodeArgs& a) { return ops::flatten(a.value(0), a.integer(1), a.integer(2)); }
Out transpose(const NodeArgs& a) { return ops::transpose(a.value(0), a.integer(1), a.integer(2)); }
Out permute(const NodeArgs& a) { return ops::permute(a.value(0), a.ints(1)); }
Out cat(const NodeArgs& a) { return ops::cat(a.values(0), a.integer(1)); }
// contiguous(input, memory_format): a contiguous input is itself (no node); otherwise a flat copy (reshape of a
// tensor no view can flatten copies it) viewed back to its shape, whose backward is the gradient's reshape.
// nn.MultiheadAttention calls it on every head split; as a generic node its backward re-ran the copy.
Out contiguous(const NodeArgs& a) {
  if (a.size() > 1 && !a.is_none(1) && a.integer(1) != static_cast<int64_t>(at::MemoryFormat::Contiguous))
    return std::nullopt;
  const Value x = a.value(0);
  if (x.tensor().is_contiguous()) return x;
  return ops::view(ops::reshape(x, {-1}), x.sizes().vec());
}

// ---- reductions: mean/sum(input, dtype) and mean/sum(input, dims, keepdim, dtype) --------------------------
Out mean(const NodeArgs& a) {
  if (a.size() == 2) return a.is_none(1) ? Out(ops::mean(a.value(0))) : std::nullopt;
  if (a.size() != 4 || !a.is_none(3) || a.is_none(1) || a.is_string(1)) return std::nullopt;
  return ops::mean(a.value(0), a.ints(1), a.boolean(2));
}
Out sum(const NodeArgs& a) {
  if (a.size() == 2) return a.is_none(1) ? Out(ops::sum(a.value(0))) : std::nullopt;
  if (a.size() != 4 || !a.is_none(3) || a.is_none(1) || a.is_string(1)) return std::nullopt;
  return ops::sum(a.value(0), a.ints(1), a.boolean(2));
}

// ---- losses (mean reduction) -------------------------------------------------------------------------------
// cross_entropy_loss(input, target, weight, reduction, ignore_index, label_smoothing); reduction 1 = mean.
Out cross_entropy(const NodeArgs& a) {
  if (a.value(0).dim() != 2 || !a.is_none(2) || a.integer(3) != 1 || a.number(5) != 0.0 ||
      a.value(1).dtype() != at::kLong)
    return std::nullopt;
  return ops::cross_entropy(a.value(0), a.value(1), a.integer(4));
}
Out mse_loss(const NodeArgs& a) {
  if (a.integer(2) != 1 || a.value(0).sizes() != a.value(1).sizes()) return std::nullopt;
  return ops::mse_loss(a.value(0), a.value(1));
}

const std::map<std::string, NativeFn>& table() {
  static const std::map<std::string, NativeFn> t = {
      {"aten::linear", linear}, {"aten::matmul", matmul}, {"aten::bmm", bmm}, {"aten::conv2d", conv2d},
      {"aten::max_pool2d", max_pool2d}, {"aten::avg_pool2d", avg_pool2d},
      {"aten::relu", relu}, {"aten::relu_", relu}, {"aten::tanh", tanh}, {"aten::tanh_", tanh},
      {"aten::sigmoid", sigmoid}, {"aten::sigmoid_", sigmoid}, {"aten::gelu", gelu},
      {"aten::softmax", softmax}, {"aten::log_softmax", log_softmax},
      {"aten::layer_norm", layer_norm}, {"aten::batch_norm", batch_norm},
      {"aten::dropout", dropout}, {"aten::dropout_", dropout}, {"aten::embedding", embedding},
      {"aten::add", add}, {"aten::add_", add}, {"aten::sub", sub}, {"aten::sub_", sub},
      {"aten::mul", mul}, {"aten::mul_", mul}, {"aten::div", div}, {"aten::div_", div},
      {"aten::view", view}, {"aten::reshape", reshape}, {"aten::flatten", flatten},
      {"aten::transpose", transpose}, {"aten::permute", permute}, {"aten::cat", cat},
      {"aten::contiguous", contiguous},
      {"aten::mean", mean}, {"aten::sum", sum},
      {"aten::cross_entropy_loss", cross_entropy}, {"aten::mse_loss", mse_loss},
  };
  return t;
}

}  // namespace

NativeFn find_native(const std::string& kind) {
  auto it = table().find(kind);
  return it == table().end() ? nullptr : it->second;
}

}  // namespace ration::torchscript
