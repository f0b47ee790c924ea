// ps_group_aggregator.cpp — a group of dedicated parameter servers for the dense parameters
// (dist.servers = S; docs/DISTRIBUTED.md, "A group of parameter servers"): the job's ranks [0, N) are
// workers, [N, N + S) servers started by `ration launch --servers S`. Every parameter lives on one server
// (whole parameters, balanced by size); server j steps its parameters with an optimiser built like the
// run's, by the rule of distributed/ps_aggregation.h (synchronous rounds — the bounded-asynchronous rule
// with s = 0 —, backup workers, or bounded asynchrony), and clips by the norm of the whole gradient (the
// servers exchange their parameters' norms). A worker pushes each server its part of the gradient, then
// waits for every server's parameters. Worker 0 asks the servers for their state for checkpoints and
// receives their final state at the end.
//
// Channels: server j and the workers form the process group "ps-shard-<j>" (the server its rank 0, worker r
// its rank r + 1); the servers form "ps-servers" (the norms).
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>

#include "ration/base/check.h"
#include "ration/core/value.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/shard_model.h"
#include "ration/distributed/topology.h"

namespace ration::dist {
namespace {

constexpr int kSnapshotTag = 5, kFinalTag = 6;


// Which server holds which parameters: largest first, each to the server holding the fewest elements so
// far (the lowest index on a tie); each server's list in model order. The same on every rank.
struct Placement {
  std::vector<std::vector<size_t>> held;  // [server] -> indices into the trainable parameters
  std::vector<int64_t> numel;             // [server] -> elements
};

Placement place(const optim::NamedParams& params, int servers) {
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].second.numel() > params[b].second.numel(); });
  Placement p{std::vector<std::vector<size_t>>(static_cast<size_t>(servers)),
              std::vector<int64_t>(static_cast<size_t>(servers), 0)};
  for (size_t i : order) {
    const auto j = static_cast<size_t>(std::min_element(p.numel.begin(), p.numel.end()) - p.numel.begin());
    p.held[j].push_back(i);
    p.numel[j] += params[i].second.numel();
  }
  for (auto& h : p.held) std::sort(h.begin(), h.end());
  return p;
}

std::vector<int> shard_members(int server, int workers) {
  std::vector<int> m = {workers + server};
  for (int r = 0; r < workers; ++r) m.push_back(r);
  return m;
}

std::string server_name(int server, int workers) {
  return detail::str("parameter server ", server, " (rank ", workers + server, ")");
}

PsAggregationOptions server_rule(PsAggregationOptions o) {
  // Synchronous rounds: every worker's push of a step, summed in rank order: bounded asynchrony with s = 0.
  if (o.mode == PsAggregation::Synchronous) o = {PsAggregation::BoundedAsync, 0, 0};
  return o;
}

void check_group(const AggregatorContext& context, const PsAggregationOptions& options, int servers) {
  const int workers = context.everyone.size() - servers;
  RATION_CHECK(workers >= 1, context.origin, ": dist.servers = ", servers, " leaves no worker among ",
               context.everyone.size(), " processes; start ration launch -n N --servers ", servers);
  RATION_CHECK(servers == 1 || context.clip_grad_norm <= 0 || options.mode == PsAggregation::Synchronous,
               context.origin, ": optim.clip_grad_norm with dist.servers = ", servers, " needs synchronous rounds "
               "(dist.sync = \"sync\", no dist.backup_workers): the norm of the whole gradient is known only where "
               "every server steps on the same version; set optim.clip_grad_norm = 0 or dist.servers = 1");
}

optim::NamedParams trainable_of(const optim::NamedParams& params) {
  optim::NamedParams out;
  for (const auto& [name, p] : params)
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

// What a checkpoint holds of a server: "w:<param>" its weights, "o:<entry>" its optimiser state.
optim::NamedTensors state_of(ShardModel& model) {
  optim::NamedTensors out;
  for (const auto& [name, p] : model.params()) out.emplace_back("w:" + name, p.tensor().clone());
  for (const auto& [name, t] : model.optimizer().export_state()) out.emplace_back("o:" + name, t.clone());
  return out;
}

nlohmann::json stats_json(const PsAggregationStats& st) {
  return {{"versions", st.versions},           {"pushes_by_rank", st.pushes},
          {"included_by_rank", st.included},   {"dropped_by_rank", st.dropped},
          {"max_staleness", st.max_staleness()}, {"mean_staleness", st.mean_staleness()}};
}

// A worker: pushes each server its part of the gradient, waits for every server's parameters.
class GroupPsAggregator : public Aggregator {
 public:
  GroupPsAggregator(const PsAggregationOptions& options, int servers) : options_(options), servers_(servers) {}
  std::string name() const override { return "ps"; }
  std::string attach(const AggregatorContext& context) override;
  bool steps_locally() const override { return false; }
  bool central() const override { return true; }
  ServerStep exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal) override;
  std::optional<Traffic> finish(const World& world, const std::vector<at::Tensor>& params) override;
  void snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state) override;
  nlohmann::json report() override;

 private:
  at::Tensor pack(int server) const;
  void unpack(int server, const at::Tensor& flat);
  void split(const optim::NamedTensors& states, optim::NamedTensors& weights, optim::NamedTensors& optimizer_state,
             bool first) const;

  PsAggregationOptions options_;
  int servers_;
  int workers_ = 0;
  AggregatorContext context_;
  optim::NamedParams trainable_;
  Placement placement_;
  std::vector<std::unique_ptr<PsClient>> clients_;  // [server]
  std::vector<int64_t> versions_;                   // [server] the version of its parameters this worker holds
  std::vector<at::Tensor> received_;                // [server] (numel) its last reply's parameters
  std::optional<optim::NamedTensors> final_weights_, final_state_;  // worker 0, after finish()
  nlohmann::json server_stats_ = nlohmann::json::array();
  int64_t pushes_ = 0, dropped_ = 0;
};

