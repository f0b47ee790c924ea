// ctr_data.cpp — config -> click-through datasets (see ctr_data.h).
#include "ration/data/ctr_data.h"

#include "ration/base/check.h"
#include "ration/data/ctr_movielens.h"
#include "ration/data/ctr_synthetic.h"

namespace ration::data {

CtrSets make_ctr_datasets(Config& cfg, const std::string& kind) {
  CtrSets sets;
  if (kind == "synthetic_ctr") {
    CtrSyntheticOptions o;
    o.cardinalities = cfg.get_int_list("data.cardinalities", o.cardinalities);
    const size_t f = o.cardinalities.size();
    o.bag_min = cfg.get_int_list("data.bag_min", std::vector<int64_t>(f, 1));
    o.bag_max = cfg.get_int_list("data.bag_max", std::vector<int64_t>(f, 1));
    o.num_dense = cfg.get_int("data.num_dense", o.num_dense);
    o.zipf_alpha = cfg.get_double("data.zipf_alpha", o.zipf_alpha);
    o.click_rate = cfg.get_double("data.click_rate", o.click_rate);
    o.drift = cfg.get_double("data.drift", o.drift);
    o.weight_scale = cfg.get_double("data.weight_scale", o.weight_scale);
    o.train_samples = cfg.get_int("data.train_samples", o.train_samples);
    o.eval_samples = cfg.get_int("data.eval_samples", o.eval_samples);
    o.seed = static_cast<uint64_t>(cfg.get_int("data.seed", cfg.has("train.seed") ? cfg.get_int("train.seed", 0) : 0));
    auto train = std::make_shared<CtrSynthetic>(o, CtrSynthetic::Split::Train);
    auto eval = std::make_shared<CtrSynthetic>(o, CtrSynthetic::Split::Eval);
    std::vector<float> scores, labels;
    const Batch all = [&] {
      std::vector<int64_t> idx(static_cast<size_t>(eval->size()));
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
      return eval->get(idx);
    }();
    const int64_t* y = all.target.tensor().data_ptr<int64_t>();
    for (int64_t i = 0; i < eval->size(); ++i) {
      scores.push_back(static_cast<float>(eval->planted_probability(i)));
      labels.push_back(static_cast<float>(y[i]));
    }
    sets.planted_auc = roc_auc(scores, labels);
    cfg.set("data.num_fields", static_cast<int64_t>(f));
    // Each table's rows: the feature split places whole tables by rows x dim (models/feature_split.h).
    for (size_t k = 0; k < f; ++k) cfg.set("data.field" + std::to_string(k) + "_rows", o.cardinalities[k]);
    cfg.set("data.num_dense", o.num_dense);
    sets.train = train;
    sets.eval = eval;
  } else {
    RATION_CHECK(kind == "movielens", "make_ctr_datasets: unknown kind '", kind, "'");
    const std::string file = cfg.get_string("data.file", kDefaultMovielensCsv);
    const double frac = cfg.get_double("data.train_fraction", 0.8);
    auto [train, eval] = Movielens::load(file, frac);
    cfg.set("data.num_fields", Movielens::kFields);
    cfg.set("data.num_dense", int64_t{1});
    sets.train = train;
    sets.eval = eval;
  }
  return sets;
}

}  // namespace ration::data
