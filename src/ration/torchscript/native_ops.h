// native_ops.h — the table of aten ops that an imported TorchScript graph runs as ration's own ops.
// Owns: NodeArgs (one JIT node's argument values, read by type) and the table from an aten kind
//       ("aten::conv2d") to the ration op (ops/ops.h) that computes it (aten::lstm: its cells unrolled), with the argument checks that
//       decide whether this call fits ration's op (e.g. conv2d with a string padding does not).
// Does not own: running the graph (graph_runner.h) or ops without a native version (generic_op.h).
#pragma once
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ration/core/value.h"

namespace ration::torchscript {

// The argument values of one node, in schema order; tensors are read as the Values ration tracks.
class NodeArgs {
 public:
  NodeArgs(const std::vector<c10::IValue>& args, std::function<Value(const at::Tensor&)> value_of)
      : args_(args), value_of_(std::move(value_of)) {}
  size_t size() const { return args_.size(); }
  bool is_tensor(size_t i) const { return args_.at(i).isTensor(); }
  bool is_none(size_t i) const { return args_.at(i).isNone(); }
  Value value(size_t i) const;                // Tensor or Tensor? (undefined Value for None)
  Values values(size_t i) const;              // Tensor[]
  double number(size_t i) const;              // float, int or bool scalar
  int64_t integer(size_t i) const { return args_.at(i).toInt(); }
  bool boolean(size_t i) const { return args_.at(i).toBool(); }
  std::vector<int64_t> ints(size_t i) const;  // int[] (a single int is read as a one-element list)
  bool is_string(size_t i) const { return args_.at(i).isString(); }
  std::string str(size_t i) const { return args_.at(i).toStringRef(); }

 private:
  const std::vector<c10::IValue>& args_;
  std::function<Value(const at::Tensor&)> value_of_;
};

// A native op: the ration op's outputs for these arguments (one per output of the JIT node: aten::lstm has
// three), or nullopt when this call does not fit it (the node then runs as a generic node).
using NativeFn = std::optional<Values> (*)(const NodeArgs& args);

// The native op for an aten kind (in-place forms like "aten::relu_" map to their functional op), or
// nullptr when ration has none.
NativeFn find_native(const std::string& kind);

}  // namespace ration::torchscript
