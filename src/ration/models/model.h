// model.h — the interface the trainer, gradcheck and benchmarks use for every model family.
// Built-in families (mlp, cnn, gpt, lstm_lm) are configured from the [model] section of a Config.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ration/config/config.h"
#include "ration/core/value.h"
#include "ration/data/batch.h"
#include "ration/nn/module.h"

namespace ration::train {
class StepHook;
}

namespace ration::models {

struct EvalStats {
  double loss_sum = 0;     // summed over items
  int64_t correct = 0;     // classification: correct predictions; LMs: correct next-token guesses
  int64_t count = 0;       // items (images or tokens)
  // Binary tasks (ctr): each item's predicted probability and its label, for AUC over a whole pass.
  std::vector<float> scores;
  std::vector<float> labels;
  // Classifiers: each item's class probabilities (items x classes, row-major) and its class, for
  // combining an ensemble's members (train/evaluation.h); classes = 0 otherwise.
  std::vector<float> probabilities;
  std::vector<int64_t> targets;
  int64_t classes = 0;
};

class Model : public nn::Module {
 public:
  // Forward + mean loss on a batch (training path; records the graph when grad mode is on).
  virtual Value loss(const data::Batch& batch) = 0;
  // Forward without graph; summed loss and accuracy counts.
  virtual EvalStats evaluate(const data::Batch& batch) = 0;
  virtual std::string family() const = 0;
  // State kept outside named_parameters (parameter-server embeddings): written alongside the checkpoint
  // of `step`, restored when resuming from it, and reported as "ps.<key>" numbers.
  // `run_dir` is the checkpoint directory (holding ckpt-<step>) being written or resumed from.
  virtual void save_external_state(const std::string& run_dir, int64_t step) {}
  virtual void restore_external_state(const std::string& run_dir, int64_t step) {}
  virtual std::vector<std::pair<std::string, double>> report_metrics() { return {}; }
  // Hooks this model needs in every training step it runs in: StepRuntime calls them with its own for
  // the step (ctr pushes its rows' sparse gradients to the parameter servers after backward).
  virtual std::vector<train::StepHook*> step_hooks() { return {}; }
  // A model that fetches state per batch (ctr: rows from the parameter servers) can start fetching the
  // next step's while the current step runs: when prefetches(), the trainer takes each batch one step
  // early and hands it to prefetch() before running the current step.
  virtual bool prefetches() const { return false; }
  virtual void prefetch(const data::Batch& next) {}
  // What prefetching holds during a step beyond the step itself (which a profile of one step does not
  // see): the next batch and what is fetched for it, at most, for batches like `batch` (a bound, exact
  // in the sizes of its tensors). A memory plan leaves room for it.
  virtual int64_t prefetch_bytes(const data::Batch& batch) const { return 0; }
  // Why this model, as configured, cannot be trained by more than one data-parallel rank ("" when it
  // can): state outside named_parameters that each process would keep privately (ctr's embedded
  // parameter-server shards) would make the ranks train unrelated models.
  virtual std::string data_parallel_refusal() const { return {}; }
};

// Reads model.* keys (model.type selects the family). `input_info` keys the data side published
// (e.g. "data.vocab_size", "data.image_channels") are read from the same Config.
std::unique_ptr<Model> build_model(Config& cfg);

}  // namespace ration::models
