// tbptt.cpp — see tbptt.h.
#include "ration/streaming/tbptt.h"

#include "ration/base/check.h"
#include "ration/models/families.h"
#include "ration/seq/dependency.h"
#include "ration/seq/streamable.h"

namespace ration::seq {

void check_tbptt(models::Model& model, int64_t chunk, const std::string& origin) {
  RATION_CHECK(chunk >= 1, origin, ": train.tbptt must be a chunk length >= 1 (time steps per truncated-BPTT ",
               "chunk; leave it out for full backpropagation through time); got ", chunk);
  auto* streamable = dynamic_cast<Streamable*>(&model);
  RATION_CHECK(streamable != nullptr && dynamic_cast<models::LanguageModel*>(&model) != nullptr, origin,
               ": train.tbptt needs a sequence model that carries state across chunks (lstm_lm, tcn_lm, or gpt ",
               "with model.attention_window > 0); model.type '", model.family(), "' does not");
  const std::vector<LayerDependency> layers = streamable->sequence_layers();
  const std::string whole = plan_sequence(layers, 1, 1, 4).whole_sequence_layer();
  RATION_CHECK(whole.empty(), origin, ": train.tbptt cannot cut model.type '", model.family(), "' into chunks: layer '",
               whole, "' depends on the whole sequence (type 3; e.g. full attention: set model.attention_window ",
               "= L > 0, or remove train.tbptt)");
}

ChunkedLoss::ChunkedLoss(models::Model& model, int64_t chunk) : model_(model), chunk_(chunk) {
  check_tbptt(model, chunk, "truncated BPTT");
}

int64_t ChunkedLoss::begin(models::Model& model, const data::Batch& batch) {
  RATION_CHECK(&model == &model_, "ChunkedLoss::begin: a step of another model than the one it was built for");
  RATION_CHECK(batch.input.defined() && batch.input.dim() == 2 && batch.input.dtype() == at::kLong &&
                   batch.target.defined() && batch.target.sizes() == batch.input.sizes() &&
                   batch.target.dtype() == at::kLong,
               "train.tbptt needs language-model batches: int64 tokens (B, T) and targets of the same shape; got ",
               batch.input.sizes(), " and ", batch.target.sizes());
  inputs_ = models::to_model(batch.input, model_).tensor();
  targets_ = models::to_model(batch.target, model_).tensor();
  const int64_t B = inputs_.size(0), T = inputs_.size(1);
  if (!executor_ || executor_->buffers().batch() != B) executor_ = std::make_unique<StreamExecutor>(model_, chunk_, B);
  executor_->reset();
  return (T + chunk_ - 1) / chunk_;
}

Value ChunkedLoss::piece_loss(int64_t piece) {
  const int64_t T = inputs_.size(1), start = piece * chunk_;
  RATION_CHECK(piece >= 0 && start < T, "ChunkedLoss: chunk ", piece, " is past the sequence (T = ", T, ")");
  RATION_CHECK(executor_->position() == start, "ChunkedLoss: chunks must run in order; chunk ", piece,
               " asked at position ", executor_->position());
  return chunk_loss(*executor_, inputs_, targets_, start, std::min(chunk_, T - start));
}

}  // namespace ration::seq
