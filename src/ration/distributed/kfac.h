// kfac.h — natural-gradient training with Kronecker-factored curvature (K-FAC) for Linear and Conv2d
// layers, over any number of ranks (optim.name = "kfac"; docs/DISTRIBUTED.md, "K-FAC").
// For a layer with weight W (out x in, a conv's flattened to C_out x C_in k k) and bias b, let a be its
// input with a 1 appended (a conv's unfolded k x k patches, one per output position) and g_hat the
// gradient at its output of the per-sample loss (the batch-mean loss's times the samples; a conv's also
// times its output positions T, as kfac-pytorch does). The factors
//   A = mean over samples (and positions) of a a^T,   G = mean over samples (and positions) of g_hat g_hat^T
// approximate the layer's Fisher block as A (x) G, so the natural gradient of [W b] is
//   (G + sqrt(damping) I)^-1 [dW db] (A + sqrt(damping) I)^-1,
// scaled by nu = min(1, sqrt(kl_clip / (lr^2 sum_layers <natural, plain>))) (KL clipping). Every
// `update_every` steps the statistics are gathered (each rank sums its samples' outer products; one
// all-reduce of every factor and the sample counts gives the global batch's means, the same as one process
// at that batch), folded into running averages (stat_decay), and the inverses recomputed: layer j's on
// rank j mod N, then broadcast from it. Between updates the last inverses precondition every step.
// Owns: the statistics (a nn::LayerObserver installed for the collecting steps), the factors, their
//       inverses and their distribution over ranks, the preconditioning of the observed layers' gradients
//       (in place, before the run's optimiser: SGD with momentum).
// Does not own: the layers (nn/), the gradient reduction (distributed/reducer.h), the optimiser.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ration/distributed/world.h"
#include "ration/nn/observe.h"
#include "ration/optim/optimizer.h"

namespace ration::dist {

struct KfacOptions {
  int64_t update_every = 10;  // steps between factor statistics, all-reduces and inverses (>= 1)
  double damping = 0.1;       // Tikhonov damping, split as sqrt(damping) on each factor
  double stat_decay = 0.95;   // running average of the factors: F = decay F + (1 - decay) F_step
  double kl_clip = 1e-3;      // KL clipping of the natural gradient's step (0: none)
};

class Kfac : public nn::LayerObserver {
 public:
  // `params`: the model's named parameters; a layer is preconditioned when its "<layer>.weight" (and
  // "<layer>.bias" if any) are among them.
  Kfac(World world, optim::NamedParams params, KfacOptions options);

  // Whether step `step` gathers statistics (the first step, then every update_every steps).
  bool collects(int64_t step) const;
  // Before a collecting step's first forward: clears the step's sums.
  void begin_statistics();
  // After the step's gradients are final (reduced), before the optimiser: on a collecting step, the
  // factors' all-reduce, running averages and inverses; then every observed layer's gradient becomes its
  // natural gradient (KL-clipped at learning rate `lr`). Layers never observed keep their gradients.
  void precondition(int64_t step, double lr);

  // nn::LayerObserver (installed by the caller for collecting steps: nn::LayerObserverScope).
  void linear_input(const std::string& layer, const at::Tensor& x) override;
  void conv_input(const std::string& layer, const nn::Conv2d& conv, const at::Tensor& x) override;
  void output_grad(const std::string& layer, const at::Tensor& g) override;

  // The running factors and their inverses by layer (tests, reports); empty before the first update.
  struct Factors {
    at::Tensor a, g;          // (in+1, in+1), (out, out) float32
    at::Tensor a_inv, g_inv;  // damped inverses
  };
  const std::map<std::string, Factors>& factors() const { return factors_; }
  int64_t updates() const { return updates_; }
  double last_nu() const { return last_nu_; }
  int64_t state_bytes() const;  // the factors and inverses

 private:
  struct Sums {  // one collecting step's, this rank's
    at::Tensor a, g;  // sums of outer products (float64)
    double a_count = 0, g_count = 0;
    bool conv = false;
  };
  bool update_factors();  // false when nothing was observed
  void invert(const std::string& layer, Factors& f);

  World world_;
  std::map<std::string, Value> weights_, biases_;
  KfacOptions options_;
  std::mutex mu_;  // observers may be called from backward threads
  std::map<std::string, Sums> sums_;
  std::map<std::string, Factors> factors_;
  int64_t updates_ = 0;
  double last_nu_ = 1;
};

}  // namespace ration::dist
