// engine.h — reverse-mode execution over recorded Nodes.
// Owns: dependency counting, the ready queue (highest sequence number first, i.e. reverse creation
//       order, so the memory plan knows the backward order in advance), gradient buffers, leaf
//       accumulation (+=) with gradient-ready hooks, and release of saved values after their last use.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "ration/core/value.h"

namespace ration {

// Backward from several roots at once. `grads[i]` may be undefined for a scalar root (means 1).
void run_backward(const Values& roots, const std::vector<at::Tensor>& grads, bool retain_graph);

}  // namespace ration
