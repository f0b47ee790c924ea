// gossip_async.h — asynchronous push-sum gossip (dist.gossip_async = true): a rank does not wait for a slow
// neighbour beyond dist.max_staleness steps. See docs/DISTRIBUTED.md, "Topologies" (asynchronous gossip).
// Owns: the protocol on its own channel ("gossip"): the step-tagged push-sum messages, one receiving thread
//       per incoming neighbour, the staleness bound, the final drain ('finished' messages), its counts.
// Does not own: which graph is used and when (distributed/gossip_aggregator.cpp), the graphs' synchronous
//       exchanges (distributed/topology.h), the training loop.
//
// Protocol, at this rank's e-th exchange (e = 0, 1, ... counted by every rank alike; message "step" below):
//   1. y = w * params (params hold the de-biased x / w); the out-neighbours of exchange e each get 1/k of
//      (y, w) tagged with e (k = out-neighbours + 1: the exponential graph's one peer at distance
//      2^((first step + e) mod ceil(log2 N)), k = 2; the ring's two neighbours, k = 3; at N = 2 the one, k = 2);
//      this rank keeps 1/k.
//   2. It blocks only while a message addressed to it of a step <= e - max_staleness has not arrived (each
//      incoming neighbour's messages arrive in order, so this is "the newest message from a neighbour it
//      needs is more than max_staleness steps old").
//   3. It adds every arrived message of a step <= e (messages of later steps, from a neighbour ahead, wait
//      for their step), in (step, sender) order, to its kept share; params become y / w.
// With max_staleness = 0 every exchange mixes exactly the messages of its own step: on the exponential graph
// that is synchronous push-sum (push_sum_exponential) bitwise. Mass is conserved: sum_r w_r + the weights
// in flight = N; finish() sends each out-neighbour a 'finished' message (after all its others), waits for
// every incoming neighbour's, and mixes what is left, so after it sum_r w_r = N (up to float rounding).
// No collective over every rank: sends and receives are point-to-point with the neighbours only.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "ration/distributed/comm_hook.h"
#include "ration/distributed/topology.h"
#include "ration/distributed/world.h"

namespace ration::dist {

struct AsyncGossipStats {
  int64_t exchanges = 0;        // exchanges made
  int64_t waits = 0;            // exchanges at which this rank blocked for a neighbour's message
  double wait_ms = 0;           // how long it blocked in all
  int64_t mixed = 0;            // messages mixed by exchanges (not counting the final drain)
  int64_t staleness_max = 0;    // over mixed messages: this rank's exchange index - the message's
  double staleness_mean = 0;
  int64_t drained = 0;          // messages mixed by finish()
};

class AsyncPushSum {
 public:
  // `world`: the run's; the channel is opened (every rank alike) at the first exchange.
  AsyncPushSum(World world, GossipGraph graph, int64_t max_staleness);
  ~AsyncPushSum();
  AsyncPushSum(const AsyncPushSum&) = delete;
  AsyncPushSum& operator=(const AsyncPushSum&) = delete;

  // After this rank's optimiser step of `step` (`params`: the model's, in the same order on every rank).
  // Throws CollectiveError naming the neighbour when a receive failed (a lost rank, a timeout).
  Traffic exchange(const std::vector<at::Tensor>& params, int64_t step);
  // After the last exchange (every rank): 'finished' to every out-neighbour, every incoming neighbour's
  // messages up to its 'finished' mixed in. Afterwards no message is in flight and no thread runs.
  void finish(const std::vector<at::Tensor>& params);

  double weight() const { return weight_; }  // this rank's push-sum weight
  AsyncGossipStats stats() const;

 private:
  struct Shared;
  struct Incoming {
    int rank = 0;
    int phase = -1;  // exponential graph: it sends to this rank at exchanges with (first + e) mod L == phase
  };
  // One incoming neighbour's thread: blocking receives until its 'finished' message (or a failure).
  static void receive_loop(const std::shared_ptr<Shared>& s, size_t index, int sender, int64_t numel);
  void open(const std::vector<at::Tensor>& params, int64_t step);
  std::vector<int> out_neighbours(int64_t e) const;  // of exchange e
  std::vector<int> every_out_neighbour() const;      // of any exchange (each once)
  int64_t needed(const Incoming& in, int64_t e) const;  // the newest of its messages exchange e must have (-1: none)
  void wait_for_needed(int64_t e);
  // Adds the queued messages of steps <= up_to (all when up_to < 0) to `acc`, in (step, sender) order.
  int64_t mix_queued(at::Tensor& acc, int64_t up_to, bool count_staleness);
  void set_parameters(const at::Tensor& acc, const std::vector<at::Tensor>& params);

  World world_;
  GossipGraph graph_;
  int64_t max_staleness_;
  int distances_ = 1;  // L = ceil(log2 N)
  int64_t first_step_ = 0;
  int64_t numel_ = 0;
  double weight_ = 1;
  bool finished_ = false;
  std::vector<Incoming> incoming_;
  std::shared_ptr<Shared> shared_;
  std::vector<std::thread> threads_;
  AsyncGossipStats stats_;
  double staleness_sum_ = 0;
};

}  // namespace ration::dist
