// families.h — the two shapes of task the built-in models solve, with their shared loss/evaluate.
// Owns: Classifier (images (B, C, H, W) -> logits (B, K), labels (B)) and LanguageModel (tokens (B, T)
//       -> logits (B, T, V), next tokens (B, T)): mean cross entropy for loss(), summed loss plus
//       correct-count for evaluate(), and moving batch tensors to the parameters' device/dtype.
// Does not own: any architecture (mlp.h, cnn.h, gpt.h, lstm_lm.h) or the train/eval mode (the caller's).
#pragma once
#include "ration/models/model.h"

namespace ration::models {

class Classifier : public Model {
 public:
  // images (B, C, H, W) floating -> logits (B, K).
  virtual Value logits(const Value& images) = 0;
  Value loss(const data::Batch& batch) override;
  EvalStats evaluate(const data::Batch& batch) override;
  Value model_input(const data::Batch& batch) override;  // the images, on the parameters' device and dtype
  Value output_loss(const Value& logits, const data::Batch& batch) override;
  EvalStats output_evaluate(const Value& logits, const data::Batch& batch) override;
};

class LanguageModel : public Model {
 public:
  // tokens (B, T) int64 -> logits (B, T, V).
  virtual Value logits(const Value& tokens) = 0;
  // Tokens must lie in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  Value loss(const data::Batch& batch) override;
  EvalStats evaluate(const data::Batch& batch) override;
  Value model_input(const data::Batch& batch) override;  // the tokens (B, T)
  Value output_loss(const Value& logits, const data::Batch& batch) override;
  EvalStats output_evaluate(const Value& logits, const data::Batch& batch) override;
};

// Batch tensors are data, not graph values: floating inputs take the parameters' dtype, everything
// takes their device (so a float32 loader can feed a float64 or GPU model).
Value to_model(const Value& v, const nn::Module& model);

// Reads an integer the data side may have published ("data.vocab_size"): its value if present, else `def`.
int64_t published_int(Config& cfg, const std::string& key, int64_t def);

}  // namespace ration::models
