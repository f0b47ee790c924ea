// generic_op.h — the generic node: an op ration has no native version of, run as one node of ration's graph.
// Owns: generic_node (forward = any function of tensors run by ATen or the TorchScript interpreter;
//       backward = that function re-run on the node's saved inputs under libtorch autograd and
//       differentiated there).
// Does not own: which ops take this path (torchscript/graph_runner.cpp decides), residency of the saved
//       inputs (core/saved_value.h: a generic node's inputs are kept, dropped, recomputed or offloaded as
//       one node like any other).
//
// What backward keeps: every tensor input (the op is re-run in backward, so it needs all of them), no
// output. Backward therefore costs one more forward of the op plus libtorch's backward of it.
// RNG: a generic op that draws random numbers (uses_rng) runs with ATen's default CPU generator seeded
// from the node's recorded seed, in forward, in a recompute and in backward, so all three draw the same.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "ration/core/value.h"

namespace ration::torchscript {

// inputs -> outputs; must not modify its inputs (clone what an in-place op would write first).
using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// The op name every generic node carries in profiles, plans and traces: "generic:" + `op`.
std::string generic_node_name(const std::string& op);

// Runs `fn` as one node named generic_node_name(op) over `inputs` (undefined Values allowed: they reach
// fn as undefined tensors). Returns the first `visible_outputs` outputs of fn. Backward errors (an op
// libtorch cannot differentiate) name `op` and `where`.
Values generic_node(const std::string& op, const std::string& where, const Values& inputs, TensorFn fn,
                    int visible_outputs, bool uses_rng = false);

}  // namespace ration::torchscript
