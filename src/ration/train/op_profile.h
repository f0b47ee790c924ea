// op_profile.h — where a training step's time goes: per op and per node, forward and backward.
// Owns: OpProfile, a StepHook that records chosen steps under a private Trace (core's per-node spans:
//       forward, backward, recompute) and sums them into (a) a per-op summary (op name: calls, forward,
//       backward and recompute self time), (b) per-node rows (module path/op: forward and backward ms),
//       and (c) the rest of the step (optimiser + clip, and what no node span covers: the engine's own
//       bookkeeping, hooks, allocation); the table `ration train --profile-ops` prints, and its JSON.
// Does not own: the spans (core/trace.h records them), the step (train::StepRuntime).
// Note: while a profiled step runs, its spans go to this profile's trace, not to a --trace file.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ration/runtime/step_runtime.h"

namespace ration {
class Trace;
class TraceScope;
}  // namespace ration

namespace ration::train {

class OpProfile : public StepHook {
 public:
  // Profiles `steps` steps starting at the `skip`-th step this hook sees (the first steps warm caches and
  // allocate optimiser state).
  explicit OpProfile(int64_t skip = 1, int64_t steps = 5);
  ~OpProfile() override;

  void before_forward(int64_t step, data::Batch& batch) override;
  void before_optimizer(int64_t step) override;
  void after_step(int64_t step, const StepStats& stats) override;

  struct Totals {
    int64_t calls = 0;  // forward calls (backward calls for backward-only entries)
    double forward_ms = 0, backward_ms = 0, recompute_ms = 0;
  };
  int64_t profiled_steps() const { return profiled_; }
  // Per op, summed over the profiled steps (divide by profiled_steps() for per-step numbers).
  const std::map<std::string, Totals>& ops() const { return ops_; }

  nlohmann::json to_json() const;
  // The per-op table (per step averages, largest first) and the step's remainder.
  std::string table(size_t max_rows = 30) const;

 private:
  void add_trace(const std::string& trace_json);

  int64_t skip_, steps_;
  int64_t seen_ = 0, profiled_ = 0;
  bool active_ = false;
  double optimizer_start_us_ = -1, step_start_us_ = 0;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<TraceScope> scope_;
  std::map<std::string, Totals> ops_, nodes_;
  std::vector<std::string> node_order_;
  double step_ms_ = 0, optimizer_ms_ = 0, spans_ms_ = 0;
};

}  // namespace ration::train
