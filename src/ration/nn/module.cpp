// module.cpp — registration, dotted naming, traversal, train/eval and device/dtype moves for Module.
// Owns: the bookkeeping declared in module.h. Does not own any forward computation.
#include "ration/nn/module.h"

#include <ATen/core/grad_mode.h>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::nn {
namespace {

// Replace the data behind `t` (same TensorImpl, so every handle sees it). Integer tensors keep dtype.
void move_in_place(const at::Tensor& t, const at::TensorOptions& options) {
  if (!t.defined()) return;
  at::TensorOptions target = options;
  if (!at::isFloatingType(t.scalar_type())) target = target.dtype(t.scalar_type());
  at::Tensor moved = t.to(target);
  if (moved.unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) t.set_data(moved);
}

}  // namespace

Value Module::register_parameter(const std::string& name, at::Tensor init) {
  RATION_CHECK(!name.empty() && name.find('.') == std::string::npos,
               "parameter names are single path components; got '", name, "' (register a child module instead)");
  for (const auto& [existing, value] : params_) {
    RATION_CHECK(existing != name, "parameter '", name, "' registered twice in one module");
  }
  Value p = parameter(std::move(init), name);
  params_.emplace_back(name, p);
  return p;
}

at::Tensor Module::register_buffer(const std::string& name, at::Tensor init) {
  for (const auto& [existing, tensor] : buffers_) {
    RATION_CHECK(existing != name, "buffer '", name, "' registered twice in one module");
  }
  buffers_.emplace_back(name, init);
  return init;
}

void Module::adopt(const std::string& name, std::shared_ptr<Module> child) {
  RATION_CHECK(child != nullptr, "register_module('", name, "') got a null module");
  RATION_CHECK(!name.empty(), "child modules need a name");
  for (const auto& [existing, module] : children_) {
    RATION_CHECK(existing != name, "child module '", name, "' registered twice in one module");
  }
  child->name_ = name;
  // Re-prefix the subtree: its parameter names become paths relative to this module.
  for (auto& [path, value] : child->named_parameters()) value.impl()->name = name + "." + path;
  children_.emplace_back(name, std::move(child));
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Value>>& out) const {
  for (const auto& [name, value] : params_) out.emplace_back(prefix + name, value);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

void Module::collect_buffers(const std::string& prefix,
                             std::vector<std::pair<std::string, at::Tensor>>& out) const {
  for (const auto& [name, tensor] : buffers_) out.emplace_back(prefix + name, tensor);
  for (const auto& [name, child] : children_) child->collect_buffers(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Value>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Value>> out;
  collect("", out);
  return out;
}

std::vector<Value> Module::parameters() const {
  std::vector<Value> out;
  for (auto& [name, value] : named_parameters()) out.push_back(value);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  collect_buffers("", out);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, value] : named_parameters()) n += value.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (auto& [name, value] : named_parameters()) value.grad() = at::Tensor();
}

std::vector<at::Tensor> Module::snapshot_buffers() const {
  std::vector<at::Tensor> out;
  for (auto& [name, b] : named_buffers()) out.push_back(b.clone());
  return out;
}

void Module::restore_buffers(const std::vector<at::Tensor>& snapshot) {
  auto buffers = named_buffers();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].second.copy_(snapshot.at(i));
}

void Module::to(const at::TensorOptions& options) {
  for (auto& [name, value] : named_parameters()) {
    move_in_place(value.tensor(), options);
    memory::retag(value.tensor(), memory::Category::Parameters);
    if (value.grad().defined()) move_in_place(value.grad(), options);
  }
  for (auto& [name, tensor] : named_buffers()) move_in_place(tensor, options);
}

at::TensorOptions Module::parameter_options() const {
  auto params = named_parameters();
  if (params.empty()) return at::TensorOptions().dtype(at::kFloat);
  return params.front().second.tensor().options();
}

}  // namespace ration::nn
