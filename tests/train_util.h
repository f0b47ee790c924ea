// train_util.h — run `ration train` in-process for a test and get its JSON report.
// Owns: nothing but the TrainOptions a test would otherwise fill by hand. Does not own: the training
// run (train::run_training) or the configs the tests write.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "ration/train/trainer.h"

namespace ration::testing {

// Trains `cfg` with --set `overrides` (resuming from `resume` when given) in --json mode.
inline nlohmann::json train_json(const std::string& cfg, std::vector<std::string> overrides = {},
                                 const std::string& resume = "") {
  train::TrainOptions t;
  t.config_path = cfg;
  t.json = true;
  t.overrides = std::move(overrides);
  t.resume = resume;
  return train::run_training(t);
}

}  // namespace ration::testing
