// graph_runner.h — runs a TorchScript module's forward graph in ration's autograd.
// Owns: GraphRunner — the module's forward graph, inlined (every submodule call becomes its ops, each
//       remembering its module path) and interpreted node by node on every forward: control flow and
//       scalar/list ops run as the TorchScript interpreter would (same operators), every tensor op that
//       needs a gradient becomes one node of ration's graph — ration's own op where native_ops.h has it
//       (with that op's saved values), a generic node (generic_op.h) otherwise; the tally of which ops
//       ran which way; and the oracle forward (the TorchScript interpreter itself under libtorch autograd).
// Does not own: the parameters' Values (the model registers them; set_parameters tells the runner),
//       the loss (models/torchscript.cpp).
//
// Mutation: an in-place op (relu_, add_) on a graph value runs as its functional op, and the graph value
// it wrote is rebound to the result; only the module's buffers (batch-norm's num_batches_tracked) are
// written in place, as in PyTorch.
#pragma once
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ration/core/value.h"

namespace ration::torchscript {

// How the nodes of one JIT op kind ran in the last forward: as ration's op, as generic nodes, or with no
// gradient needed (plain execution: shapes, buffers, inputs without gradient).
struct OpRoute {
  int64_t native = 0;
  int64_t generic = 0;
  int64_t plain = 0;
};

class GraphRunner {
 public:
  // `origin` (the file) names the module in errors.
  GraphRunner(torch::jit::Module module, std::string origin);
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // The parameters ration trains: each shares its tensor with the module attribute of that name.
  void set_parameters(const std::vector<std::pair<std::string, Value>>& params);
  // forward(inputs...) in ration's autograd (training or eval mode); every tensor the module returns, in
  // order (tuples and lists flattened).
  Values forward(const Values& inputs, bool training);
  // The same forward run by the TorchScript interpreter with libtorch autograd (parameters tracked by the
  // caller, e.g. OracleScope): what gradcheck compares with.
  Values forward_jit(const Values& inputs, bool training);

  // Arguments forward takes after self.
  size_t num_inputs() const;
  const std::string& origin() const { return origin_; }
  torch::jit::Module& module() { return module_; }
  // kind ("aten::conv2d") -> how its nodes ran, from the last forward.
  const std::map<std::string, OpRoute>& routes() const { return routes_; }
  // Whether the last forward ran a dropout with p > 0 in training mode (its masks are ration's, not
  // the TorchScript interpreter's).
  bool active_dropout() const { return active_dropout_; }

 private:
  void set_training(bool training);
  struct Caches;  // per-node module paths and operators, computed once
  torch::jit::Module module_;
  std::string origin_;
  std::shared_ptr<torch::jit::Graph> graph_;
  std::unordered_map<const c10::TensorImpl*, Value> parameters_;
  std::unordered_set<const c10::TensorImpl*> buffers_;
  std::map<std::string, OpRoute> routes_;
  bool active_dropout_ = false;
  std::unique_ptr<Caches> caches_;
  int training_ = -1;  // the mode last set on the module (-1: not yet)
};

}  // namespace ration::torchscript
