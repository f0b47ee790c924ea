// clip.h — gradient-norm clipping, torch.nn.utils.clip_grad_norm_ semantics.
// Owns: the total norm over all defined gradients (the p-norm of the per-gradient p-norms; the max
//       absolute entry for p = inf) and the in-place rescale of every gradient by
//       min(1, max_norm / (total_norm + 1e-6)). Parameters without a gradient are ignored.
#pragma once
#include <limits>
#include <vector>

#include "ration/optim/optimizer.h"

namespace ration::optim {

// Returns the total norm before clipping (0 when no parameter has a gradient). With
// error_if_nonfinite, a NaN/inf total norm throws ration::Error instead of scaling.
double clip_grad_norm(const NamedParams& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);
double clip_grad_norm(const std::vector<Value>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

// The two halves of clip_grad_norm, for gradients spread over processes (a group of parameter servers,
// each holding some parameters): every process computes its gradients' norms (in order), the norms of
// every parameter are gathered in model order, and each process scales its own gradients by the total
// of all of them. With all the norms of one process this is clip_grad_norm, bitwise.
std::vector<at::Tensor> gradient_norms(const std::vector<Value>& params, double norm_type = 2.0);
double clip_by_norms(const std::vector<Value>& params, double max_norm, const std::vector<at::Tensor>& all_norms,
                     double norm_type = 2.0, bool error_if_nonfinite = false);

// The total gradient norm without clipping (for logging).
double grad_norm(const std::vector<Value>& params, double norm_type = 2.0);

}  // namespace ration::optim
