// trainer.h — `ration train`: config -> data, model, optimiser -> steps with progress, evaluation,
// checkpoints and a JSON report.
// Owns: the training loop (TrainingRun in trainer.cpp: read a batch, step, evaluate, checkpoint, report)
//       and the report's own parts (run, loss, evaluations, time). Does not own: what the run is built
//       from (train/setup.h), how ranks make a step together (train/data_parallel_step.h), one step's
//       execution, memory runtime, re-plans and their report fragments (runtime/step_runtime.h), the model
//       (models/), the data (data/), the update rule (optim/), the checkpoint layout (train/checkpoint.h).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ration/distributed/world.h"
#include "ration/offload/engine.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"
#include "ration/config/config.h"
#include "ration/train/setup.h"

namespace ration::train {

class StepRuntime;

// What the caller attaches to a run (the command line's --trace and --html, train/step_trace.h): called
// with the run's step runtime once before the first step, and once the report is built (before it is
// written, so entries added to it are saved too).
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void before_steps(StepRuntime& runtime, int64_t first_step, int64_t total_steps) {}
  virtual void after_run(StepRuntime& runtime, nlohmann::json& report) {}
};

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // "section.key=value"
  std::optional<int64_t> steps;
  std::optional<int64_t> epochs;
  std::string report_path;             // empty: no file
  std::string resume;                  // checkpoint dir, or a run dir (follows latest)
  bool json = false;                   // quiet; the report goes to stdout
  // > 0: profile this many steps (after the first) per op and per node (train/op_profile.h): the table is
  // printed at the end (stderr with --json) and the report gets "op_profile".
  int64_t profile_ops = 0;
  // Data parallel: the world to train in. Undefined (the default): joined from the environment when
  // WORLD_SIZE is set (torchrun-style variables, as `ration launch` sets them), else one process.
  dist::World world;
  RunObserver* observer = nullptr;     // optional; outlives the run
};

// Runs training; returns the report (also written to options.report_path when set, by rank 0 only).
// With WORLD_SIZE > 1 each rank trains on its shard and gradients are synchronised (distributed/reducer.h); a
// lost peer makes every rank throw ration::Error naming it.
nlohmann::json run_training(const TrainOptions& options);

// The exit status of a finished run from its report (README, "Exit codes"): 130 / 143 when a signal stopped
// it, 1 when a step's measured peak exceeded the memory budget (the plan did not hold: a failed check,
// though the report and checkpoints were written), else 0.
int exit_status(const nlohmann::json& report);


}  // namespace ration::train
