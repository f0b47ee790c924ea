// plan/report.h — a plan as JSON (`ration plan --json`, the training report's "plan" object); the
// table form is Plan::to_table (defined in plan/report.cpp beside this).
// Owns: the plan's output formats. Does not own: the plan (planner.h).
// nlohmann::json is part of this header's API, so the library links nlohmann_json PUBLIC (CMakeLists.txt)
// and its package config finds it for downstream users; planner.h itself does not include it.
#pragma once
#include <nlohmann/json.hpp>

#include "ration/plan/planner.h"

namespace ration::memory {

nlohmann::json to_json(const Plan& plan);

}  // namespace ration::memory
