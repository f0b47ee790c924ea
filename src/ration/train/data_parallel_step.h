// data_parallel_step.h — how a run's ranks (or one rank's micro-batches) make one training step together,
// behind the one object the training loop calls (docs/DISTRIBUTED.md).
// Owns: the data-parallel keys (read before the world is joined), the reducer and its communication hook,
//       the step over micro-batches each weighted by its share of the global batch, the stop signal every
//       rank agrees on, partial / asynchronous aggregation on the parameter server (PsExchange, with a late
//       backup worker's skipped steps), onebit's coupling to AdamW (frozen second moment, update-space
//       denominators), the fixed memory all this holds (for the plan), its checkpoint entries and its
//       report fragment.
// Does not own: the loop, the order of the data, evaluation and the checkpoint layout (trainer.cpp); the
//       reduction itself (distributed/reducer.h); the server's side (train/ps_exchange.h).
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
class Reducer;
}

namespace ration::train {

class PsExchange;

// The data-parallel keys of a run, read with the others before the world is joined.
struct DataParallelKeys {
  dist::DataParallelSettings dp;
  data::Sampling sampling = data::Sampling::Shuffle;
  bool drop_last = true;
};
DataParallelKeys read_data_parallel_keys(Config& cfg);

class DataParallelStep {
 public:
  // Checks the keys against the optimiser and (onebit with a frozen second moment) freezes AdamW's.
  DataParallelStep(const dist::World& world, const DataParallelKeys& keys, const optim::NamedParams& params,
                   optim::Optimizer& optimizer, const RunSettings& run, std::string origin);
  ~DataParallelStep();
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;

  // Steps go through this object: more than one rank, or local accumulation (dist.sync_every > 1).
  bool active() const;
  // Memory the step holds besides what the profile saw: the gradient buckets and, with onebit, the
  // residuals (error feedback) and the frozen denominators (update space), one float each per parameter.
  int64_t fixed_bytes(int64_t num_parameters) const;
  // Builds the reducer (after the profiling step, whose backward must not reach it) and, for backup
  // workers or async, the parameter-server exchange, and hooks them into `runtime`. `resumed`: the resumed
  // checkpoint's optimiser entries (the hook's residuals among them). Returns a note for the user, or "".
  std::string attach(StepRuntime& runtime, const optim::WarmupCosine& schedule, int64_t first_step,
                     const optim::NamedTensors& resumed);
  // One step of sync_every micro-batches of this rank's shard, `options(k)` the step options of
  // micro-batch k. Sets `items` to the step's items (over every rank when there is a collective). With
  // backup workers a late rank adopts the server's version: `step` moves forward and the data of the steps
  // it missed is skipped.
  StepStats step(StepRuntime& runtime, models::Model& model, data::Loader& loader, const data::Dataset& set,
                 int64_t& step, const std::function<StepOptions(uint64_t)>& options, int64_t& items);
  // The stop signal every rank agreed on after the last step (0: go on).
  int agreed_stop() const { return agreed_stop_; }
  // Partial / asynchronous aggregation: no per-step collective; the server holds the global model, rank 0
  // evaluates alone.
  bool central() const { return ps_ != nullptr; }
  // A checkpoint's entries (every rank calls it: the error-feedback residuals are gathered to rank 0).
  // `weights` / `state` get the server's global model and optimiser when central; returns whether they did.
  bool checkpoint(optim::NamedTensors& weights, optim::NamedTensors& state, optim::NamedTensors& residuals);
  // After the last step: the server's final model (central) or one averaged model (dist.aggregate =
  // "parameters") is left in the model.
  void finish(optim::Optimizer& optimizer);
  nlohmann::json report() const;  // the report's "dist"
  int64_t bucket_bytes() const;   // 0 when inactive

 private:
  class ReducerHook;
  StepStats exchange_with_server(StepStats st, SteadyClock::time_point t0, double loss_sum, int64_t samples,
                                 int64_t items, int64_t step_samples, data::Loader& loader, int64_t& step,
                                 int64_t& items_out);
  void finish_without_batch();

  dist::World world_;
  const DataParallelKeys& keys_;
  optim::NamedParams params_;
  optim::Optimizer& optimizer_;
  const RunSettings& run_;
  std::string origin_;
  std::unique_ptr<dist::Reducer> reducer_;
  std::unique_ptr<ReducerHook> reducer_hook_;
  std::unique_ptr<PsExchange> ps_;
  int agreed_stop_ = 0;
};

}  // namespace ration::train
