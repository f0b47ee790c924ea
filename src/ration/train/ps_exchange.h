// ps_exchange.h — the trainer's side of partial and asynchronous aggregation on the parameter server
// (dist.backup_workers, dist.sync = "async"; docs/DISTRIBUTED.md, "Backup workers and bounded asynchrony").
// Owns: the server's copy of the global model on rank 0 (parameters cloned from the model, its own
//       optimiser built like the run's, clipping and the learning-rate schedule: the update rule the
//       server applies), and PsExchange — each step after the reducer's finalize(): push this rank's
//       weighted gradient, receive the global parameters and copy them into the model; at the end, wait
//       for the workers and leave the final global model in the model; checkpoint snapshots and the
//       report's counts.
// Does not own: which pushes a version aggregates and when a worker may go on (distributed/ps_aggregation.h),
//       the weighted local gradient (distributed/reducer.h), the loop, data and evaluation (trainer.cpp).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "ration/distributed/ps_aggregation.h"
#include "ration/distributed/world.h"
#include "ration/optim/optimizer.h"
#include "ration/optim/schedule.h"
#include "ration/train/trainer.h"

namespace ration::train {

class PsExchange {
 public:
  // Every rank calls it at the same point (it opens the parameter server's own channel). `params`: the
  // model's trainable parameters (their order is the flat layout); `local`: the run's optimiser, whose
  // state the server's optimiser starts from (rank 0); `first_version`: the step the run starts at.
  PsExchange(const dist::World& world, const dist::PsAggregationOptions& options, const optim::NamedParams& params,
             const RunSettings& run, const optim::Optimizer& local, const optim::WarmupCosine& schedule,
             int64_t first_version);
  ~PsExchange();

  // After the reducer's finalize() (every param.grad holds this rank's share-weighted gradient of the
  // step): push it, wait for the reply, copy the parameters it brings into the model.
  dist::Reply exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal);
  // After this rank's last step. Workers tell the server; rank 0 waits for every worker, then copies the
  // final global parameters into the model and the server optimiser's state into `local`.
  void finish(optim::Optimizer& local);
  // Rank 0: the global model and its optimiser state, as a checkpoint holds them (copies).
  void snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state);
  // The report's counts: rank 0 the server's (per rank), a worker its own.
  nlohmann::json report();

 private:
  class Server;
  at::Tensor pack_gradients() const;
  void unpack_parameters(const at::Tensor& flat);

  dist::World channel_;
  dist::PsAggregationOptions options_;
  optim::NamedParams params_;
  int64_t numel_ = 0;
  int64_t version_ = 0;
  at::Tensor received_;  // (numel) the parameters of the last reply
  std::unique_ptr<Server> server_;                     // rank 0
  std::shared_ptr<dist::PsAggregator> aggregator_;     // rank 0
  std::unique_ptr<dist::PsServerLinks> links_;         // rank 0, destroyed before server_
  std::unique_ptr<dist::PsClient> client_;             // workers
  int64_t pushes_ = 0, dropped_ = 0;
};

}  // namespace ration::train
