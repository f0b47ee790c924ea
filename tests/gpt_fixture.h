// gpt_fixture.h — a two-layer gpt with dropout and one batch of tokens, shared by the step-runtime and
// speed tests. Owns nothing else.
#pragma once

#include <memory>

#include "ration/config/config.h"
#include "ration/core/value.h"
#include "ration/data/batch.h"
#include "ration/models/model.h"

namespace ration::testing {

inline std::unique_ptr<models::Model> small_gpt() {
  Config cfg = Config::from_string("[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=32\nblock_size=16\ndropout=0.1\n",
                                   "gpt.toml");
  at::manual_seed(3);
  auto model = models::build_model(cfg);
  model->train();
  return model;
}

inline data::Batch token_batch() {
  at::manual_seed(5);
  at::Tensor tokens = at::randint(0, 256, {4, 17}, at::kLong);
  data::Batch b;
  b.input = Value(tokens.slice(1, 0, 16).contiguous());
  b.target = Value(tokens.slice(1, 1, 17).contiguous());
  b.items = 64;
  return b;
}

}  // namespace ration::testing
