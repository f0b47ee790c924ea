// ps_aggregation.h — partial and asynchronous aggregation on the parameter-server topology: synchronous
// rounds with backup workers (each round aggregates the first N-k gradients to arrive, the late ones are
// dropped) and bounded-asynchronous pushes (each push applied as it arrives; no worker runs more than s
// versions ahead of the slowest). See docs/DISTRIBUTED.md, "Backup workers and bounded asynchrony", and
// docs/METHODS.md, "Distributed training (M4)", aggregation.
// Owns: the server's rule (PsAggregator: which pushes a version aggregates, with which weights, when a
//       worker may go on, what is dropped), its counts (pushes, included, dropped per rank, staleness,
//       how far ahead workers ran), and the wire protocol between rank 0 and the workers over a channel
//       of their own (PsServerLinks: one receiving thread per worker on rank 0; PsClient: a worker's
//       push-and-pull).
// Does not own: the update itself (ServerModel: the caller's copy of the global model and its
//       optimiser), the weighted local gradient (distributed/reducer.h), the synchronous parameter server
//       (distributed/topology.h), the training loop (train/trainer.cpp).
//
// Versions: the server's model starts at version v0 (the step it was built at) and each optimiser step
// it takes adds one. A worker's push names the version its gradient was computed on (base_version).
//   BackupWorkers (k): version v's round collects pushes with base_version v; when N-k have arrived it
//     applies (sum of their weighted gradients in rank order) / (sum of their sample shares), steps, and
//     answers them with version v+1. A push whose round has closed is dropped (counted) and answered at
//     once with the current version: the late worker adopts it and goes on from there.
//   BoundedAsync (s): pushes are kept pending; a worker's push is answered once it is at most s pushes
//     ahead of the slowest worker still training (pushes_r - min_active pushes <= s). Before answering,
//     the server applies every pending push (summed in (step, rank) order, one optimiser step at the
//     learning rate of the oldest push's step). With s = 0 every round's N pushes are pending together
//     and applied as one sum in rank order: the synchronous parameter server's update, bitwise.
#pragma once
#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ration/distributed/world.h"
#include "ration/optim/optimizer.h"

namespace ration::dist {

// How the parameter server aggregates: every worker every step (the synchronous parameter server of
// distributed/topology.h), the first N-k per round, or each push as it arrives within a staleness bound.
enum class PsAggregation { Synchronous, BackupWorkers, BoundedAsync };
const char* to_string(PsAggregation a);

struct PsAggregationOptions {
  PsAggregation mode = PsAggregation::Synchronous;
  int64_t backup_workers = 0;  // k: BackupWorkers aggregates N-k pushes per round (1 <= k < N)
  int64_t max_staleness = 0;   // s: BoundedAsync; a worker may be at most s pushes ahead of the slowest
};

// The global model the server steps (rank 0's copy, apart from the model rank 0 trains on).
class ServerModel {
 public:
  virtual ~ServerModel() = default;
  // Elements of the flat parameter (and gradient) vector, in the caller's fixed parameter order.
  virtual int64_t numel() const = 0;
  // One optimiser step with `gradient` (numel floats) as every parameter's gradient, at the learning rate
  // of schedule step `step`.
  virtual void apply(const at::Tensor& gradient, int64_t step) = 0;
  // The parameters, flat, into `out` (numel floats).
  virtual void read(at::Tensor& out) const = 0;
};

// One worker's contribution of one step.
struct Push {
  int rank = 0;
  int64_t base_version = 0;  // the server version its parameters came from
  int64_t step = 0;          // its schedule step
  double share = 0;          // its samples / the step's samples over every rank (the gradient is weighted by it)
  double loss_sum = 0;       // sum of its samples' losses, and their number (for the reported loss)
  double samples = 0;
  int stop_signal = 0;       // SIGINT / SIGTERM seen by the worker, or 0
  at::Tensor gradient;       // (numel) float32, share-weighted
};

// The server's answer: the parameters (written by await_reply) and where they stand.
struct Reply {
  int64_t version = 0;   // version of the parameters handed back
  int stop_signal = 0;   // non-zero: every worker stops after this step (a worker asked)
  bool dropped = false;  // this push came after its round closed (BackupWorkers)
  double loss = 0;       // mean loss of the pushes the last optimiser step aggregated
};

struct PsAggregationStats {
  std::vector<int64_t> pushes;     // per rank
  std::vector<int64_t> included;   // per rank: pushes some optimiser step aggregated
  std::vector<int64_t> dropped;    // per rank: pushes that came after their round closed
  int64_t versions = 0;            // optimiser steps the server took
  std::vector<int64_t> staleness;  // histogram: [d] = pushes applied d versions after their base version
  int64_t max_ahead = 0;           // most pushes any worker was ahead of the slowest when it was let go on
  std::vector<double> wait_ms;     // per rank: time from its push to its reply being ready
  int64_t total(const std::vector<int64_t>& per_rank) const;
  double mean_staleness() const;
  int64_t max_staleness() const;
};

// The server's rule (rank 0). Thread-safe: workers' pushes come from receiving threads and rank 0's own
// training thread; each rank has at most one push waiting for its reply.
class PsAggregator {
 public:
  PsAggregator(int world_size, PsAggregationOptions options, ServerModel& model, int64_t first_version);
  // Hands in a push (never blocks on other workers; may run the optimiser step it completes).
  void submit(Push push);
  // Blocks until `rank`'s last push is answered; writes the parameters into `params` (numel floats).
  // Throws CollectiveError once fail() was called.
  Reply await_reply(int rank, at::Tensor& params);
  // Whether `rank`'s reply is ready (tests).
  bool reply_ready(int rank);
  // `rank` trains no more (it is left out of the slowest-worker bound).
  void finished(int rank);
  // A worker was lost: every waiting and later call throws CollectiveError with `why`.
  void fail(const std::string& why);
  // Under the server's lock: fn(model, version), e.g. to copy the model for a checkpoint.
  template <typename Fn>
  void with_model(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    fn(model_, version_);
  }
  PsAggregationStats stats();

