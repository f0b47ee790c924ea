// ctr_synthetic.cpp — the planted-model click generator and roc_auc (see ctr_synthetic.h).
#include "ration/data/ctr_synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ration/base/check.h"

namespace ration::data {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
uint64_t key(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) { return mix(mix(mix(mix(a) ^ b) ^ c) ^ d); }
double uniform(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0; }  // (0, 1)
double normal(uint64_t h) {
  const double u1 = uniform(h), u2 = uniform(mix(h));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

enum Stream : uint64_t { kBag = 1, kRank, kDense, kLabel, kWeight, kDenseWeight, kPerm };

}  // namespace

CtrSynthetic::CtrSynthetic(CtrSyntheticOptions o, Split split) : options_(std::move(o)), split_(split) {
  const size_t f = options_.cardinalities.size();
  RATION_CHECK(f >= 1, "data.cardinalities must list at least one sparse field");
  RATION_CHECK(options_.bag_min.size() == f && options_.bag_max.size() == f, "data.bag_min and data.bag_max need one ",
               "entry per field (", f, " cardinalities); got ", options_.bag_min.size(), " and ", options_.bag_max.size());
  for (size_t i = 0; i < f; ++i) {
    RATION_CHECK(options_.cardinalities[i] >= 2 && options_.cardinalities[i] <= 1000000000, "data.cardinalities[", i,
                 "] must be in [2, 10^9]; got ", options_.cardinalities[i]);
    RATION_CHECK(options_.bag_min[i] >= 0 && options_.bag_max[i] >= options_.bag_min[i] && options_.bag_max[i] <= 1024,
                 "data.bag_min/bag_max[", i, "] must satisfy 0 <= min <= max <= 1024; got ", options_.bag_min[i], "..",
                 options_.bag_max[i]);
  }
  RATION_CHECK(options_.num_dense >= 1, "data.num_dense must be >= 1");
  RATION_CHECK(options_.zipf_alpha > 0, "data.zipf_alpha must be > 0");
  RATION_CHECK(options_.click_rate > 0 && options_.click_rate < 1, "data.click_rate must be in (0, 1)");
  RATION_CHECK(options_.drift >= 0 && options_.drift <= 1, "data.drift must be in [0, 1]");
  RATION_CHECK(options_.train_samples >= 1 && options_.eval_samples >= 1, "data.train_samples and data.eval_samples ",
               "must be >= 1");
  // Bias for the requested click rate: bisection on the mean probability of a training prefix.
  const int64_t probe = std::min<int64_t>(options_.train_samples, 20000);
  std::vector<double> logits(static_cast<size_t>(probe));
  for (int64_t i = 0; i < probe; ++i) logits[static_cast<size_t>(i)] = sample(i).logit;
  double lo = -30, hi = 30;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    double p = 0;
    for (double l : logits) p += 1.0 / (1.0 + std::exp(-(l + mid)));
    (p / static_cast<double>(probe) < options_.click_rate ? lo : hi) = mid;
  }
  bias_ = 0.5 * (lo + hi);
}

int64_t CtrSynthetic::size() const {
  return split_ == Split::Train ? options_.train_samples : options_.eval_samples;
}

int64_t CtrSynthetic::global_index(int64_t index) const {
  return split_ == Split::Train ? index : options_.train_samples + index;
}

int64_t CtrSynthetic::permute(int64_t field, int64_t x) const {
  // Feistel over the smallest even-bit power of two >= N, cycle-walking back into [0, N).
  const uint64_t n = static_cast<uint64_t>(options_.cardinalities[static_cast<size_t>(field)]);
  int bits = 2;
  while ((1ULL << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (1ULL << half) - 1;
  uint64_t v = static_cast<uint64_t>(x);
  do {
    uint64_t l = v >> half, r = v & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t nl = r;
      r = l ^ (key(options_.seed, kPerm, static_cast<uint64_t>(field), (round << 40) ^ r) & mask);
      l = nl;
    }
    v = (l << half) | r;
  } while (v >= n);
  return static_cast<int64_t>(v);
}

CtrSynthetic::Sample CtrSynthetic::sample(int64_t g) const {
  Sample s;
  const uint64_t seed = options_.seed;
  const double total = static_cast<double>(options_.train_samples + options_.eval_samples);
  const double a = options_.zipf_alpha;
  s.bags.resize(options_.cardinalities.size());
  for (size_t f = 0; f < options_.cardinalities.size(); ++f) {
    const int64_t n = options_.cardinalities[f];
    const int64_t span = options_.bag_max[f] - options_.bag_min[f] + 1;
    const int64_t k = options_.bag_min[f] +
                      static_cast<int64_t>(key(seed, kBag, static_cast<uint64_t>(g), f) % static_cast<uint64_t>(span));
    const int64_t shift = static_cast<int64_t>(std::floor(options_.drift * static_cast<double>(n) * static_cast<double>(g) / total));
    double wsum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double u = uniform(key(seed, kRank, static_cast<uint64_t>(g), (f << 16) ^ static_cast<uint64_t>(j)));
      // Continuous power law on [1, n + 1): CDF^-1.
      double r;
      if (std::fabs(a - 1.0) < 1e-9) r = std::exp(u * std::log(static_cast<double>(n) + 1.0));
      else r = std::pow(1.0 + u * (std::pow(static_cast<double>(n) + 1.0, 1.0 - a) - 1.0), 1.0 / (1.0 - a));
      const int64_t rank = std::min<int64_t>(n, std::max<int64_t>(1, static_cast<int64_t>(r)));
      const int64_t id = permute(static_cast<int64_t>(f), (rank - 1 + shift) % n);
      s.bags[f].push_back(id);
      wsum += weight(static_cast<int64_t>(f), id);
    }
    if (k > 0) s.logit += wsum / static_cast<double>(k);
  }
  for (int64_t d = 0; d < options_.num_dense; ++d) {
    const double x = normal(key(seed, kDense, static_cast<uint64_t>(g), static_cast<uint64_t>(d)));
    s.dense.push_back(static_cast<float>(x));
    s.logit += 0.5 * normal(key(seed, kDenseWeight, static_cast<uint64_t>(d))) * x;
  }
  return s;
}

