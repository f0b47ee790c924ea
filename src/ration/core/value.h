// value.h — a tensor in ration's autograd graph.
// Owns: Value (a cheap shared handle), ValueImpl (data, grad_fn edge, leaf grad and hooks),
//       grad mode (NoGradGuard) and the oracle switch that hands differentiation to torch::autograd.
// Does not own: what is saved for backward (core/saved_value.h) or how nodes run (core/node.h).
//
// Model: define-by-run. Every op that needs a gradient creates a Node (core/node.h) whose outputs are
// Values pointing back at it (grad_fn, output_nr). Leaves have no grad_fn; parameters are leaves with
// requires_grad, and receive `+=` accumulated gradients in ValueImpl::grad.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ration {

class Node;
class SavedValue;

struct ValueImpl {
  at::Tensor tensor;                // forward data; held while user code holds the Value
  std::shared_ptr<Node> grad_fn;    // producer; null for leaves and constants
  int output_nr = 0;                // which output of grad_fn this is
  bool requires_grad = false;
  at::Tensor grad;                  // leaves only: accumulated with += across backward calls
  std::string name;                 // parameters: dotted path ("blocks.0.attn.qkv.weight")
  std::weak_ptr<SavedValue> saved;  // the one handle every node referencing this value shares
  std::shared_ptr<SavedValue> pinned_saved;  // leaves/constants keep their handle alive
  // Leaves: called once per backward when this leaf's gradient is complete (gradient-ready hook).
  std::vector<std::function<void(ValueImpl&)>> grad_ready_hooks;
};

class Value {
 public:
  Value() = default;
  explicit Value(at::Tensor tensor, bool requires_grad = false);
  explicit Value(std::shared_ptr<ValueImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr && impl_->tensor.defined(); }
  const at::Tensor& tensor() const;
  at::Tensor& grad() const;
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  const std::shared_ptr<Node>& grad_fn() const;
  const std::shared_ptr<ValueImpl>& impl() const { return impl_; }
  const std::string& name() const;

  at::IntArrayRef sizes() const { return tensor().sizes(); }
  int64_t size(int64_t dim) const { return tensor().size(dim); }
  int64_t dim() const { return tensor().dim(); }
  int64_t numel() const { return tensor().numel(); }
  at::ScalarType dtype() const { return tensor().scalar_type(); }
  double item() const { return tensor().item<double>(); }

  // Reverse-mode differentiation from this value. `grad` defaults to 1 for a scalar.
  // Saved values are released as backward passes them unless retain_graph.
  void backward(const at::Tensor& grad = {}, bool retain_graph = false) const;

  // Add a gradient-ready hook (leaves only; used by distributed reducers and parameter servers).
  void on_grad_ready(std::function<void(ValueImpl&)> hook) const;

 private:
  std::shared_ptr<ValueImpl> impl_;
};

using Values = std::vector<Value>;

// A trainable leaf.
Value parameter(at::Tensor tensor, std::string name = "");

// Grad mode: when disabled, ops record no nodes and save nothing.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Oracle mode: ops run their forward on tensors that torch::autograd tracks, and Value::backward
// calls torch::autograd. Same model code, same ATen kernels, libtorch's differentiation: the outside
// oracle (gradcheck, tests) and the libtorch peer in benchmarks. Parameters given here get
// requires_grad in torch's sense for the scope's lifetime; their torch gradients land in Value::grad.
// Scopes nest: leaving an inner scope restores the outer one (its mode and its parameter list).
bool oracle_mode();
class OracleScope {
 public:
  explicit OracleScope(std::vector<Value> params);
  ~OracleScope();
  OracleScope(const OracleScope&) = delete;
  OracleScope& operator=(const OracleScope&) = delete;

 private:
  enum class Tracked { No, Yes };  // did torch track the parameter before this scope?
  std::vector<Value> params_;
  std::vector<Tracked> was_tracked_;
  bool prev_;
  std::vector<Value>* prev_params_;
};

}  // namespace ration
