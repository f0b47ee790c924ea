// module_mirror.cpp — see module_mirror.h.
#include "ration/torchscript/module_mirror.h"

namespace ration::torchscript {

MirrorParts mirror_parts(const torch::jit::Module& module) {
  MirrorParts parts;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (!p.value.defined()) continue;
    at::Tensor t = p.value;
    t.set_requires_grad(false);  // ration differentiates it; libtorch tracks it only inside an OracleScope
    parts.parameters.emplace_back(p.name, t);
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value.defined()) parts.buffers.emplace_back(b.name, b.value);
  }
  for (const auto& c : module.named_children()) parts.children.emplace_back(c.name, std::make_shared<MirrorModule>(c.value));
  return parts;
}

MirrorModule::MirrorModule(const torch::jit::Module& module) {
  MirrorParts parts = mirror_parts(module);
  for (auto& [name, t] : parts.parameters) register_parameter(name, t);
  for (auto& [name, t] : parts.buffers) register_buffer(name, t);
  for (auto& [name, child] : parts.children) register_module(name, child);
}

}  // namespace ration::torchscript
