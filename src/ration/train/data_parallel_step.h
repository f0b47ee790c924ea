// data_parallel_step.h — how a run's ranks (or one rank's micro-batches) make one training step together,
// behind the one object the training loop calls (docs/DISTRIBUTED.md).
// Owns: the data-parallel keys (read before the world is joined), the reducer and the run's aggregator
//       (made by distributed/aggregator_factory.h from the keys), the step over micro-batches each weighted
//       by its share of the global batch, the stop signal every rank agrees on, a server's step in place of
//       the optimiser's (with a late rank's skipped data), the fixed memory all this holds (for the plan),
//       its checkpoint entries and its report fragment.
// Does not own: the loop, the order of the data, evaluation and the checkpoint layout (trainer.cpp); the
//       bucketing (distributed/reducer.h); what travels and what happens around the optimiser step (the
//       aggregators, distributed/aggregator.h).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ration/base/timing.h"
#include "ration/config/config.h"
#include "ration/data/dataset.h"
#include "ration/distributed/data_parallel.h"
#include "ration/distributed/world.h"
#include "ration/models/model.h"
#include "ration/optim/optimizer.h"
#include "ration/optim/schedule.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

namespace ration::dist {
class Aggregator;
struct AggregatorContext;
class Kfac;
class Reducer;
}

namespace ration::train {

class EsStep;

// The data-parallel keys of a run, read with the others before the world is joined.
struct DataParallelKeys {
  dist::DataParallelSettings dp;
  data::Sampling sampling = data::Sampling::Shuffle;
  bool drop_last = true;
  // Each rank trains a member of its own on its own bootstrap sample of the whole set (no shards, its own
  // seed); evaluation combines the members' predictions (the aggregator's traits).
  bool members = false;
};
DataParallelKeys read_data_parallel_keys(Config& cfg);

class DataParallelStep {
 public:
  // Makes the run's aggregator (which checks the keys against the optimiser); on a dedicated parameter
  // server (roles.server >= 0) nothing: serve() is all it does.
  DataParallelStep(const dist::JobRoles& roles, const DataParallelKeys& keys, const optim::NamedParams& params,
                   optim::Optimizer& optimizer, const RunSettings& run, uint64_t seed, std::string origin);
  ~DataParallelStep();
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;

  // Steps go through this object: more than one rank, or local accumulation (dist.sync_every > 1).
  bool active() const;
  // Memory the step holds besides what the profile saw: the gradient buckets and the aggregator's state
  // (onebit's residuals and denominators, one float each per parameter).
  int64_t fixed_bytes(int64_t num_parameters) const;
  // Builds the reducer (after the profiling step, whose backward must not reach it), attaches the
  // aggregator and hooks them into `runtime`. `resumed`: the resumed checkpoint's optimiser entries (the
  // aggregator's state among them). Returns a note for the user, or "".
  std::string attach(StepRuntime& runtime, const optim::WarmupCosine& schedule, int64_t first_step,
                     const optim::NamedTensors& resumed);
  // One step of sync_every micro-batches of this rank's shard, `options(k)` the step options of
  // micro-batch k. Sets `items` to the step's items (over every rank when there is a collective). With
  // a server that moved on (backup workers) a late rank adopts its version: `step` moves forward and the
  // data of the steps it missed is skipped.
  StepStats step(StepRuntime& runtime, models::Model& model, data::Loader& loader, const data::Dataset& set,
                 int64_t& step, const std::function<StepOptions(uint64_t)>& options, int64_t& items);
  // The stop signal every rank agreed on after the last step (0: go on).
  int agreed_stop() const { return agreed_stop_; }
  // The global model lives on a server (partial / asynchronous aggregation): no per-step collective, rank
  // 0 evaluates alone.
  bool central() const;
  // A checkpoint's entries (every rank calls it: the aggregator's state, e.g. onebit's residuals, is
  // gathered to rank 0).
  // `weights` / `state` get the server's global model and optimiser when central; returns whether they did.
  bool checkpoint(optim::NamedTensors& weights, optim::NamedTensors& state, optim::NamedTensors& residuals);
  // After the last step: the aggregator leaves the run's final model in the model (the server's, one
  // averaged model, ...).
  void finish();
  nlohmann::json report() const;  // the report's "dist"
  // A dedicated parameter server (dist.servers): serves its share of the parameters until every worker has
  // finished; returns its report.
  nlohmann::json serve(const optim::WarmupCosine& schedule, int64_t first_step, const optim::NamedTensors& resumed);
  int64_t bucket_bytes() const;   // 0 when inactive

 private:
  class ReducerHook;
  StepStats exchange_with_server(StepStats st, SteadyClock::time_point t0, double loss_sum, int64_t samples,
                                 int64_t items, double share, data::Loader& loader, int64_t& step,
                                 int64_t& items_out);
  double rank_share(int64_t my_samples, int64_t step_samples) const;
  dist::Aggregator& aggregator() const { return *aggregator_; }
  void finish_without_batch();
  bool evolution_strategies() const { return run_.optimizer == "es"; }
  bool natural_gradient() const { return run_.optimizer == "kfac"; }
  StepStats es_step(models::Model& model, data::Loader& loader, const data::Dataset& set, int64_t step,
                    int64_t& items_out);
  // The step's loss sums and stop requests, agreed by every rank (one all-reduce of five doubles).
  StepStats agree(StepStats st, double loss_sum, int64_t samples, int64_t items, int64_t& items_out);

  dist::AggregatorContext make_context(const optim::WarmupCosine& schedule, int64_t first_step,
                                       const optim::NamedTensors& resumed);

  dist::World world_;     // the workers
  dist::World everyone_;  // the whole job (the workers, then any dedicated servers)
  int server_ = -1;       // a dedicated server's index, or -1
  const DataParallelKeys& keys_;
  optim::NamedParams params_;
  optim::Optimizer& optimizer_;
  const RunSettings& run_;
  uint64_t seed_;  // train.seed (evolution strategies' shared noise)
  std::string origin_;
  std::unique_ptr<dist::Aggregator> owned_aggregator_;  // until attach() hands it to the reducer
  dist::Aggregator* aggregator_ = nullptr;
  std::unique_ptr<dist::Reducer> reducer_;
  std::unique_ptr<ReducerHook> reducer_hook_;
  std::unique_ptr<EsStep> es_;  // optim.name = "es": forward-only steps, losses all-reduced
  class KfacHook;
  std::unique_ptr<dist::Kfac> kfac_;  // optim.name = "kfac": natural gradients before the optimiser
  std::unique_ptr<KfacHook> kfac_hook_;
  int agreed_stop_ = 0;
};

}  // namespace ration::train
