// tbptt.h — truncated backpropagation through time as a piecewise training step (docs/METHODS.md,
// "Temporal-dependency buffers for sequence models", "Training with long sequences").
// Owns: ChunkedLoss, the train::PiecewiseLoss that cuts a language-model batch (B, T) into chunks of C
//       steps run through a StreamExecutor (state and the last L inputs of every layer carry across
//       chunks as data, so gradients stop at chunk boundaries), each chunk's loss weighted to its share of
//       the sequence's mean; the check that a model may train this way (train.tbptt).
// Does not own: the step itself (train::StepRuntime runs the pieces, backward and the update), the chunk
//       loop of inference (streaming/stream_executor.h), any model's maths.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ration/models/model.h"
#include "ration/streaming/stream_executor.h"
#include "ration/runtime/step_runtime.h"

namespace ration::seq {

// Throws ration::Error (naming `origin`, the key train.tbptt, the model type and, for a type-3 layer, the
// layer) unless `model` can train with truncated BPTT chunks of `chunk` steps.
void check_tbptt(models::Model& model, int64_t chunk, const std::string& origin);

class ChunkedLoss : public train::PiecewiseLoss {
 public:
  // `model` must stay alive while the loss is used; check_tbptt's errors on a model that cannot stream.
  ChunkedLoss(models::Model& model, int64_t chunk);
  // A new sequence: the buffers start empty (every batch is a fresh window of the text).
  int64_t begin(models::Model& model, const data::Batch& batch) override;
  // Chunk `piece`: mean cross entropy over its B n tokens times n / T (exactly the mean when n = T).
  Value piece_loss(int64_t piece) override;

 private:
  models::Model& model_;
  int64_t chunk_;
  std::unique_ptr<StreamExecutor> executor_;  // rebuilt when the batch size changes
  at::Tensor inputs_, targets_;               // this step's (B, T), on the model's device
};

}  // namespace ration::seq