double CtrSynthetic::weight(int64_t field, int64_t id) const {
  return options_.weight_scale * normal(key(options_.seed, kWeight, static_cast<uint64_t>(field), static_cast<uint64_t>(id)));
}

double CtrSynthetic::planted_probability_knowing(int64_t index,
                                                 const std::function<bool(int64_t, int64_t)>& known) const {
  const Sample s = sample(global_index(index));
  double logit = s.logit;
  for (size_t f = 0; f < s.bags.size(); ++f) {
    const auto& bag = s.bags[f];
    double unknown = 0;
    for (int64_t id : bag)
      if (!known(static_cast<int64_t>(f), id)) unknown += weight(static_cast<int64_t>(f), id);
    if (!bag.empty()) logit -= unknown / static_cast<double>(bag.size());
  }
  return 1.0 / (1.0 + std::exp(-(logit + bias_)));
}

std::vector<int64_t> CtrSynthetic::ids_of(int64_t index, int64_t field) const {
  RATION_CHECK(index >= 0 && index < size() && field >= 0 && field < num_fields(), "synthetic_ctr: sample ", index,
               " field ", field, " out of range");
  return sample(global_index(index)).bags[static_cast<size_t>(field)];
}

double CtrSynthetic::planted_probability(int64_t index) const {
  return 1.0 / (1.0 + std::exp(-(sample(global_index(index)).logit + bias_)));
}

Batch CtrSynthetic::get(const std::vector<int64_t>& indices) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t nf = num_fields();
  at::Tensor dense = at::empty({b, options_.num_dense}, at::kFloat);
  at::Tensor labels = at::empty({b}, at::kLong);
  std::vector<std::vector<int64_t>> ids(static_cast<size_t>(nf));
  std::vector<at::Tensor> offsets;
  for (int64_t f = 0; f < nf; ++f) offsets.push_back(at::empty({b}, at::kLong));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[static_cast<size_t>(i)];
    RATION_CHECK(idx >= 0 && idx < size(), "synthetic_ctr index ", idx, " out of range [0, ", size(), ")");
    const int64_t g = global_index(idx);
    const Sample s = sample(g);
    std::copy(s.dense.begin(), s.dense.end(), dense.data_ptr<float>() + i * options_.num_dense);
    const double p = 1.0 / (1.0 + std::exp(-(s.logit + bias_)));
    labels.data_ptr<int64_t>()[i] = uniform(key(options_.seed, kLabel, static_cast<uint64_t>(g))) < p ? 1 : 0;
    for (int64_t f = 0; f < nf; ++f) {
      offsets[static_cast<size_t>(f)].data_ptr<int64_t>()[i] = static_cast<int64_t>(ids[static_cast<size_t>(f)].size());
      auto& dst = ids[static_cast<size_t>(f)];
      dst.insert(dst.end(), s.bags[static_cast<size_t>(f)].begin(), s.bags[static_cast<size_t>(f)].end());
    }
  }
  Batch batch;
  batch.input = Value(dense);
  batch.target = Value(labels);
  batch.items = b;
  for (int64_t f = 0; f < nf; ++f) {
    auto& v = ids[static_cast<size_t>(f)];
    batch.sparse.push_back({at::tensor(v, at::kLong), offsets[static_cast<size_t>(f)]});
  }
  return batch;
}

double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  RATION_CHECK(scores.size() == labels.size(), "roc_auc: ", scores.size(), " scores for ", labels.size(), " labels");
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of positive ranks (average rank for ties), Mann-Whitney U.
  double pos = 0, neg = 0, rank_sum = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double avg_rank = 0.5 * (static_cast<double>(i + 1) + static_cast<double>(j));
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5) {
        rank_sum += avg_rank;
        pos += 1;
      } else {
        neg += 1;
      }
    }
    i = j;
  }
  if (pos == 0 || neg == 0) return std::nan("");
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

}  // namespace ration::data
