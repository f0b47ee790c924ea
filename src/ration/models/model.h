// model.h — the interface the trainer, gradcheck and benchmarks use for every model family.
// Built-in families (mlp, cnn, gpt, lstm_lm) are configured from the [model] section of a Config.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ration/config/config.h"
#include "ration/core/value.h"
#include "ration/data/batch.h"
#include "ration/nn/module.h"

namespace ration::models {

struct EvalStats {
  double loss_sum = 0;     // summed over items
  int64_t correct = 0;     // classification: correct predictions; LMs: correct next-token guesses
  int64_t count = 0;       // items (images or tokens)
};

class Model : public nn::Module {
 public:
  // Forward + mean loss on a batch (training path; records the graph when grad mode is on).
  virtual Value loss(const data::Batch& batch) = 0;
  // Forward without graph; summed loss and accuracy counts.
  virtual EvalStats evaluate(const data::Batch& batch) = 0;
  virtual std::string family() const = 0;
};

// Reads model.* keys (model.type selects the family). `input_info` keys the data side published
// (e.g. "data.vocab_size", "data.image_channels") are read from the same Config.
std::unique_ptr<Model> build_model(Config& cfg);

}  // namespace ration::models