 private:
  enum class ReplyState { None, Waiting, Ready };
  enum class Activity { Training, Finished };
  struct RankState {
    ReplyState reply = ReplyState::None;
    Activity activity = Activity::Training;
    bool dropped = false;
    int64_t pushed_at_ns = 0;
  };
  void close_round();            // BackupWorkers; caller holds mu_
  void release_within_bound();   // BoundedAsync; caller holds mu_
  void apply(std::vector<Push>& pushes, double divide_by);  // caller holds mu_
  void throw_if_failed();        // caller holds mu_

  const int n_;
  const PsAggregationOptions options_;
  ServerModel& model_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t version_;
  std::vector<RankState> ranks_;
  std::vector<Push> pending_;    // BackupWorkers: this round's; BoundedAsync: not applied yet
  int stop_signal_ = 0;
  double last_loss_ = 0;
  std::optional<std::string> failure_;
  PsAggregationStats stats_;
};

// The server's side of the wire: one thread per worker receives its pushes over `channel`, submits them
// and sends back the reply (or, after a failure, a failure notice so the worker stops at once). The server
// is the channel's rank 0. worker_offset 0: rank 0 is also worker 0 (it pushes to the aggregator itself, no
// thread); 1: a dedicated server, channel rank r + 1 is worker r. on_snapshot(channel, channel_rank): a
// worker asked for the server's state (PsClient::request_snapshot); it sends it.
class PsServerLinks {
 public:
  PsServerLinks(World channel, std::shared_ptr<PsAggregator> aggregator, int worker_offset = 0,
                std::function<void(const World&, int)> on_snapshot = {});
  // Joins the threads when every worker has finished; otherwise (after a failure) leaves them to the
  // process's exit (they may be blocked in a receive from a lost rank).
  ~PsServerLinks();
  // Blocks until every worker has said it finished; rethrows a lost worker as CollectiveError.
  void wait_for_workers();
  // Bytes the server handed to c10d for the workers so far (replies: headers and parameters).
  int64_t bytes_sent() const;

 private:
  struct Shared;
  static void serve(const std::shared_ptr<Shared>& shared, int rank);
  std::shared_ptr<Shared> shared_;
  std::vector<std::thread> threads_;
};

// A worker's side: push a gradient, receive the reply and the parameters. `server` names the server in
// messages ("the parameter server (rank 0)").
class PsClient {
 public:
  PsClient(World channel, int64_t numel, std::string server = "the parameter server (rank 0)");
  // Sends `push` and waits for the reply; the parameters land in `params`. Throws CollectiveError when
  // the server reports a lost worker or cannot be reached.
  Reply exchange(const Push& push, at::Tensor& params);
  // The two halves of exchange(), so a worker may push to several servers before waiting for any.
  void push(const Push& push);
  Reply await_reply(at::Tensor& params);
  // Asks the server for its state; the caller then receives what the server's on_snapshot sends.
  void request_snapshot();
  // Tells the server this worker trains no more (after its last exchange).
  void finish();
  int64_t bytes_sent() const { return bytes_sent_; }
  const World& channel() const { return channel_; }

 private:
  World channel_;
  int64_t numel_;
  std::string server_;
  int64_t bytes_sent_ = 0;
};

// Named tensors (a model slice, an optimiser's state) from one rank of `channel` to another, with their
// names, dtypes and shapes: every tensor is sent with `tag`, the receiver needs to know nothing in advance.
void send_named_tensors(const World& channel, int to, const optim::NamedTensors& tensors, int tag);
optim::NamedTensors receive_named_tensors(const World& channel, int from, int tag);

}  // namespace ration::dist
