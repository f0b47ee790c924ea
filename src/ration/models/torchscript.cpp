// torchscript.cpp — the "torchscript" family (see torchscript.h): loading, the loss, evaluation.
#include "ration/models/torchscript.h"

#include <torch/csrc/jit/serialization/import.h>

#include <fstream>
#include <map>

#include "ration/base/check.h"
#include "ration/models/families.h"
#include "ration/ops/ops.h"
#include "ration/torchscript/generic_op.h"
#include "ration/torchscript/module_mirror.h"

namespace ration::models {

TorchScriptOptions TorchScriptOptions::from_config(Config& cfg) {
  TorchScriptOptions o;
  RATION_CHECK(cfg.has("model.path"), cfg.origin(), ": model.type = \"torchscript\" needs model.path, the file ",
               "torch.jit.save wrote (scripts/export_model.py writes one with its config)");
  o.path = cfg.get_string("model.path", "");
  o.loss = cfg.get_choice("model.loss", "", {"", "cross_entropy", "mse", "bce_with_logits"});
  return o;
}

namespace {

torch::jit::Module load_module(const std::string& path) {
  RATION_CHECK(std::ifstream(path).good(), "model.path '", path, "' cannot be opened");
  try {
    return torch::jit::load(path, at::kCPU);
  } catch (const c10::Error& e) {
    RATION_CHECK(false, "model.path '", path, "' is not a TorchScript module (torch.jit.save of torch.jit.script or ",
                 "torch.jit.trace; a torch.save of a model or state_dict is not): ", e.what_without_backtrace());
  }
  return {};
}

// (B, C, d...) logits and (B, d...) classes -> (B * d..., C) and (B * d...) for cross entropy.
std::pair<Value, Value> classes_last(const Value& logits, const Value& target) {
  if (logits.dim() == 2) return {logits, target};
  std::vector<int64_t> order = {0};
  for (int64_t d = 2; d < logits.dim(); ++d) order.push_back(d);
  order.push_back(1);
  const Value moved = ops::permute(logits, order);
  return {ops::reshape(moved, {-1, logits.size(1)}), Value(target.tensor().reshape({-1}))};
}

}  // namespace

TorchScriptModel::TorchScriptModel(const TorchScriptOptions& options) : options_(options) {
  torch::jit::Module module = load_module(options.path);
  torchscript::MirrorParts parts = torchscript::mirror_parts(module);
  for (auto& [name, t] : parts.parameters) register_parameter(name, t);
  for (auto& [name, t] : parts.buffers) register_buffer(name, t);
  for (auto& [name, child] : parts.children) register_module(name, child);
  // One Value per tensor: a tensor shared by two modules (tied weights) would be updated twice.
  std::map<const c10::TensorImpl*, std::string> owner;
  for (const auto& [name, p] : named_parameters()) {
    const auto [it, fresh] = owner.emplace(p.tensor().unsafeGetTensorImpl(), name);
    RATION_CHECK(fresh, options.path, ": parameters ", it->second, " and ", name, " are one tensor (tied weights); ",
                 "ration does not import tied parameters yet");
  }
  runner_ = std::make_unique<torchscript::GraphRunner>(module, options.path);
  runner_->set_parameters(named_parameters());
}

size_t TorchScriptModel::data_inputs() const {
  const size_t args = runner_->num_inputs();
  return options_.loss.empty() && args > 0 ? args - 1 : args;
}

Values TorchScriptModel::inputs_of(const data::Batch& batch) const {
  RATION_CHECK(batch.input.defined(), options_.path, ": a batch without inputs");
  Values inputs = {to_model(batch.input, *this)};
  for (const Value& extra : batch.extra_inputs) inputs.push_back(to_model(extra, *this));
  return inputs;
}

Value TorchScriptModel::target_of(const data::Batch& batch) const {
  RATION_CHECK(batch.target.defined(), options_.path, ": a batch without a target");
  return to_model(batch.target, *this);
}

Values TorchScriptModel::forward(const Values& inputs) {
  // The oracle (gradcheck): the TorchScript interpreter itself, unless dropout masks must match ours.
  if (oracle_mode() && !runner_->active_dropout()) return runner_->forward_jit(inputs, is_training());
  return runner_->forward(inputs, is_training());
}

Value TorchScriptModel::loss_of(const Value& output, const Value& target) const {
  const std::string& kind = options_.loss;
  if (kind == "cross_entropy") {
    RATION_CHECK(target.dtype() == at::kLong && output.dim() >= 2 && target.dim() == output.dim() - 1 &&
                     target.size(0) == output.size(0),
                 options_.path, ": model.loss = \"cross_entropy\" needs logits (B, C, ...) and int64 classes (B, ...); ",
                 "got output ", output.sizes(), " and target ", target.dtype(), " ", target.sizes());
    auto [logits, classes] = classes_last(output, target);
    return ops::cross_entropy(logits, classes);
  }
  RATION_CHECK(output.sizes() == target.sizes() && at::isFloatingType(target.dtype()), options_.path, ": model.loss = \"",
               kind, "\" needs a floating target shaped like the output ", output.sizes(), "; got ", target.dtype(), " ",
               target.sizes());
  if (kind == "mse") return ops::mse_loss(output, target);
  return torchscript::generic_node(
      "aten::binary_cross_entropy_with_logits", "model.loss", {output, target},
      [](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{at::binary_cross_entropy_with_logits(in[0], in[1])};
      },
      1)[0];
}

Value TorchScriptModel::loss(const data::Batch& batch) {
  Values inputs = inputs_of(batch);
  const Value target = target_of(batch);
  if (options_.loss.empty()) {
    inputs.push_back(target);
    const Values out = forward(inputs);
    RATION_CHECK(!out.empty() && out[0].numel() == 1, options_.path, ": with model.loss not set, forward(inputs..., ",
                 "target) must return the scalar loss; it returned ", out.empty() ? "no tensor" : "a tensor of shape ",
                 out.empty() ? at::IntArrayRef{} : out[0].sizes(), "; hint: set model.loss = \"cross_entropy\", ",
                 "\"mse\" or \"bce_with_logits\" for a module that returns its prediction");
    return out[0].dim() == 0 ? out[0] : ops::reshape(out[0], {});
  }
  const Values out = forward(inputs);
  RATION_CHECK(!out.empty(), options_.path, ": forward returned no tensor");
  return loss_of(out[0], target);
}

EvalStats TorchScriptModel::evaluate(const data::Batch& batch) {
  NoGradGuard no_grad;
  EvalStats s;
  const Value target = target_of(batch);
  if (options_.loss.empty()) {  // the module's own loss: a mean over the batch
    s.count = target.size(0);
    s.loss_sum = loss(batch).item() * static_cast<double>(s.count);
    return s;
  }
  const Values out = forward(inputs_of(batch));
  RATION_CHECK(!out.empty(), options_.path, ": forward returned no tensor");
  const double mean_loss = loss_of(out[0], target).item();
  if (options_.loss == "cross_entropy") {
    s.count = target.numel();
    s.correct = out[0].tensor().argmax(1).eq(target.tensor()).sum().item<int64_t>();
  } else if (options_.loss == "bce_with_logits") {
    s.count = target.numel();
    s.correct = out[0].tensor().gt(0).eq(target.tensor().gt(0.5)).sum().item<int64_t>();
  } else {
    s.count = target.size(0);
  }
  s.loss_sum = mean_loss * static_cast<double>(s.count);
  return s;
}

}  // namespace ration::models
