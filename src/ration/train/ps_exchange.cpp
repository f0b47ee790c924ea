// ps_exchange.cpp — the server's copy of the global model and the per-step push/pull (see ps_exchange.h).
#include "ration/train/ps_exchange.h"

#include <ATen/core/grad_mode.h>
#include <algorithm>

#include "ration/base/check.h"
#include "ration/optim/clip.h"

namespace ration::train {

// Rank 0's global model: parameters of its own (the model rank 0 trains on is a worker's copy), an
// optimiser built like the run's, clipping and the schedule, exactly as the synchronous server applies
// them to the summed gradient.
class PsExchange::Server : public dist::ServerModel {
 public:
  Server(const optim::NamedParams& params, const RunSettings& run, const optim::Optimizer& local,
         const optim::WarmupCosine& schedule)
      : run_(run), schedule_(schedule) {
    for (const auto& [name, p] : params) {
      params_.emplace_back(name, parameter(p.tensor().detach().clone(), name));
      numel_ += p.numel();
    }
    optimizer_ = build_optimizer(run, params_);
    optimizer_->import_state(local.export_state());
  }
  int64_t numel() const override { return numel_; }
  void apply(const at::Tensor& gradient, int64_t step) override {
    int64_t offset = 0;
    for (auto& [name, p] : params_) {
      p.impl()->grad = gradient.narrow(0, offset, p.numel()).view(p.tensor().sizes());
      offset += p.numel();
    }
    if (run_.clip_grad_norm > 0) optim::clip_grad_norm(optimizer_->params(), run_.clip_grad_norm);
    schedule_.apply(*optimizer_, step);
    optimizer_->step();
    optimizer_->zero_grad();
  }
  void read(at::Tensor& out) const override {
    int64_t offset = 0;
    for (const auto& [name, p] : params_) {
      out.narrow(0, offset, p.numel()).copy_(p.tensor().reshape({-1}));
      offset += p.numel();
    }
  }
  const optim::NamedParams& params() const { return params_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  const RunSettings& run_;
  const optim::WarmupCosine& schedule_;
  optim::NamedParams params_;
  int64_t numel_ = 0;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

PsExchange::PsExchange(const dist::World& world, const dist::PsAggregationOptions& options,
                       const optim::NamedParams& params, const RunSettings& run, const optim::Optimizer& local,
                       const optim::WarmupCosine& schedule, int64_t first_version)
    : channel_(world.open_channel("ps")), options_(options), version_(first_version) {
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    params_.emplace_back(name, p);
    numel_ += p.numel();
  }
  received_ = at::empty({numel_}, at::kFloat);
  if (world.rank() == 0) {
    server_ = std::make_unique<Server>(params_, run, local, schedule);
    aggregator_ = std::make_shared<dist::PsAggregator>(world.size(), options, *server_, first_version);
    links_ = std::make_unique<dist::PsServerLinks>(channel_, aggregator_);
  } else {
    client_ = std::make_unique<dist::PsClient>(channel_, numel_);
  }
}

PsExchange::~PsExchange() { links_.reset(); }  // before server_: no receiving thread applies any more

at::Tensor PsExchange::pack_gradients() const {
  at::Tensor flat = at::zeros({numel_}, at::kFloat);  // (numel) this rank's share-weighted gradient
  int64_t offset = 0;
  for (const auto& [name, p] : params_) {
    if (p.impl()->grad.defined()) flat.narrow(0, offset, p.numel()).copy_(p.impl()->grad.reshape({-1}));
    offset += p.numel();
  }
  return flat;
}

void PsExchange::unpack_parameters(const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& [name, p] : params_) {
    p.impl()->tensor.copy_(flat.narrow(0, offset, p.numel()).view(p.tensor().sizes()));
    p.impl()->grad = at::Tensor();
    offset += p.numel();
  }
}

dist::Reply PsExchange::exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal) {
  dist::Push push;
  push.rank = channel_.rank();
  push.base_version = version_;
  push.step = step;
  push.share = share;
  push.loss_sum = loss_sum;
  push.samples = samples;
  push.stop_signal = stop_signal;
  push.gradient = pack_gradients();
  dist::Reply reply;
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
  return reply;
}

void PsExchange::finish(optim::Optimizer& local) {
  if (client_) {
    client_->finish();
    return;
  }
  aggregator_->finished(0);
  links_->wait_for_workers();
  aggregator_->with_model([&](dist::ServerModel& model, int64_t version) {
    model.read(received_);
    version_ = version;
  });
  unpack_parameters(received_);
  local.import_state(server_->optimizer().export_state());
}

void PsExchange::snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state) {
  RATION_CHECK(server_ != nullptr, "PsExchange::snapshot: only rank 0 holds the global model");
  aggregator_->with_model([&](dist::ServerModel&, int64_t) {
    for (const auto& [name, p] : server_->params()) weights.emplace_back(name, p.tensor().clone());
    for (const auto& [name, t] : server_->optimizer().export_state()) optimizer_state.emplace_back(name, t.clone());
  });
}

nlohmann::json PsExchange::report() {
  nlohmann::json j = {{"aggregation", dist::to_string(options_.mode)}, {"version", version_}};
  if (options_.mode == dist::PsAggregation::BackupWorkers) j["backup_workers"] = options_.backup_workers;
  if (options_.mode == dist::PsAggregation::BoundedAsync) j["max_staleness"] = options_.max_staleness;
  if (!aggregator_) {
    j["pushes"] = pushes_;
    j["dropped"] = dropped_;
    j["bytes_pushed"] = client_->bytes_sent();
    // Per step, exactly: the gradient (4 x numel) and the 64-byte header of each push.
    j["bytes_sent_per_step"] = static_cast<double>(client_->bytes_sent()) / static_cast<double>(std::max<int64_t>(pushes_, 1));
    return j;
  }
  const dist::PsAggregationStats st = aggregator_->stats();
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

}  // namespace ration::train
