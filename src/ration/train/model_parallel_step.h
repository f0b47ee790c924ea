// model_parallel_step.h — one training step of a model split over processes (docs/DISTRIBUTED.md, "Model
// and hybrid parallelism"): pipeline stages streaming micro-batches (1F1B or GPipe), tensor-parallel
// shards and feature-split tables (inside the model's own layers), and data-parallel replicas of all of it.
// Owns: splitting the model at start-up (the pipeline's units balanced from a measured profile, the
//       memory of parameters held elsewhere released; Model::shard_tensor_parallel, Model::split_features),
//       the pipeline schedule and its point-to-point traffic, the memory plan of a stage (one micro-batch
//       planned for the micro-batches the stage holds in flight), the step's gradient exchange (a tied
//       weight's two stages, the replicas' average), the global gradient norm and the optimiser step,
//       pipelined evaluation, and the report's "parallel".
// Does not own: the process groups (distributed/parallel_layout.h), the loop, checkpoints and the data
//       (trainer.cpp), one micro-batch's memory runtime (runtime/step_runtime.h).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ration/data/batch.h"
#include "ration/distributed/parallel_layout.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"
#include "ration/runtime/step_runtime.h"

namespace ration::train {

// The pipeline's split: stage s runs units [first_unit[s], first_unit[s + 1]).
struct PipelineSplit {
  std::vector<int64_t> first_unit;           // P + 1 boundaries
  std::vector<std::string> unit_names;
  std::vector<double> unit_ms;               // measured forward + backward of one micro-batch, per unit
  std::vector<int64_t> unit_saved_bytes;     // measured saved activations of one micro-batch, per unit
  std::vector<int64_t> unit_param_bytes;
  std::vector<std::vector<int64_t>> unit_output_sizes;  // each unit's output shape for one micro-batch
  bool from_checkpoint = false;              // a resumed run's saved split, not parallel.split's
  int64_t stages() const { return static_cast<int64_t>(first_unit.size()) - 1; }
  double stage_ms(int64_t s) const;
  int64_t stage_bytes(int64_t s) const;      // parameters and one micro-batch's saved activations
  nlohmann::json to_json() const;
};

// Balanced split of `units` measured costs into `stages` consecutive ranges: minimises the largest stage's
// share of time or memory (whichever is larger). Every stage gets at least one unit.
std::vector<int64_t> balance_units(const std::vector<double>& unit_ms, const std::vector<int64_t>& unit_bytes,
                                   int64_t stages);

// The micro-batch `index` of `count` equal pieces of `batch` (along its first dimension).
data::Batch micro_batch(const data::Batch& batch, int64_t index, int64_t count);

class ModelParallelStep {
 public:
  // Splits `model` over `groups` as `settings` ask: tensor shards first, then the pipeline's units,
  // balanced from a profile of one micro-batch of `first_batch` (every rank measures; the times are
  // averaged so every rank computes the same split). Throws before training when the model cannot be
  // split so (naming the model, the key and what it has).
  // `first_unit`, when not empty, is the split to use (a resumed run's: PipelineSplit::first_unit).
  ModelParallelStep(const dist::ParallelSettings& settings, dist::ParallelGroups groups, models::Model& model,
                    const data::Batch& first_batch, uint64_t seed, const std::string& origin,
                    const std::vector<int64_t>& first_unit = {});
  ~ModelParallelStep();

  // The parameters this rank holds and updates (its stage's; its shards).
  const optim::NamedParams& parameters() const { return params_; }
  const dist::ParallelGroups& groups() const { return groups_; }
  // Weights the first and the last pipeline stage both hold (gpt's tied embedding and lm head).
  const std::vector<std::string>& tied() const { return tied_; }
  const PipelineSplit& split() const { return split_; }
  // With a budget in `runtime`'s settings: profile one micro-batch of this stage and plan it for the
  // micro-batches the stage holds in flight (their held activations are fixed memory of the plan).
  const memory::Plan* prepare(StepRuntime& runtime, const data::Batch& batch, optim::Optimizer* optimizer,
                              uint64_t seed);
  // One step: forward and backward of every micro-batch on this stage, the gradient exchange, the clip
  // to options.clip_grad_norm over every rank's gradients, and options.optimizer's update. The loss is
  // the global batch's, on every rank.
  StepStats step(StepRuntime& runtime, const data::Batch& batch, const StepOptions& options);
  // A model whose evaluate() runs the batch through the pipeline (every stage returns the last stage's
  // counts); the model itself without a pipeline.
  models::Model& eval_model();
  // Micro-batches this stage holds between forward and backward at most.
  int64_t in_flight() const;
  // After the last step, on every rank: every rank's budget, predicted and measured peak, gathered for
  // the report (its "parallel.memory"; a collective).
  void gather_memory(int64_t measured_peak_bytes, const memory::Plan* plan);
  nlohmann::json report() const;

 private:
  class Pipeline;
  class EvalModel;
  void split_pipeline(const data::Batch& first_batch, uint64_t seed, const std::vector<int64_t>& first_unit);
  void release_other_stages();
  void exchange_gradients();
  double clip(double max_norm);
  double agree_loss(double local_loss_sum) const;

  dist::ParallelSettings settings_;
  dist::ParallelGroups groups_;
  models::Model& model_;
  std::string origin_;
  PipelineSplit split_;
  optim::NamedParams params_;
  std::vector<std::string> tied_;     // parameters the first and the last stage both hold
  std::vector<bool> counted_;         // per params_: counted in the global norm by this rank
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<EvalModel> eval_model_;
  int64_t planned_in_flight_bytes_ = 0;  // the plan's fixed memory for the other micro-batches in flight
  double comm_wait_ms_ = 0, step_ms_ = 0;  // summed over steps: blocked on a neighbour stage, whole steps
  double compute_ms_ = 0, schedule_ms_ = 0;  // summed over steps: micro-batches' forward and backward, the
                                             // step up to its gradients exchanged (a pipeline's)
  double idle_fraction() const { return schedule_ms_ > 0 ? std::max(0.0, 1.0 - compute_ms_ / schedule_ms_) : 0.0; }
  int64_t steps_ = 0;
  int64_t sent_bytes_ = 0;  // point-to-point and all-reduce payload this process sent, summed over steps
  nlohmann::json memory_ = nlohmann::json::array();  // gather_memory's
};

}  // namespace ration::train
