// plan/strategies.h — runs the strategy PlanOptions::strategy names (the table and the strategies' bodies
// are in plan/strategies.cpp).
// Owns: nothing but the entry point. Does not own: the context (plan/context.h), the final plan (planner.cpp).
#pragma once
#include "ration/plan/context.h"

namespace ration::memory {

// The decisions of ctx.options().strategy. Throws ration::Error for a strategy that cannot apply
// (optimal-chain on a graph that is not a chain, or no schedule that fits).
Choice run_strategy(PlanContext& ctx);

}  // namespace ration::memory
