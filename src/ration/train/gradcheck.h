// gradcheck.h — the outside oracle for whole models: one step in our engine vs libtorch autograd.
// Owns: running the same forward twice on the same batch, parameters and RNG seed — once
//       differentiated by ration's engine (under the memory mode of the given StepRuntime: plain,
//       budgeted recompute, offload), once by torch::autograd (OracleScope) — and comparing gradients.
#pragma once
#include <string>
#include <vector>

#include "ration/data/batch.h"
#include "ration/models/model.h"
#include "ration/runtime/step_runtime.h"

namespace ration {

struct ParamGradError {
  std::string name;
  std::vector<int64_t> shape;
  double max_abs_error = 0;
  double max_rel_error = 0;   // max |ours - torch| / max(max |torch|, 1e-12)
  bool bitwise_equal = false;
};

struct GradcheckResult {
  double loss_ours = 0;
  double loss_torch = 0;
  std::vector<ParamGradError> params;
  double worst_rel_error = 0;
  bool passed = false;
};

// Buffers (batch-norm running statistics) are restored after each forward so both runs see the same state.
GradcheckResult gradcheck(train::StepRuntime& runtime, models::Model& model, const data::Batch& batch, uint64_t seed,
                          double tolerance);

// One engine step (ours) under `runtime`: the gradients by parameter name in StepStats::gradients,
// buffers restored afterwards, parameters' gradients cleared.
train::StepStats engine_step(train::StepRuntime& runtime, models::Model& model, const data::Batch& batch,
                             uint64_t seed);

}  // namespace ration
