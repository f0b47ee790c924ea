// ps_partial_aggregator.cpp — partial and asynchronous aggregation on the parameter server
// (dist.backup_workers, dist.sync = "async"; docs/DISTRIBUTED.md, "Backup workers and bounded asynchrony"):
// rank 0 keeps a server copy of the global model (distributed/shard_model.h holding every parameter: its
// own optimiser built like the run's, clipping and the learning-rate schedule);
// every rank, after the reducer's finalize, pushes its weighted gradient, receives the global parameters
// and copies them into its model; at the end rank 0 waits for the workers and leaves the final global
// model in the model. Which pushes a version aggregates and when a worker may go on:
// distributed/ps_aggregation.h.
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "ration/base/check.h"
#include "ration/core/value.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/shard_model.h"

namespace ration::dist {
namespace {

class PartialPsAggregator : public Aggregator {
 public:
  explicit PartialPsAggregator(const PsAggregationOptions& options) : options_(options) {}
  ~PartialPsAggregator() override;
  std::string name() const override { return "ps"; }
  // Every rank opens the parameter server's channel; rank 0 builds the global model's copy and serves it.
  std::string attach(const AggregatorContext& context) override;
  bool steps_locally() const override { return false; }
  bool central() const override { return true; }
  // Every param.grad holds this rank's share-weighted gradient: push it, wait for the reply, copy the
  // parameters it brings into the model.
  ServerStep exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal) override;
  // Workers tell the server; rank 0 waits for every worker, then copies the final global parameters into
  // the model and the server optimiser's state into the run's.
  std::optional<Traffic> finish(const World& world, const std::vector<at::Tensor>& params) override;
  void snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state) override;
  // Rank 0 the server's counts (per rank), a worker its own.
  nlohmann::json report() override;

 private:
  at::Tensor pack_gradients() const;
  void unpack_parameters(const at::Tensor& flat);

  PsAggregationOptions options_;
  AggregatorContext context_;
  World channel_;
  optim::NamedParams params_;
  int64_t numel_ = 0;
  int64_t version_ = 0;
  at::Tensor received_;  // (numel) the parameters of the last reply
  std::unique_ptr<ShardModel> server_;             // rank 0: every parameter
  std::shared_ptr<PsAggregator> aggregator_;       // rank 0
  std::unique_ptr<PsServerLinks> links_;           // rank 0, destroyed before server_
  std::unique_ptr<PsClient> client_;               // workers
  int64_t pushes_ = 0, dropped_ = 0;
};

std::string PartialPsAggregator::attach(const AggregatorContext& context) {
  context_ = context;
  channel_ = context.world.open_channel("ps");
  version_ = context.first_step;
  for (const auto& [name, p] : context.params) {
    if (!p.requires_grad()) continue;
    params_.emplace_back(name, p);
    numel_ += p.numel();
  }
  received_ = at::empty({numel_}, at::kFloat);
  if (channel_.rank() == 0) {
    std::vector<size_t> every(params_.size());
    for (size_t i = 0; i < every.size(); ++i) every[i] = i;
    server_ = std::make_unique<ShardModel>(context_, params_, every, World::init_single());
    aggregator_ = std::make_shared<PsAggregator>(channel_.size(), options_, *server_, version_);
    links_ = std::make_unique<PsServerLinks>(channel_, aggregator_);
  } else {
    client_ = std::make_unique<PsClient>(channel_, numel_);
  }
  return {};
}

PartialPsAggregator::~PartialPsAggregator() { links_.reset(); }  // before server_: no receiving thread applies any more

at::Tensor PartialPsAggregator::pack_gradients() const {
  at::Tensor flat = at::zeros({numel_}, at::kFloat);  // (numel) this rank's share-weighted gradient
  int64_t offset = 0;
  for (const auto& [name, p] : params_) {
    if (p.impl()->grad.defined()) flat.narrow(0, offset, p.numel()).copy_(p.impl()->grad.reshape({-1}));
    offset += p.numel();
  }
  return flat;
}

void PartialPsAggregator::unpack_parameters(const at::Tensor& flat) {
  std::vector<at::Tensor> tensors;
  for (auto& [name, p] : params_) {
    tensors.push_back(p.impl()->tensor);
    p.impl()->grad = at::Tensor();
  }
  dist::unpack_parameters(flat, tensors);  // distributed/topology.h
}

