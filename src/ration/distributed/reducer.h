// reducer.h — data-parallel gradient synchronisation: parameters grouped into buckets, each bucket's
// reduction launched on a communication thread the moment its last gradient is ready during backward,
// all of them waited for before the optimiser.
// Owns: the bucket layout (built once, reverse parameter order, a smaller first bucket), the weighted
//       local contribution (each rank adds weight * grad, weight = its share of the step's samples, so the
//       sum over ranks is the gradient of the global mean loss), gradient accumulation over
//       sync_every backward passes, the communication thread, and the step's comm time / overlap / bytes.
// Does not own: what a bucket's traffic is and what happens around the optimiser step (the Aggregator,
//       distributed/aggregator.h: all-reduce through a comm hook, parameter server, gossip, ...), the process
//       group (distributed/world.h), the data shard or the weights' values (the caller knows its sample
//       counts), the optimiser.
//
// Use (the two-method shape of DDP's reducer, attached to the engine's gradient-ready hooks):
//   Reducer reducer(world, params, make_aggregator(...), options);   // registers the hooks
//   (or Reducer(world, params, make_comm_hook("none", ...), options): all-reduce through that hook)
//   per backward:  reducer.prepare_backward(my_samples / global_samples_of_this_step);  loss.backward();
//   then, when reducer.window_complete():  reducer.finalize();  optimizer.step();
// prepare_backward is called sync_every times per optimiser step (one per micro-batch); the last call's
// backward launches the buckets, finalize waits and writes the summed gradient into every param.grad.
// A parameter that got no gradient contributes zeros. Every rank must build the Reducer from the same
// parameter list (same names, shapes, order): buckets are then identical and reduced in the same order.
//
// Thread model: hooks and finalize run on the caller's thread; reductions run on one communication
// thread, strictly in bucket order (c10d requires every rank to issue collectives in the same order), so
// the caller must not issue other collectives on the same World between prepare_backward and finalize.
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ration/core/value.h"
#include "ration/distributed/aggregator.h"
#include "ration/distributed/comm_hook.h"
#include "ration/distributed/world.h"

namespace ration::dist {

struct ReducerOptions {
  int64_t bucket_bytes = 25ll << 20;       // cap of every bucket but the first
  int64_t first_bucket_bytes = 1ll << 20;  // the first bucket (the last parameters) is smaller, to start early
  int64_t sync_every = 1;                  // backward passes accumulated locally per synchronisation
};

// Totals over synchronisations since construction.
struct ReducerStats {
  int64_t synchronizations = 0;
  Traffic traffic;              // bytes this rank handed to c10d (payload) and the ring model (wire)
  double comm_ms = 0;           // time the communication thread spent reducing buckets
  double exposed_ms = 0;        // time finalize() waited for it (communication not hidden under backward)
  // Of comm_ms and exposed_ms: the parameter exchange after the optimiser step (ps, gossip), which runs
  // on the caller's thread after the step runtime has timed the step.
  double exchange_ms = 0;
  // Fraction of communication hidden under backward: 1 - exposed / comm (0 when nothing was sent).
  double overlap() const;
};

class Reducer {
 public:
  Reducer(World world, const std::vector<std::pair<std::string, Value>>& params,
          std::unique_ptr<Aggregator> aggregator, ReducerOptions options = {});
  // All-reduce of every bucket through `hook` (the allreduce aggregator).
  Reducer(World world, const std::vector<std::pair<std::string, Value>>& params, std::unique_ptr<CommHook> hook,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Before each backward: this backward's gradient counts `weight` times (its samples / the samples of
  // the whole optimiser step over every rank and micro-batch; 0 for a rank without data).
  void prepare_backward(double weight);
  // The step and learning rate of the coming synchronisation, handed to the aggregator when its window opens
  // (the first prepare_backward after it); optional.
  void set_window_context(const WindowContext& context) { context_ = context; }
  // Gradient-ready hook (registered on every parameter by the constructor; public for callers that drive
  // the engine themselves). `param` must be one of the reducer's parameters.
  void on_grad_ready(ValueImpl& param);
  // Whether the last prepare_backward opened the synchronising backward of the window.
  bool window_complete() const { return micro_ == options_.sync_every; }
  // After the synchronising backward: launches buckets still waiting (a parameter without gradient),
  // waits for every reduction, and points every param.grad at its sum (a view of the bucket, valid until
  // the next window's first prepare_backward, which clears param.grad). Rethrows a communication failure.
  void finalize();
  // After the optimiser step that followed finalize(): the aggregator's parameter traffic (a server's
  // parameters, a gossip average, a model average every K steps). Does nothing unless a finalize() is
  // waiting for it, so it may be called after every backward.
  void after_optimizer_step();
  // After the last step (every rank): the aggregator leaves the run's final model in the parameters.
  void finish();

  const std::vector<BucketLayout>& buckets() const { return layouts_; }
  // Bytes of the flat bucket buffers (gradient memory the reducer adds).
  int64_t bucket_bytes() const;
  const Aggregator& aggregator() const { return *aggregator_; }
  Aggregator& aggregator() { return *aggregator_; }
  const ReducerStats& stats() const { return stats_; }

 private:
  enum class BucketState { Filling, Ready, Launched, Reduced };
  enum class ParameterExchange { Done, Due };  // Due: finalize() ran, the step's parameters not yet exchanged
  struct Slot {
    std::shared_ptr<ValueImpl> param;
    size_t bucket = 0;
    int64_t offset = 0;
  };
  struct Bucket {
    at::Tensor flat;           // (numel) float32: sum of weight * grad of this rank, then the global sum
    int64_t unready = 0;       // parameters of the synchronising backward not yet ready
    BucketState state = BucketState::Filling;
  };
  void mark_ready(size_t bucket);          // caller holds mu_
  void launch_ready_in_order();            // caller holds mu_
  void comm_loop();
  std::vector<at::Tensor> parameter_tensors() const;  // in bucket order
  void count_exchange(const Traffic& traffic, double ms);

  World world_;
  std::unique_ptr<Aggregator> aggregator_;
  ReducerOptions options_;
  std::vector<BucketLayout> layouts_;
  std::vector<Slot> slots_;                           // one per parameter, in bucket order
  std::vector<std::pair<const ValueImpl*, size_t>> slot_of_;  // sorted by address -> slot index
  std::vector<Bucket> buckets_;
  double weight_ = 1;
  double window_weight_ = 0;                          // sum of this window's weights (this rank's share)
  ParameterExchange exchange_ = ParameterExchange::Done;
  WindowContext context_;
  int64_t micro_ = 0;                                 // backward passes of this window prepared so far
  size_t next_launch_ = 0;
  std::shared_ptr<Reducer*> self_;                    // hooks hold a weak_ptr: no-ops after destruction

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;                          // buckets for the communication thread
  size_t reduced_ = 0;                                // buckets reduced this window
  std::exception_ptr failure_;
  bool stopping_ = false;
  ReducerStats stats_;
  double window_comm_ms_ = 0;
  std::thread comm_thread_;
};

}  // namespace ration::dist
