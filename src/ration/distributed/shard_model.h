// shard_model.h — a parameter server's copy of (part of) the global model: the parameters it holds, an
// optimiser built like the run's (the run's state of those parameters imported), the run's clipping and
// learning-rate schedule. Rank 0's colocated server holds every parameter (one process); each server of a
// group (dist.servers) some of them, and clips by the norm of the whole gradient, whose per-parameter
// norms the servers exchange (docs/DISTRIBUTED.md, "A group of parameter servers").
// Owns: ShardModel (ServerModel: apply, read; its weights and optimiser state for checkpoints).
// Does not own: which pushes an update aggregates (distributed/ps_aggregation.h), the wire.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "ration/distributed/aggregator.h"
#include "ration/distributed/ps_aggregation.h"

namespace ration::dist {

class ShardModel : public ServerModel {
 public:
  // `held`: indices into `trainable` (every trainable parameter of the model, in model order) of the
  // parameters this server holds, in model order. `servers`: the servers' process group (a one-process
  // world for a single server): apply() all-reduces over it to clip by the whole gradient's norm.
  ShardModel(const AggregatorContext& context, const optim::NamedParams& trainable, const std::vector<size_t>& held,
             World servers);
  int64_t numel() const override { return numel_; }
  // Parameter gradients from `gradient` (this server's parameters, flat, in order); clipping, schedule,
  // one optimiser step. With one server: clip_grad_norm's operations exactly.
  void apply(const at::Tensor& gradient, int64_t step) override;
  void read(at::Tensor& out) const override;
  const optim::NamedParams& params() const { return params_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  optim::NamedTensors own_entries(const optim::NamedTensors& all) const;
  std::vector<at::Tensor> all_norms();

  const AggregatorContext& context_;
  World servers_;
  std::vector<size_t> held_;
  size_t total_params_;
  optim::NamedParams params_;
  std::vector<Value> values_;
  int64_t numel_ = 0;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

// Whether an optimiser entry is one parameter's ("optim.<param>.<slot>"), not the step count or the rate.
bool per_parameter_entry(const std::string& key);

}  // namespace ration::dist
