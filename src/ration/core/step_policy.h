// step_policy.h — the decision object of a training step's memory runtime.
// Owns: StepPolicy, the interface every memory mode implements: ProfilePolicy (keep everything, record),
//       BudgetPolicy (execute a keep/recompute/offload plan), ThresholdPolicy (offload above T1 with
//       T2/T3 back-pressure). A policy decides; it does not drive.
// Does not own: the step's structure. train::StepRuntime installs itself as the thread's MemoryPolicy,
//       marks step begin and end, stamps every node's position (StepOrder) before a policy sees it,
//       calls the offload engine's per-node mechanism around the policy's decisions, and fetches
//       offloaded values; a policy is called exactly once per event below.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace ration {
class Node;
}

namespace ration::memory {

class StepPolicy {
 public:
  virtual ~StepPolicy() = default;
  virtual void begin_step() {}
  // `node` (Node::ordinal stamped) finished its forward; `node.saved` lists the values it saved: keep,
  // drop or offload each. `inputs` / `outputs` are the tensors it consumed and produced (all outputs,
  // internal ones included).
  virtual void after_forward_node(Node& node, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& outputs) = 0;
  // A step of several micro-batches whose forward and backward interleave (a pipeline stage): the
  // backward of one micro-batch (numbered as its forward was) begins.
  virtual void begin_backward() {}
  virtual void before_backward_node(Node& /*node*/) {}
  virtual void after_backward_node(Node& /*node*/) {}
  // May a prefetch of `bytes` (not yet needed by backward) start now? (T3)
  virtual bool may_prefetch(int64_t /*bytes*/) { return true; }
  // See MemoryPolicy::store_rebuilt: false makes a re-run that only feeds another re-run transient.
  virtual bool store_rebuilt(Node& /*producer*/) { return true; }
  virtual void end_step() {}
};

}  // namespace ration::memory