ServerStep PartialPsAggregator::exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal) {
  Push push;
  push.rank = channel_.rank();
  push.base_version = version_;
  push.step = step;
  push.share = share;
  push.loss_sum = loss_sum;
  push.samples = samples;
  push.stop_signal = stop_signal;
  push.gradient = pack_gradients();
  Reply reply;
  if (aggregator_) {
    aggregator_->submit(std::move(push));
    reply = aggregator_->await_reply(0, received_);
  } else {
    reply = client_->exchange(push, received_);
  }
  ++pushes_;
  dropped_ += reply.dropped ? 1 : 0;
  version_ = reply.version;
  unpack_parameters(received_);
  ServerStep out;
  out.loss = reply.loss;
  out.stop_signal = reply.stop_signal;
  // A late backup worker adopts the server's version as its step (the loop's next step is that version).
  if (options_.mode == PsAggregation::BackupWorkers && reply.version > step + 1) out.adopt_step = reply.version - 1;
  return out;
}

std::optional<Traffic> PartialPsAggregator::finish(const World&, const std::vector<at::Tensor>&) {
  if (client_) {
    client_->finish();
    return std::nullopt;
  }
  aggregator_->finished(0);
  links_->wait_for_workers();
  aggregator_->with_model([&](ServerModel& model, int64_t version) {
    model.read(received_);
    version_ = version;
  });
  unpack_parameters(received_);
  context_.optimizer->import_state(server_->optimizer().export_state());
  return std::nullopt;
}

void PartialPsAggregator::snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state) {
  RATION_CHECK(server_ != nullptr, "the parameter server's snapshot: only rank 0 holds the global model");
  aggregator_->with_model([&](ServerModel&, int64_t) {
    for (const auto& [name, p] : server_->params()) weights.emplace_back(name, p.tensor().clone());
    for (const auto& [name, t] : server_->optimizer().export_state()) optimizer_state.emplace_back(name, t.clone());
  });
}

nlohmann::json PartialPsAggregator::report() {
  if (!channel_.defined()) return nlohmann::json::object();
  nlohmann::json j = {{"aggregation", to_string(options_.mode)}, {"version", version_}};
  if (options_.mode == PsAggregation::BackupWorkers) j["backup_workers"] = options_.backup_workers;
  if (options_.mode == PsAggregation::BoundedAsync) j["max_staleness"] = options_.max_staleness;
  if (!aggregator_) {
    j["pushes"] = pushes_;
    j["dropped"] = dropped_;
    j["bytes_pushed"] = client_->bytes_sent();
    // Per step, exactly: the gradient (4 x numel) and the 64-byte header of each push.
    j["bytes_sent_per_step"] = static_cast<double>(client_->bytes_sent()) / static_cast<double>(std::max<int64_t>(pushes_, 1));
    return j;
  }
  const PsAggregationStats st = aggregator_->stats();
  j["versions"] = st.versions;
  j["pushes_by_rank"] = st.pushes;
  j["included_by_rank"] = st.included;
  j["dropped_by_rank"] = st.dropped;
  j["dropped_contributions"] = st.total(st.dropped);
  j["included_contributions"] = st.total(st.included);
  j["staleness"] = {{"max", st.max_staleness()}, {"mean", st.mean_staleness()}, {"histogram", st.staleness}};
  j["max_ahead"] = st.max_ahead;
  std::vector<double> wait(st.wait_ms.size());
  for (size_t r = 0; r < wait.size(); ++r)
    wait[r] = st.pushes[r] > 0 ? st.wait_ms[r] / static_cast<double>(st.pushes[r]) : 0.0;
  j["reply_wait_ms_by_rank"] = wait;
  j["bytes_sent_to_workers"] = links_->bytes_sent();
  // Per step of rank 0's own: the replies (parameters and header) it sent to the workers meanwhile.
  j["bytes_sent_per_step"] = static_cast<double>(links_->bytes_sent()) / static_cast<double>(std::max<int64_t>(pushes_, 1));
  return j;
}

}  // namespace

std::unique_ptr<Aggregator> make_partial_ps_aggregator(const PsAggregationOptions& options) {
  return std::make_unique<PartialPsAggregator>(options);
}

}  // namespace ration::dist
