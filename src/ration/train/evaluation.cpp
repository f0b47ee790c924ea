// evaluation.cpp — sharded evaluation and the ensemble's combination (see evaluation.h).
#include "ration/train/evaluation.h"

#include <algorithm>
#include <cmath>

#include "ration/base/check.h"
#include "ration/core/value.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/distributed/data_parallel.h"

namespace ration::train {

EvalResult evaluate(models::Model& model, const std::shared_ptr<data::Dataset>& set, int64_t batch_size,
                    int64_t max_batches, const dist::World& world) {
  data::LoaderOptions lo{batch_size, /*shuffle=*/false, 0, /*drop_last=*/false};
  lo.shard_rank = world.rank();
  lo.shard_count = world.size();
  data::Loader loader(set, lo);
  models::EvalStats total;
  const bool was_training = model.is_training();
  model.eval();
  int64_t batches = 0;
  {
    NoGradGuard no_grad;
    while (loader.has_next_in_epoch() && (max_batches <= 0 || batches < max_batches)) {
      const std::vector<int64_t> indices = loader.next_indices();
      ++batches;
      if (indices.empty()) {  // a short last batch left this rank nothing
        model.evaluate_nothing();  // (a feature-split model still serves the others' lookups)
        continue;
      }
      data::Batch b = set->get(indices);
      const auto s = model.evaluate(b);
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.count += s.count;
      total.scores.insert(total.scores.end(), s.scores.begin(), s.scores.end());
      total.labels.insert(total.labels.end(), s.labels.begin(), s.labels.end());
    }
  }
  model.train(was_training);
  const std::vector<double> sums = dist::all_reduce_doubles(
      world, {total.loss_sum, static_cast<double>(total.correct), static_cast<double>(total.count)});
  total.loss_sum = sums[0];
  total.correct = static_cast<int64_t>(sums[1]);
  total.count = static_cast<int64_t>(sums[2]);
  EvalResult r;
  r.count = total.count;
  if (total.count > 0) {
    r.loss = total.loss_sum / static_cast<double>(total.count);
    r.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.count);
  }
  // AUC is not a sum: every rank ranks the scores of the whole evaluation set (all-gathered).
  const std::vector<float> scores = dist::all_gather_floats(world, total.scores);
  const std::vector<float> labels = dist::all_gather_floats(world, total.labels);
  if (!scores.empty()) r.auc = data::roc_auc(scores, labels);
  return r;
}


EvalResult evaluate_members(models::Model& model, const std::shared_ptr<data::Dataset>& set, int64_t batch_size,
                            int64_t max_batches, const dist::World& world) {
  data::Loader loader(set, {batch_size, /*shuffle=*/false, 0, /*drop_last=*/false});
  std::vector<float> probabilities;  // (items, classes) of this rank's member
  std::vector<int64_t> targets;
  int64_t classes = 0;
  const bool was_training = model.is_training();
  model.eval();
  {
    NoGradGuard no_grad;
    for (int64_t batches = 0; loader.has_next_in_epoch() && (max_batches <= 0 || batches < max_batches); ++batches) {
      const models::EvalStats s = model.evaluate(loader.next());
      RATION_CHECK(s.classes > 0, "an ensemble's evaluation needs each item's class probabilities (a classifier)");
      classes = s.classes;
      probabilities.insert(probabilities.end(), s.probabilities.begin(), s.probabilities.end());
      targets.insert(targets.end(), s.targets.begin(), s.targets.end());
    }
  }
  model.train(was_training);
  const auto items = static_cast<int64_t>(targets.size());
  const std::vector<float> all = dist::all_gather_floats(world, probabilities);  // (members, items, classes)
  const int members = world.size();
  RATION_CHECK(static_cast<int64_t>(all.size()) == members * items * classes,
               "ensemble members evaluated different numbers of items");
  EvalResult r;
  r.count = items;
  r.member_accuracy.assign(static_cast<size_t>(members), 0.0);
  int64_t soft_correct = 0, vote_correct = 0;
  double nll = 0;
  std::vector<double> mean(static_cast<size_t>(classes));
  std::vector<int64_t> votes(static_cast<size_t>(classes));
  for (int64_t i = 0; i < items; ++i) {
    std::fill(mean.begin(), mean.end(), 0.0);
    std::fill(votes.begin(), votes.end(), 0);
    for (int m = 0; m < members; ++m) {
      const float* p = all.data() + (static_cast<int64_t>(m) * items + i) * classes;
      const auto best = std::max_element(p, p + classes) - p;
      ++votes[static_cast<size_t>(best)];
      if (best == targets[static_cast<size_t>(i)]) r.member_accuracy[static_cast<size_t>(m)] += 1;
      for (int64_t c = 0; c < classes; ++c) mean[static_cast<size_t>(c)] += p[c] / members;
    }
    const int64_t t = targets[static_cast<size_t>(i)];
    soft_correct += (std::max_element(mean.begin(), mean.end()) - mean.begin()) == t;
    vote_correct += (std::max_element(votes.begin(), votes.end()) - votes.begin()) == t;
    nll -= std::log(std::max(mean[static_cast<size_t>(t)], 1e-30));
  }
  if (items > 0) {
    for (double& a : r.member_accuracy) a /= static_cast<double>(items);
    r.accuracy = static_cast<double>(soft_correct) / static_cast<double>(items);
    r.vote_accuracy = static_cast<double>(vote_correct) / static_cast<double>(items);
    r.loss = nll / static_cast<double>(items);
  }
  return r;
}

}  // namespace ration::train
