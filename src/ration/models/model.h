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
namespace ration::dist {
class World;
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
  // What another batch of the same size may hold beyond `batch` (the profiled one) where the step's sizes
  // depend on the data (ctr: rows pulled per distinct id, and their gradients), at most. A memory plan
  // leaves room for it, so the budget holds for every batch, not only the profiled one.
  virtual int64_t batch_variation_bytes(const data::Batch& batch) const { return 0; }
  // Why this model, as configured, cannot be trained by more than one data-parallel rank ("" when it
  // can): state outside named_parameters that each process would keep privately (ctr's embedded
  // parameter-server shards) would make the ranks train unrelated models.
  virtual std::string data_parallel_refusal() const { return {}; }

  // ---- model parallelism (train/model_parallel_step.h; docs/DISTRIBUTED.md, "Model and hybrid parallelism")
  // Pipeline: a model that is a sequence of units, each a group of consecutive layers, can be split into
  // stages of consecutive units. Unit 0 takes model_input(batch); unit i > 0 the output of unit i - 1; the
  // last unit's output goes to output_loss / output_evaluate. 0 units: the model cannot be split.
  virtual int64_t pipeline_units() const { return 0; }
  virtual Value pipeline_unit(int64_t unit, const Value& x);
  // The unit's name ("embedding", "blocks.3", "head") and the top-level modules whose parameters it uses
  // (a weight two units use, e.g. a tied embedding and lm head, is listed by both).
  virtual std::string pipeline_unit_name(int64_t unit) const;
  virtual std::vector<std::string> pipeline_unit_modules(int64_t unit) const { return {}; }
  // The batch's input as unit 0 takes it; the mean loss and the evaluation counts from the last unit's
  // output (what loss() and evaluate() compute from it).
  virtual Value model_input(const data::Batch& batch);
  virtual Value output_loss(const Value& output, const data::Batch& batch);
  virtual EvalStats output_evaluate(const Value& output, const data::Batch& batch);
  // Tensor parallelism: replace the layers that have a tensor-parallel form by their shards over `group`
  // (rank r of T keeps the r-th slice of the weights the model was built with, so the T processes compute
  // what this one did). Returns "" when done, else why this model cannot be split that way.
  virtual std::string shard_tensor_parallel(const dist::World& group);
  // The dimension along which parameter `name` is split over the tensor-parallel group (the shards in
  // rank order, concatenated along it, give the whole weight: how checkpoints merge), or -1 when every
  // rank of the group holds it whole (counted once in the global gradient norm).
  virtual int64_t tensor_split_dim(const std::string& name) const { return -1; }
  // How many equal parts along that dimension are split separately (gpt's fused attn.qkv: 3, q, k and v
  // each split by heads): the merge is dist::merge_tensor_shards(shards, dim, parts)
  // (distributed/tensor_parallel_block.h). 1 for a plain split.
  virtual int64_t tensor_split_parts(const std::string& name) const { return 1; }
  // Feature split (ctr): place the embedding tables whole on the ranks of `group` and route lookups to
  // their owners. Returns "" when done, else why this model cannot.
  virtual std::string split_features(const dist::World& group);
  // An evaluation rank whose shard of a batch is empty calls this instead of evaluate(): a model whose
  // evaluate() runs collectives over its ranks (the feature split's all-to-all) joins them with nothing
  // of its own, so every rank takes part in every batch's collectives in lockstep.
  virtual void evaluate_nothing() {}
  // The memory runtime profiled a step (forward and backward, no step hooks, no optimiser): drop what
  // that step left for its hooks (ctr: the pulled rows and their gradients, kept until pushed), so the
  // first training step does not hold them beside its own.
  virtual void discard_step() {}
};

// Reads model.* keys (model.type selects the family). `input_info` keys the data side published
// (e.g. "data.vocab_size", "data.image_channels") are read from the same Config.
std::unique_ptr<Model> build_model(Config& cfg);

}  // namespace ration::models
