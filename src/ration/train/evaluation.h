// evaluation.h — one pass over an evaluation set during training: every rank its shard, sums and AUC
// over every rank; or, for an ensemble, every member the whole set, combined.
// Owns: EvalResult, evaluate (sharded, all-reduced; AUC from all-gathered scores), evaluate_members
//       (each rank's member on the whole set; the members' class probabilities all-gathered and combined
//       by majority vote and by their mean; per-member figures). Does not own: the models' own
//       evaluate (models/model.h), when to evaluate and how it is printed (trainer.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ration/data/dataset.h"
#include "ration/distributed/world.h"
#include "ration/models/model.h"

namespace ration::train {

struct EvalResult {
  double loss = 0;      // mean per item (nats)
  double accuracy = 0;  // fraction
  int64_t count = 0;
  std::optional<double> auc;  // binary tasks (ctr)
  // An ensemble (evaluate_members): each member's accuracy (rank order), and the ensemble's by majority
  // vote (ties: the lowest class) — `accuracy` and `loss` are the mean probabilities' (soft vote).
  std::vector<double> member_accuracy;
  std::optional<double> vote_accuracy;
};

// Data parallel: each rank evaluates its shard of every global batch and the sums are all-reduced, so
// every rank reports the one-process figures.
EvalResult evaluate(models::Model& model, const std::shared_ptr<data::Dataset>& set, int64_t batch_size,
                    int64_t max_batches, const dist::World& world);

// An ensemble: every rank evaluates the first `max_batches` batches of the whole set (<= 0: all) with its
// own member (a classifier); the class probabilities are all-gathered and every rank computes the
// members' accuracies, the soft vote (mean probability: loss and accuracy) and the majority vote.
EvalResult evaluate_members(models::Model& model, const std::shared_ptr<data::Dataset>& set, int64_t batch_size,
                            int64_t max_batches, const dist::World& world);

}  // namespace ration::train
