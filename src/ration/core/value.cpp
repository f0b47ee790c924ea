#include "ration/core/value.h"

#include <torch/csrc/autograd/autograd.h>

#include "ration/base/check.h"
#include "ration/core/engine.h"
#include "ration/base/allocator.h"

namespace ration {
namespace {
thread_local bool t_grad_enabled = true;
thread_local bool t_oracle = false;
thread_local std::vector<Value>* t_oracle_params = nullptr;
const std::shared_ptr<Node> kNoNode;
const std::string kNoName;
}  // namespace

Value::Value(at::Tensor tensor, bool requires_grad) : impl_(std::make_shared<ValueImpl>()) {
  impl_->tensor = std::move(tensor);
  impl_->requires_grad = requires_grad;
  RATION_CHECK(!requires_grad || at::isFloatingType(impl_->tensor.scalar_type()),
               "only floating-point values can require grad; got ", impl_->tensor.scalar_type());
}

const at::Tensor& Value::tensor() const {
  RATION_CHECK(impl_ != nullptr, "use of an undefined Value");
  return impl_->tensor;
}

at::Tensor& Value::grad() const {
  RATION_CHECK(impl_ != nullptr, "use of an undefined Value");
  return impl_->grad;
}

const std::shared_ptr<Node>& Value::grad_fn() const { return impl_ ? impl_->grad_fn : kNoNode; }
const std::string& Value::name() const { return impl_ ? impl_->name : kNoName; }

void Value::backward(const at::Tensor& grad, bool retain_graph) const {
  if (t_oracle) {
    RATION_CHECK(defined() && tensor().requires_grad(), "oracle backward of a value torch does not track");
    at::Tensor g = grad.defined() ? grad : at::ones_like(tensor());
    torch::autograd::backward({tensor()}, {g}, retain_graph);
    if (t_oracle_params != nullptr) {
      for (auto& p : *t_oracle_params) {
        at::Tensor tg = p.tensor().grad();
        if (!tg.defined()) continue;
        if (p.grad().defined()) p.grad().add_(tg);
        else p.grad() = tg.detach().clone();
        p.tensor().mutable_grad() = at::Tensor();
      }
    }
    return;
  }
  run_backward({*this}, {grad}, retain_graph);
}

void Value::on_grad_ready(std::function<void(ValueImpl&)> hook) const {
  RATION_CHECK(impl_ && !impl_->grad_fn, "gradient-ready hooks attach to leaves (parameters) only");
  impl_->grad_ready_hooks.push_back(std::move(hook));
}

Value parameter(at::Tensor tensor, std::string name) {
  memory::retag(tensor, memory::Category::Parameters);
  Value v(std::move(tensor), /*requires_grad=*/true);
  v.impl()->name = std::move(name);
  return v;
}

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

bool oracle_mode() { return t_oracle; }

OracleScope::OracleScope(std::vector<Value> params)
    : params_(std::move(params)), prev_(t_oracle), prev_params_(t_oracle_params) {
  for (auto& p : params_) {
    was_tracked_.push_back(p.tensor().requires_grad() ? Tracked::Yes : Tracked::No);
    p.tensor().set_requires_grad(true);
  }
  t_oracle = true;
  t_oracle_params = &params_;
}

// Restores what the enclosing scope (if any) set: its mode, its parameter list, and torch tracking of
// parameters it tracks too.
OracleScope::~OracleScope() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (was_tracked_[i] == Tracked::Yes) continue;
    params_[i].tensor().mutable_grad() = at::Tensor();
    params_[i].tensor().set_requires_grad(false);
  }
  t_oracle = prev_;
  t_oracle_params = prev_params_;
}

}  // namespace ration
