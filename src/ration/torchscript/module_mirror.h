// module_mirror.h — a TorchScript module's parameters, buffers and submodules as ration modules.
// Owns: MirrorParts (one module's own parameters and buffers and its mirrored children, under their
//       PyTorch names) and MirrorModule (an nn::Module registering them), so that named_parameters() and
//       named_buffers() give PyTorch's state_dict names ("layer1.0.bn1.running_mean").
// Invariant: every mirrored tensor IS the module attribute's tensor (same storage and TensorImpl), so
//       ration's updates, batch-norm's running statistics and Module::to() are seen by the TorchScript
//       module too, and the module's oracle forward reads ration's current weights.
// Does not own: loading the file (models/torchscript.cpp) or running the graph (graph_runner.h).
#pragma once
#include <torch/csrc/jit/api/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ration/nn/module.h"

namespace ration::torchscript {

struct MirrorParts {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> children;
};

// `module`'s own parameters and buffers, and its children mirrored recursively.
MirrorParts mirror_parts(const torch::jit::Module& module);

class MirrorModule : public nn::Module {
 public:
  explicit MirrorModule(const torch::jit::Module& module);
};

}  // namespace ration::torchscript
