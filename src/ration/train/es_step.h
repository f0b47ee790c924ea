// es_step.h — gradient-free training by evolution strategies (optim.name = "es"; docs/DISTRIBUTED.md,
// "Evolution strategies"): each step, a population of antithetic perturbations theta +- sigma * eps_i is
// evaluated on forward passes only; eps_i is drawn from a seed every rank shares (train.seed, step, i), so
// the only message is one all-reduce of the population's scalar losses — 4 bytes per member, whatever the
// model's size. Every rank then rebuilds the same estimate
//   g = sum_i (L(theta + sigma eps_i) - L(theta - sigma eps_i)) eps_i / (2 sigma pairs)
// and hands it to the run's optimiser (SGD with its momentum, clipping and schedule) as the gradient.
// Owns: EsSettings (optim.es_population, optim.es_sigma: read with the run settings, train/setup.h), the shared noise, the pairs' split over ranks
//       (pair i on rank i mod N, each on that rank's shard of the step's batch), the estimate, its bytes.
// Does not own: the optimiser, the loop and the data (trainer.cpp, data_parallel_step.cpp).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "ration/data/batch.h"
#include "ration/distributed/world.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"

namespace ration::train {

struct EsSettings {
  int64_t population = 32;  // perturbations per step over every rank (even: antithetic pairs)
  double sigma = 0.01;      // perturbation scale
};

class EsStep {
 public:
  EsStep(dist::World world, optim::NamedParams params, EsSettings settings, uint64_t seed);
  // One step's estimate on this rank's `batch` (may be empty: the rank evaluates nothing): every
  // param.grad is set to g. Returns the mean loss over the population (every rank's pairs).
  double estimate(models::Model& model, const data::Batch* batch, int64_t step);
  // The same eps_i on every rank: one (numel) float32 tensor per parameter.
  std::vector<at::Tensor> noise(int64_t step, int64_t pair) const;
  int64_t bytes_per_step() const { return 4 * settings_.population; }  // the all-reduced losses
  const EsSettings& settings() const { return settings_; }

 private:
  void add_noise(const std::vector<at::Tensor>& eps, double scale);
  dist::World world_;
  optim::NamedParams params_;
  EsSettings settings_;
  uint64_t seed_;
};

}  // namespace ration::train
