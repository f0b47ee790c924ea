// op_report.h — which ops of a profiled step ran as ration's own ops and which as generic nodes, with
// their share of the step's measured node time (forward + backward), for `ration plan` and the report.
// Owns: OpShare rows from a StepProfile and their table / JSON. Does not own: the profile (plan/profile.h).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ration/plan/profile.h"

namespace ration::torchscript {

struct OpShare {
  std::string op;        // ration's op name ("conv2d") or the aten op of a generic node ("aten::lstm")
  bool generic = false;  // ran through the generic node (generic_op.h)
  int64_t nodes = 0;
  double forward_ms = 0, backward_ms = 0;
  double share = 0;      // (forward + backward) / all nodes' forward + backward
};

// One row per op name, most time first.
std::vector<OpShare> op_shares(const memory::StepProfile& profile);
std::string op_share_table(const std::vector<OpShare>& rows);
nlohmann::json op_share_json(const std::vector<OpShare>& rows);

}  // namespace ration::torchscript
