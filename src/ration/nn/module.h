// module.h — the base of every layer and model: named parameters, buffers, children, train/eval.
// Owns: registration and dotted naming ("blocks.0.attn.qkv.weight"), traversal, train/eval flag, and
//       the ScopeGuard each module opens in forward so nodes know their node set (module path).
// Does not own: what forward computes (each module's own forward()).
//
// Naming and scope convention (one rule, used by every layer and model):
//   * register_module(name, child) stores `name` in the child (child->name()) and renames the child's
//     parameters to dotted paths under it. Registration happens bottom-up (a child is complete before
//     its parent registers it), so every registration re-prefixes the whole subtree and the outermost
//     module's view is always the full path: Value::name() == "blocks.0.attn.qkv.weight".
//   * A child name may itself contain dots ("blocks.0"): lists of modules are registered that way,
//     there is no separate ModuleList type.
//   * Every forward() opens `ScopeGuard scope(name());` first. Scopes nest on a thread-local stack, so
//     a node created in the qkv Linear of block 0 records "blocks.0.attn.qkv". The root module has an
//     empty name and opens nothing. The parent never opens the child's scope (that would double it).
//   * A module registered in two parents keeps the name of the last registration.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ration/core/node.h"
#include "ration/core/value.h"

namespace ration::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // All parameters, depth-first in registration order, with dotted names.
  std::vector<std::pair<std::string, Value>> named_parameters() const;
  std::vector<Value> parameters() const;
  // Buffers (e.g. batch-norm running statistics): persistent tensors that are not trained.
  std::vector<std::pair<std::string, at::Tensor>> named_buffers() const;
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Gradients become undefined (PyTorch's set_to_none): the next backward assigns instead of adding.
  void zero_grad();
  // Copies of every buffer, and writing them back (in place): runs that must not disturb batch-norm
  // statistics (profiling, gradient checks) bracket themselves with these.
  std::vector<at::Tensor> snapshot_buffers() const;
  void restore_buffers(const std::vector<at::Tensor>& snapshot);
  // Move parameters and buffers (in place of their storage) to a device / dtype. The at::Tensor handles
  // keep their identity (set_data), so tensors a layer kept from register_buffer and the pinned saved
  // handles of parameters see the new data. Only floating-point tensors change dtype.
  void to(const at::TensorOptions& options);

  // The name this module was registered under in its parent ("attn", "blocks.0"); empty for a root.
  const std::string& name() const { return name_; }
  // Options (dtype, device) of the first parameter; float32 CPU for a module without parameters.
  at::TensorOptions parameter_options() const;

 protected:
  Value register_parameter(const std::string& name, at::Tensor init);
  at::Tensor register_buffer(const std::string& name, at::Tensor init);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    adopt(name, module);
    return module;
  }

 private:
  void adopt(const std::string& name, std::shared_ptr<Module> child);
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Value>>& out) const;
  void collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, at::Tensor>>& out) const;
  std::vector<std::pair<std::string, Value>> params_;
  std::vector<std::pair<std::string, at::Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string name_;
  bool training_ = true;
};

}  // namespace ration::nn
