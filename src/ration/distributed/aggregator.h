// aggregator.h — how the ranks of a data-parallel run combine their work, as one plug-in: what a gradient
// bucket's traffic is (on the reducer's communication thread, overlapping backward) and what happens
// around the optimiser step (before it, instead of it, after it, at the end of the run), in the spirit of
// DDP's communication hooks. See docs/DISTRIBUTED.md, "Aggregators".
// Owns: the Aggregator interface, AggregatorContext (what a plug-in may use: the world, the parameters, the
//       run's optimiser and how to build another one like it), BucketLayout and laying per-parameter
//       tensors out as the buckets are.
// Does not own: bucketing, weighting, threads and overlap (distributed/reducer.h), choosing and checking
//       an aggregator from the [dist] keys (distributed/aggregator_factory.h), the implementations (one file
//       each: allreduce_aggregator, ps_sync_aggregator, ps_partial_aggregator, ps_group_aggregator, gossip_aggregator,
//       averaging_aggregator, ensemble_aggregator), the training loop (train/).
//
// Order of calls in one optimiser step of sync_every micro-batches (one rank):
//   before_backward(step) per micro-batch, before its backward (the window opens at the first);
//   begin_window once, then on_bucket per bucket in bucket order (communication thread);
//   the reducer's finalize: param.grad = the reduced sum, or this rank's own mean gradient when
//   owns_gradient();
//   then either the run's optimiser step (steps_locally()) or exchange() (a server steps instead);
//   after_optimizer() (parameter traffic after the step); at the end of the run finish().
// Adding a topology: one file implementing this interface, one row in the factory's table, its tests.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ration/distributed/comm_hook.h"
#include "ration/distributed/world.h"
#include "ration/optim/optimizer.h"
#include "ration/optim/schedule.h"

namespace ration::dist {

// One bucket: parameters (in reverse model order) packed into one flat float32 buffer.
struct BucketLayout {
  std::vector<std::string> names;   // parameter names, in bucket order
  std::vector<int64_t> offsets;     // element offset of each in the flat buffer
  std::vector<int64_t> numels;
  int64_t numel = 0;
};
// Per-parameter tensors (by name, any shape with the parameter's numel) laid out as the buckets are: one
// (numel) float32 tensor per bucket; parameters not named are filled with `missing`.
std::vector<at::Tensor> lay_out_as_buckets(const std::vector<BucketLayout>& layouts,
                                           const std::vector<std::pair<std::string, at::Tensor>>& per_param,
                                           float missing);

// What an aggregator may use around the optimiser step; given once by attach(), after the profiling step.
struct AggregatorContext {
  World world;                            // the workers (every rank of the job without dist.servers)
  World everyone;                         // the whole job: the workers, then the dedicated servers
  optim::NamedParams params;              // the model's trainable parameters, in model order
  optim::Optimizer* optimizer = nullptr;  // the run's
  // An optimiser built like the run's for other parameters (a server's copy of the model), the run's
  // clipping norm (0: none) and learning-rate schedule: the update rule a server applies.
  std::function<std::unique_ptr<optim::Optimizer>(const optim::NamedParams&)> make_optimizer;
  double clip_grad_norm = 0;
  const optim::WarmupCosine* schedule = nullptr;
  int64_t first_step = 0;                 // the step the run starts at (a resumed run's)
  optim::NamedTensors resumed;            // the resumed checkpoint's optimiser entries (aggregator state)
  std::string origin;                     // the config's name, for messages
};

// A step made by a server instead of this rank's optimiser (see exchange()).
struct ServerStep {
  double loss = 0;          // the step's mean loss as the server saw it
  int stop_signal = 0;      // a stop request every rank agrees on (0: go on)
  int64_t adopt_step = -1;  // >= 0: this rank fell behind; it continues at this step (its data skipped)
};

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  // The report's "topology" ("allreduce", "ps", "gossip", ...).
  virtual std::string name() const = 0;
  // How a bucket's traffic is named in traces ("<this> bucket <b>").
  virtual std::string bucket_traffic() const { return name(); }

  // ---- bucket level (the reducer) ----
  // Once, before the first bucket: the bucket layout.
  virtual void init_buckets(const std::vector<BucketLayout>& layouts) {}
  // Before the first bucket of every window, on the caller's thread while no bucket is in flight.
  virtual void begin_window(const WindowContext& context) {}
  // One bucket's traffic, on the communication thread, strictly in bucket order on every rank. `flat`
  // holds this rank's weighted gradient sum for the bucket; on return it holds what param.grad becomes
  // (the reduced sum; left alone when the bucket does not travel). Throws CollectiveError on failure.
  virtual Traffic on_bucket(const World& world, int bucket, at::Tensor& flat) { return {}; }
  // true: no gradient travels and param.grad becomes this rank's own mean gradient (the window's
  // weighted sum divided by this rank's share).
  virtual bool owns_gradient() const { return false; }

  // ---- step level (train/data_parallel_step) ----
  // After the profiling step, before the first training step; every rank calls it at the same point (it
  // may open channels). Returns a note for the user, or "".
  virtual std::string attach(const AggregatorContext& context) { return {}; }
  // Before each micro-batch's backward of optimiser step `step`.
  virtual void before_backward(int64_t step) {}
  // false: a server makes the optimiser step (exchange() below), not this rank's optimiser.
  virtual bool steps_locally() const { return true; }
  // steps_locally() == false: after finalize, hand this rank's share-weighted gradient (in param.grad) to
  // the server and take its parameters back. `share`: this rank's share of the step's samples.
  virtual ServerStep exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal) {
    return {};
  }
  // After the optimiser step that followed finalize (every rank): parameter traffic, if any (nullopt:
  // nothing was exchanged, so no time is counted). `params` are the parameters in bucket order;
  // `window_weight` this rank's share of the window's samples.
  virtual std::optional<Traffic> after_optimizer(const World& world, const std::vector<at::Tensor>& params,
                                                 int64_t step, double window_weight) {
    return std::nullopt;
  }
  // After the last step (every rank): leave the run's final model in `params` (bucket order).
  virtual std::optional<Traffic> finish(const World& world, const std::vector<at::Tensor>& params) {
    return std::nullopt;
  }
  // Whether the global model lives on a server rather than in every rank's model (rank 0 then evaluates
  // and checkpoints alone).
  virtual bool central() const { return false; }
  // central(): rank 0's copy of the global model and its optimiser state, as a checkpoint holds them.
  virtual void snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state) {}
  // Collective: state the aggregator keeps between steps that a checkpoint must hold (rank 0 gets every
  // rank's entries; see comm_hook.h's hook state).
  virtual optim::NamedTensors gather_state(const World& world) { return {}; }
  // Bytes the aggregator holds between steps besides the gradient buckets (for the memory plan), given
  // the model's parameter count; and what it holds now (the report).
  virtual int64_t fixed_bytes(int64_t num_parameters) const { return 0; }
  virtual int64_t state_bytes() const { return 0; }
  // Its part of the report's "dist" (merged in).
  virtual nlohmann::json report() { return nlohmann::json::object(); }
};

}  // namespace ration::dist
