// ctr_data.h — building the click-through data sources from a config ([data] keys).
// Owns: reading data.* for kind "synthetic_ctr" and "movielens", publishing data.num_fields,
//       data.num_dense and (synthetic_ctr) each table's rows data.field<F>_rows for the ctr model, and the planted model's own AUC on the evaluation split
//       (synthetic only: the ceiling a learned model can approach).
// Does not own: the generators and readers (ctr_synthetic.h, ctr_movielens.h).
// Keys — synthetic_ctr: cardinalities ([100000, 100000, 10000, 1000]), bag_min, bag_max, num_dense (4),
//   zipf_alpha (1.1), click_rate (0.25), drift (0), weight_scale (1), train_samples (200000),
//   eval_samples (20000), seed (train.seed). movielens: file ("data/movielens.csv"),
//   train_fraction (0.8).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "ration/data/dataset.h"
#include "ration/config/config.h"

namespace ration::data {

struct CtrSets {
  std::shared_ptr<Dataset> train;
  std::shared_ptr<Dataset> eval;
  std::optional<double> planted_auc;  // synthetic_ctr: AUC of the true click probabilities on eval
};

CtrSets make_ctr_datasets(Config& cfg, const std::string& kind);

}  // namespace ration::data
