// model.cpp — build_model (the model.type factory) and the shared loss/evaluate of families.h.
// Owns: choosing the family from model.type and the cross-entropy bookkeeping for classification and
//       language modelling. Does not own any architecture (mlp.cpp, cnn.cpp, gpt.cpp, lstm_lm.cpp).
#include "ration/models/model.h"

#include <string>
#include <vector>

#include "ration/base/check.h"
#include "ration/models/cnn.h"
#include "ration/models/ctr.h"
#include "ration/models/families.h"
#include "ration/models/gpt.h"
#include "ration/models/birnn_tagger.h"
#include "ration/models/lstm_lm.h"
#include "ration/models/mlp.h"
#include "ration/models/tcn_lm.h"
#include "ration/models/torchscript.h"
#include "ration/ops/ops.h"

namespace ration::models {

Value to_model(const Value& v, const nn::Module& model) {
  const at::TensorOptions p = model.parameter_options();
  const at::Tensor& t = v.tensor();
  at::Tensor moved = at::isFloatingType(t.scalar_type()) ? t.to(p.device(), p.dtype().toScalarType())
                                                         : t.to(p.device());
  if (moved.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return v;
  return Value(moved);
}

int64_t published_int(Config& cfg, const std::string& key, int64_t def) {
  return cfg.has(key) ? cfg.get_int(key, def) : def;
}

// ---- classification -------------------------------------------------------------------------------
namespace {

struct ClassBatch {
  Value images;  // (B, C, H, W)
  Value labels;  // (B)
};

ClassBatch class_batch(const data::Batch& batch, const nn::Module& model) {
  RATION_CHECK(batch.input.defined() && batch.target.defined(), "classification batch without input or target");
  RATION_CHECK(at::isFloatingType(batch.input.dtype()), "classification input must be floating images (B, C, H, W); got ",
               batch.input.dtype(), " ", batch.input.sizes(), " (is this a language-model dataset?)");
  RATION_CHECK(batch.target.dim() == 1 && batch.target.dtype() == at::kLong &&
                   batch.target.size(0) == batch.input.size(0),
               "classification target must be int64 labels (B) for input ", batch.input.sizes(), "; got ",
               batch.target.dtype(), " ", batch.target.sizes());
  return {to_model(batch.input, model), to_model(batch.target, model)};
}

struct TokenBatch {
  Value tokens;   // (B, T)
  Value targets;  // (B*T)
};

TokenBatch token_batch(const data::Batch& batch, const nn::Module& model) {
  RATION_CHECK(batch.input.defined() && batch.target.defined(), "language-model batch without input or target");
  RATION_CHECK(batch.input.dim() == 2 && batch.input.dtype() == at::kLong,
               "language-model input must be int64 tokens (B, T); got ", batch.input.dtype(), " ",
               batch.input.sizes(), " (is this an image dataset?)");
  RATION_CHECK(batch.target.dtype() == at::kLong && batch.target.sizes() == batch.input.sizes(),
               "language-model target must be int64 (B, T) like the input ", batch.input.sizes(), "; got ",
               batch.target.dtype(), " ", batch.target.sizes());
  Value targets = to_model(batch.target, model);
  return {to_model(batch.input, model), Value(targets.tensor().reshape({-1}))};
}

// (B, T, V) -> (B*T, V)
Value flat_logits(const Value& logits) { return ops::reshape(logits, {-1, logits.size(-1)}); }

EvalStats stats_of(const Value& logits, const Value& targets, const Value& mean_loss) {
  EvalStats s;
  s.count = targets.numel();
  s.loss_sum = mean_loss.item() * static_cast<double>(s.count);
  s.correct = logits.tensor().argmax(-1).eq(targets.tensor()).sum().item<int64_t>();
  return s;
}

}  // namespace

Value Classifier::loss(const data::Batch& batch) { return output_loss(logits(model_input(batch)), batch); }

EvalStats Classifier::evaluate(const data::Batch& batch) {
  NoGradGuard no_grad;
  return output_evaluate(logits(model_input(batch)), batch);
}

Value Classifier::model_input(const data::Batch& batch) { return class_batch(batch, *this).images; }

Value Classifier::output_loss(const Value& output, const data::Batch& batch) {
  return ops::cross_entropy(output, class_batch(batch, *this).labels);
}

EvalStats Classifier::output_evaluate(const Value& lg, const data::Batch& batch) {
  NoGradGuard no_grad;
  ClassBatch b = class_batch(batch, *this);  // lg: (B, K)
  EvalStats s = stats_of(lg, b.labels, ops::cross_entropy(lg, b.labels));
  const at::Tensor p = lg.tensor().softmax(-1).to(at::kCPU, at::kFloat).contiguous();  // (B, K)
  const at::Tensor t = b.labels.tensor().to(at::kCPU, at::kLong).contiguous();          // (B)
  s.classes = p.size(1);
  s.probabilities.assign(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  s.targets.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  return s;
}

Value LanguageModel::loss(const data::Batch& batch) { return output_loss(logits(model_input(batch)), batch); }

EvalStats LanguageModel::evaluate(const data::Batch& batch) {
  NoGradGuard no_grad;
  return output_evaluate(logits(model_input(batch)), batch);
}

Value LanguageModel::model_input(const data::Batch& batch) { return token_batch(batch, *this).tokens; }

Value LanguageModel::output_loss(const Value& output, const data::Batch& batch) {
  return ops::cross_entropy(flat_logits(output), token_batch(batch, *this).targets);
}

EvalStats LanguageModel::output_evaluate(const Value& output, const data::Batch& batch) {
  NoGradGuard no_grad;
  Value lg = flat_logits(output);  // (B*T, V)
  const Value targets = token_batch(batch, *this).targets;
  return stats_of(lg, targets, ops::cross_entropy(lg, targets));
}

// ---- model parallelism: what a model without these forms says ----------------------------------------
Value Model::pipeline_unit(int64_t unit, const Value&) {
  RATION_CHECK(false, "model ", family(), " has no pipeline unit ", unit, " (it has ", pipeline_units(), ")");
  return {};
}

std::string Model::pipeline_unit_name(int64_t unit) const { return "unit " + std::to_string(unit); }

Value Model::model_input(const data::Batch& batch) { return batch.input; }

Value Model::output_loss(const Value&, const data::Batch&) {
  RATION_CHECK(false, "model ", family(), " has no loss of its output alone (it cannot be split into pipeline stages)");
  return {};
}

EvalStats Model::output_evaluate(const Value&, const data::Batch&) {
  RATION_CHECK(false, "model ", family(), " has no evaluation of its output alone (it cannot be split into pipeline stages)");
  return {};
}

std::string Model::shard_tensor_parallel(const dist::World&) {
  return "model.type = \"" + family() + "\" has no tensor-parallel form (parallel.tensor splits gpt's transformer blocks)";
}

std::string Model::split_features(const dist::World&) {
  return "model.type = \"" + family() + "\" has no tables to place on the ranks (the ctr model's embedding tables "
         "can be); remove parallel.features or set it to \"none\"";
}

// ---- factory --------------------------------------------------------------------------------------
std::unique_ptr<Model> build_model(Config& cfg) {
  RATION_CHECK(cfg.has("model.type"), cfg.origin(), ": no model.type; hint: add a [model] section with type = ",
               "\"mlp\", \"cnn\", \"gpt\", \"lstm_lm\", \"tcn_lm\", \"birnn_tagger\", \"ctr\" or \"torchscript\" (or --set model.type=gpt)");
  const std::string type = cfg.get_string("model.type", "mlp");
  // Sizes are checked against the machine as the parameters are allocated (base/allocator.h); the
  // error then names this config.
  auto named = [&](auto&& build) -> std::unique_ptr<Model> {
    try {
      return build();
    } catch (const Error& e) {
      const std::string ours = cfg.origin() + ": ";  // said once, not twice
      const std::string inner = e.message().rfind(ours, 0) == 0 ? e.message().substr(ours.size()) : e.message();
      RATION_CHECK(false, ours, "building the ", type, " model: ", inner);
    }
    return nullptr;
  };
  if (type == "mlp") return named([&] { return std::make_unique<MLP>(MLPOptions::from_config(cfg)); });
  if (type == "cnn") return named([&] { return std::make_unique<CNN>(CNNOptions::from_config(cfg)); });
  if (type == "gpt") return named([&] { return std::make_unique<GPT>(GPTOptions::from_config(cfg)); });
  if (type == "lstm_lm") return named([&] { return std::make_unique<LSTMLM>(LSTMLMOptions::from_config(cfg)); });
  if (type == "tcn_lm") return named([&] { return std::make_unique<TCNLM>(TCNLMOptions::from_config(cfg)); });
  if (type == "birnn_tagger")
    return named([&] { return std::make_unique<BiRNNTagger>(BiRNNTaggerOptions::from_config(cfg)); });
  if (type == "ctr") return named([&] { return std::make_unique<Ctr>(CtrOptions::from_config(cfg)); });
  if (type == "torchscript")
    return named([&] { return std::make_unique<TorchScriptModel>(TorchScriptOptions::from_config(cfg)); });
  RATION_CHECK(false, "unknown model.type '", type, "' in ", cfg.origin(),
               "; valid types: mlp, cnn, gpt, lstm_lm, tcn_lm, birnn_tagger, ctr, torchscript (set [model] type = \"gpt\" or --set model.type=gpt)");
  return nullptr;
}

}  // namespace ration::models