std::string GroupPsAggregator::attach(const AggregatorContext& context) {
  context_ = context;
  check_group(context, options_, servers_);
  workers_ = context.everyone.size() - servers_;
  trainable_ = trainable_of(context.params);
  placement_ = place(trainable_, servers_);
  for (int j = 0; j < servers_; ++j) {
    World channel = context.everyone.subgroup("ps-shard-" + std::to_string(j), shard_members(j, workers_));
    clients_.push_back(std::make_unique<PsClient>(channel, placement_.numel[static_cast<size_t>(j)],
                                                  server_name(j, workers_)));
    received_.push_back(at::empty({placement_.numel[static_cast<size_t>(j)]}, at::kFloat));
  }
  versions_.assign(static_cast<size_t>(servers_), context.first_step);
  return detail::str(servers_, " parameter server", servers_ > 1 ? "s" : "", " (ranks ", workers_, "-",
                     workers_ + servers_ - 1, ") hold the dense parameters: ",
                     placement_.numel.size() > 1 ? "elements per server " : "", [&] {
                       std::string s;
                       for (int64_t n : placement_.numel) s += (s.empty() ? "" : ", ") + std::to_string(n);
                       return s;
                     }());
}

at::Tensor GroupPsAggregator::pack(int server) const {
  at::Tensor flat = at::zeros({placement_.numel[static_cast<size_t>(server)]}, at::kFloat);
  int64_t offset = 0;
  for (size_t i : placement_.held[static_cast<size_t>(server)]) {
    const Value& p = trainable_[i].second;
    if (p.impl()->grad.defined()) flat.narrow(0, offset, p.numel()).copy_(p.impl()->grad.reshape({-1}));
    offset += p.numel();
  }
  return flat;
}

void GroupPsAggregator::unpack(int server, const at::Tensor& flat) {
  std::vector<at::Tensor> tensors;
  for (size_t i : placement_.held[static_cast<size_t>(server)]) {
    const Value& p = trainable_[i].second;
    tensors.push_back(p.impl()->tensor);
    p.impl()->grad = at::Tensor();
  }
  dist::unpack_parameters(flat, tensors);  // distributed/topology.h
}

ServerStep GroupPsAggregator::exchange(int64_t step, double share, double loss_sum, double samples, int stop_signal) {
  for (int j = 0; j < servers_; ++j) {  // every push first, so the servers work at once
    Push push;
    push.rank = clients_[static_cast<size_t>(j)]->channel().rank() - 1;
    push.base_version = versions_[static_cast<size_t>(j)];
    push.step = step;
    push.share = share;
    push.loss_sum = loss_sum;
    push.samples = samples;
    push.stop_signal = stop_signal;
    push.gradient = pack(j);
    clients_[static_cast<size_t>(j)]->push(push);
  }
  ServerStep out;
  int64_t newest = 0;
  bool dropped = false;
  for (int j = 0; j < servers_; ++j) {
    const auto sj = static_cast<size_t>(j);
    const Reply reply = clients_[sj]->await_reply(received_[sj]);
    versions_[sj] = reply.version;
    newest = std::max(newest, reply.version);
    dropped = dropped || reply.dropped;
    if (j == 0) out.loss = reply.loss;
    out.stop_signal = std::max(out.stop_signal, reply.stop_signal);
    unpack(j, received_[sj]);
  }
  ++pushes_;
  dropped_ += dropped ? 1 : 0;
  // A late backup worker adopts the newest version as its step (the loop's next step is that version).
  if (options_.mode == PsAggregation::BackupWorkers && newest > step + 1) out.adopt_step = newest - 1;
  return out;
}

// Server j's state (state_of) into a checkpoint's weights (model order) and optimiser entries (the
// step count and rate once, from the first server).
void GroupPsAggregator::split(const optim::NamedTensors& states, optim::NamedTensors& weights,
                              optim::NamedTensors& optimizer_state, bool first) const {
  for (const auto& [key, t] : states) {
    if (key.rfind("w:", 0) == 0) weights.emplace_back(key.substr(2), t);
    if (key.rfind("o:", 0) == 0 && (per_parameter_entry(key.substr(2)) || first))
      optimizer_state.emplace_back(key.substr(2), t);
  }
}

