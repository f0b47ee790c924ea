// ctr_synthetic.h — data.kind = "synthetic_ctr": click data from a planted model, generated on demand.
// Owns: CtrSynthetic (sample i is a pure function of (seed, i): nothing is stored, so 10^7-id fields
//       and any number of samples cost no memory), the planted model (a hidden weight per (field, id) and
//       per dense feature, a bias solved for the requested click rate), Zipf(alpha) id ranks scattered by
//       a seeded permutation of each field's id space, multi-hot bag sizes, and drift (the hot ranks move
//       through the id space as the sample index grows, so later samples favour other ids).
// Does not own: batching order (data/dataset.h), the model (models/ctr.h).
//
// Sample i, field f (cardinality N_f): bag size k uniform in [bag_min_f, bag_max_f]; each id is
//   rank r ~ Zipf(alpha) on 1..N_f (inverse of the continuous power-law CDF, floored),
//   id = perm_f((r - 1 + shift(i)) mod N_f), shift(i) = floor(drift * N_f * i / total_samples),
// perm_f a 4-round Feistel permutation of [0, N_f) keyed by (seed, f) (cycle-walking).
// Dense features x ~ N(0, 1). Label ~ Bernoulli(sigmoid(sum_f mean_{id in bag} w_f(id) + v.x + b)), with
// w_f(id) ~ N(0, weight_scale^2) and v_d ~ N(0, 0.5^2) derived from hashes, and b solved by bisection so
// the mean click probability over the training samples' first 20000 is click_rate.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ration/data/dataset.h"

namespace ration::data {

struct CtrSyntheticOptions {
  std::vector<int64_t> cardinalities = {100000, 100000, 10000, 1000};  // one per sparse field (<= 10^9)
  std::vector<int64_t> bag_min = {1, 1, 1, 1};
  std::vector<int64_t> bag_max = {1, 3, 5, 1};
  int64_t num_dense = 4;
  double zipf_alpha = 1.1;
  double click_rate = 0.25;
  double drift = 0.0;           // fraction of each field's id space the hot set moves over all samples
  double weight_scale = 1.0;    // std of the planted per-id weights
  int64_t train_samples = 200000;
  int64_t eval_samples = 20000;  // the samples after the training ones (later in time)
  uint64_t seed = 1;
};

class CtrSynthetic : public Dataset {
 public:
  enum class Split { Train, Eval };
  CtrSynthetic(CtrSyntheticOptions options, Split split);

  int64_t size() const override;
  // input (B, num_dense) float32, target (B) int64 labels in {0, 1}, sparse: one bag per field.
  Batch get(const std::vector<int64_t>& indices) const override;

  // The planted model's click probability of sample `index` of this split (for its AUC).
  double planted_probability(int64_t index) const;
  // The same when only the ids `known(field, id)` keep their planted weight and every other id counts
  // 0 (the weights' mean): the ceiling of a learner that knows exactly the weights of the ids it saw.
  double planted_probability_knowing(int64_t index, const std::function<bool(int64_t, int64_t)>& known) const;
  // Every id of `field` in sample `index` of this split (all its bags' ids, repeats included).
  std::vector<int64_t> ids_of(int64_t index, int64_t field) const;
  int64_t num_fields() const { return static_cast<int64_t>(options_.cardinalities.size()); }

 private:
  struct Sample {
    std::vector<std::vector<int64_t>> bags;  // per field
    std::vector<float> dense;
    double logit = 0;
  };
  Sample sample(int64_t global_index) const;  // without the bias
  int64_t global_index(int64_t index) const;
  int64_t permute(int64_t field, int64_t x) const;
  double weight(int64_t field, int64_t id) const;  // the planted weight of (field, id)

  CtrSyntheticOptions options_;
  Split split_;
  double bias_ = 0;
};

// Area under the ROC curve of scores against binary labels (ties count half). NaN when one class is absent.
double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace ration::data
