// torchscript.h — the "torchscript" family: a PyTorch module exported with torch.jit.script (or trace),
// trained in ration's autograd (torchscript/graph_runner.h imports its graph op by op).
// Config: model.path (the exported module file), model.loss ("" / not set: forward(inputs..., target)
//         returns the scalar loss; "cross_entropy", "mse" or "bce_with_logits": applied to forward(inputs...)'s
//         first output).
// Parameter and buffer names are the module's state_dict names, so a checkpoint's model.pt loads back into
// the PyTorch module with load_state_dict. gradcheck's oracle is the TorchScript interpreter running the
// same module under libtorch autograd (or, when the module has active dropout, ration's forward under
// libtorch autograd, so both sides draw the same masks).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ration/models/model.h"
#include "ration/torchscript/graph_runner.h"

namespace ration::models {

struct TorchScriptOptions {
  std::string path;
  std::string loss;  // "", "cross_entropy", "mse", "bce_with_logits"
  static TorchScriptOptions from_config(Config& cfg);
};

class TorchScriptModel : public Model {
 public:
  explicit TorchScriptModel(const TorchScriptOptions& options);
  Value loss(const data::Batch& batch) override;
  EvalStats evaluate(const data::Batch& batch) override;
  std::string family() const override { return "torchscript"; }
  torchscript::GraphRunner& runner() { return *runner_; }
  const TorchScriptOptions& options() const { return options_; }
  // Tensors forward takes from the data (its arguments, less the target when the module computes the loss):
  // the number a tensor file's "inputs" must hold.
  size_t data_inputs() const;

 private:
  Values forward(const Values& inputs);  // ration's graph, or the oracle inside an OracleScope
  Values inputs_of(const data::Batch& batch) const;
  Value target_of(const data::Batch& batch) const;
  Value loss_of(const Value& output, const Value& target) const;
  TorchScriptOptions options_;
  std::unique_ptr<torchscript::GraphRunner> runner_;
};

}  // namespace ration::models
