// seq_fixture.h — small sequence models the streaming and temporal-type tests share: built from a TOML
// [model] section, every key checked, in eval mode.
#pragma once
#include <memory>
#include <string>

#include "ration/config/config.h"
#include "ration/models/model.h"

namespace ration::testing {

inline std::unique_ptr<models::Model> build_eval_model(const std::string& toml, const std::string& origin) {
  Config cfg = Config::from_string(toml, origin);
  auto model = models::build_model(cfg);
  cfg.check_all_used();
  model->eval();
  return model;
}

inline const char* const kSeqLstm =
    "[model]\ntype = \"lstm_lm\"\nvocab_size = 11\nn_embd = 6\nhidden_size = 8\nn_layer = 2\n";
inline const char* const kSeqTcn =
    "[model]\ntype = \"tcn_lm\"\nvocab_size = 11\nn_embd = 8\nn_layer = 3\nkernel_size = 3\ndilation_growth = 2\n";

}  // namespace ration::testing
