// step_order.h — every node's position in the training step, assigned once.
// Owns: StepOrder, the one numbering of a step's recorded nodes that the profile, the plan executor and
//       the offload engine all read (a plan names values by (producer ordinal, output index), so the
//       same model on a same-shaped batch gets the same names every step).
// Does not own: when a step begins or ends (train::StepRuntime calls begin() and assign()), or what
//       any reader does with the positions.
//
// assign() stamps Node::ordinal (0 for the step's first node, in creation order). A node recorded before
// this step began — an older graph still referenced — keeps an ordinal from its own step, so of() tells
// them apart by sequence number: a node belongs to this step iff it was created after the step's first.
#pragma once
#include <cstdint>
#include <limits>

#include "ration/core/node.h"
#include "ration/core/saved_value.h"

namespace ration::memory {

class StepOrder {
 public:
  // A new step: the next recorded node gets ordinal 0.
  void begin() {
    first_seq_ = kNone;
    count_ = 0;
  }
  // Stamp `node` with the next position of this step; returns it.
  int64_t assign(Node& node) {
    if (first_seq_ == kNone) first_seq_ = node.seq;
    node.ordinal = count_++;
    return node.ordinal;
  }
  // `node`'s position in this step, or -1 when it was not recorded in it.
  int64_t of(const Node& node) const {
    return node.ordinal >= 0 && first_seq_ != kNone && node.seq >= first_seq_ ? node.ordinal : -1;
  }
  // The position of `value`'s producer in this step; -1 for a pinned value, a producer recorded
  // outside this step, or one whose graph is gone.
  int64_t of(const SavedValue& value) const {
    const std::shared_ptr<Node> producer = value.producer();
    return producer ? of(*producer) : -1;
  }

 private:
  static constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  uint64_t first_seq_ = kNone;
  int64_t count_ = 0;
};

}  // namespace ration::memory