void GroupPsAggregator::snapshot(optim::NamedTensors& weights, optim::NamedTensors& optimizer_state) {
  RATION_CHECK(clients_.front()->channel().rank() == 1, "the parameter servers' snapshot: worker 0 asks for it");
  optim::NamedTensors w, state;
  if (final_weights_) {
    w = *final_weights_;
    state = *final_state_;
  } else {
    for (int j = 0; j < servers_; ++j) {
      const auto& client = clients_[static_cast<size_t>(j)];
      client->request_snapshot();
      split(receive_named_tensors(client->channel(), 0, kSnapshotTag), w, state, j == 0);
    }
  }
  // Weights in model order, as a checkpoint written by one process holds them.
  for (const auto& [name, p] : trainable_)
    for (const auto& [n, t] : w)
      if (n == name) weights.emplace_back(n, t);
  for (auto& e : state) optimizer_state.push_back(e);
}

std::optional<Traffic> GroupPsAggregator::finish(const World&, const std::vector<at::Tensor>&) {
  for (auto& client : clients_) client->finish();
  if (clients_.front()->channel().rank() != 1) return std::nullopt;
  // Worker 0: every server's final state once every worker has finished; it becomes the run's model and
  // optimiser state (what the final checkpoint and evaluation see).
  optim::NamedTensors w, state;
  for (int j = 0; j < servers_; ++j) {
    const auto& client = clients_[static_cast<size_t>(j)];
    optim::NamedTensors got = receive_named_tensors(client->channel(), 0, kFinalTag);
    nlohmann::json stats = nlohmann::json::parse(std::string(
        reinterpret_cast<const char*>(got.back().second.data_ptr<uint8_t>()), static_cast<size_t>(got.back().second.numel())));
    got.pop_back();  // "stats": the server's counts, as JSON text
    server_stats_.push_back(stats);
    split(got, w, state, j == 0);
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : trainable_)
    for (const auto& [n, t] : w)
      if (n == name) p.impl()->tensor.copy_(t);
  context_.optimizer->import_state(state);
  final_weights_ = w;
  final_state_ = state;
  return std::nullopt;
}

nlohmann::json GroupPsAggregator::report() {
  nlohmann::json j = {{"aggregation", to_string(options_.mode)}, {"servers", servers_}, {"workers", workers_},
                      {"pushes", pushes_}, {"dropped", dropped_}, {"elements_per_server", placement_.numel}};
  int64_t bytes = 0;
  for (const auto& c : clients_) bytes += c->bytes_sent();
  j["bytes_pushed"] = bytes;
  j["bytes_sent_per_step"] = static_cast<double>(bytes) / static_cast<double>(std::max<int64_t>(pushes_, 1));
  if (!server_stats_.empty()) j["server_stats"] = server_stats_;
  return j;
}

}  // namespace

std::unique_ptr<Aggregator> make_ps_group_aggregator(const PsAggregationOptions& options, int servers) {
  return std::make_unique<GroupPsAggregator>(options, servers);
}

nlohmann::json serve_parameter_shard(const AggregatorContext& context, const PsAggregationOptions& options,
                                     int servers) {
  check_group(context, options, servers);
  const int workers = context.everyone.size() - servers;
  const int j = context.everyone.rank() - workers;
  RATION_CHECK(j >= 0 && j < servers, "serve_parameter_shard runs on the servers, ranks [", workers, ", ",
               workers + servers, ")");
  std::vector<int> server_ranks(static_cast<size_t>(servers));
  std::iota(server_ranks.begin(), server_ranks.end(), workers);
  const World group = context.everyone.subgroup("ps-servers", server_ranks);
  const World channel = context.everyone.subgroup("ps-shard-" + std::to_string(j), shard_members(j, workers));
  const optim::NamedParams trainable = trainable_of(context.params);
  const Placement placement = place(trainable, servers);
  ShardModel model(context, trainable, placement.held[static_cast<size_t>(j)], group);
  auto aggregator = std::make_shared<PsAggregator>(workers, server_rule(options), model, context.first_step);
  {
    PsServerLinks links(channel, aggregator, /*worker_offset=*/1, [&](const World& ch, int rank) {
      aggregator->with_model([&](ServerModel&, int64_t) { send_named_tensors(ch, rank, state_of(model), kSnapshotTag); });
    });
    links.wait_for_workers();  // throws CollectiveError naming a lost worker
  }
  const nlohmann::json stats = stats_json(aggregator->stats());
  optim::NamedTensors final_state = state_of(model);
  const std::string text = stats.dump();
  final_state.emplace_back(
      "stats", at::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, at::kByte).clone());
  send_named_tensors(channel, 1, final_state, kFinalTag);  // to worker 0
  return {{"role", "server"}, {"server", j}, {"elements", placement.numel[static_cast<size_t>(j)]}, {"stats", stats}};
}

}  // namespace ration::dist
