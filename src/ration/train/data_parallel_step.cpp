#include "ration/train/data_parallel_step.h"

#include <chrono>
#include <csignal>
#include <thread>

#include "ration/base/check.h"
#include "ration/distributed/aggregator_factory.h"
#include "ration/base/allocator.h"
#include "ration/distributed/kfac.h"
#include "ration/distributed/reducer.h"
#include "ration/optim/clip.h"
#include "ration/train/es_step.h"
#include "ration/train/signals.h"

namespace ration::train {

DataParallelKeys read_data_parallel_keys(Config& cfg) {
  DataParallelKeys k;
  k.dp = dist::read_data_parallel_settings(cfg);
  // data.sampling: a global permutation per epoch, bootstrap draws, or each rank shuffling a fixed shard
  // of its own (data/dataset.h).
  const std::string sampling = cfg.get_choice("data.sampling", "shuffle", {"shuffle", "bootstrap", "local_shuffle"});
  k.sampling = sampling == "bootstrap"       ? data::Sampling::Bootstrap
               : sampling == "local_shuffle" ? data::Sampling::LocalShuffle
                                             : data::Sampling::Shuffle;
  k.drop_last = cfg.get_bool("data.drop_last", true);
  k.members = dist::aggregation_traits(k.dp, cfg.origin()).members;
  if (k.members) k.sampling = data::Sampling::Bootstrap;  // each member its own bootstrap sample
  return k;
}

// The reducer attached to the step: each backward's weight is set after forward (the reducer's own
// gradient-ready hooks fill and launch the buckets during backward); the window is finalised before
// clipping and the optimiser, and the aggregator's parameter traffic follows the step.
class DataParallelStep::ReducerHook : public StepHook {
 public:
  explicit ReducerHook(dist::Reducer& reducer) : reducer_(reducer) {}
  void set_weight(double weight) { weight_ = weight; }
  void after_forward(int64_t step, const Value& loss) override {
    reducer_.aggregator().before_backward(step);
    reducer_.set_window_context({step});
    reducer_.prepare_backward(weight_);
  }
  void before_optimizer(int64_t step) override {
    if (reducer_.window_complete()) reducer_.finalize();
  }
  void after_step(int64_t step, const StepStats& stats) override { reducer_.after_optimizer_step(); }

 private:
  dist::Reducer& reducer_;
  double weight_ = 1;
};

// K-FAC: on a collecting step the layer observer is installed from the first forward to the optimiser; the
// natural gradient replaces the (reduced) gradient before clipping and the optimiser. Registered after the
// reducer's hook, so its before_optimizer sees the finalised gradients.
class DataParallelStep::KfacHook : public StepHook {
 public:
  KfacHook(dist::Kfac& kfac, optim::Optimizer& optimizer) : kfac_(kfac), optimizer_(optimizer) {}
  void before_forward(int64_t step, data::Batch& batch) override {
    if (step == observing_step_ || !kfac_.collects(step)) return;
    observing_step_ = step;
    kfac_.begin_statistics();
    scope_ = std::make_unique<nn::LayerObserverScope>(&kfac_);
  }
  void before_optimizer(int64_t step) override {
    scope_.reset();
    kfac_.precondition(step, optimizer_.lr());
  }

 private:
  dist::Kfac& kfac_;
  optim::Optimizer& optimizer_;
  int64_t observing_step_ = -1;
  std::unique_ptr<nn::LayerObserverScope> scope_;
};

DataParallelStep::DataParallelStep(const dist::JobRoles& roles, const DataParallelKeys& keys,
                                   const optim::NamedParams& params, optim::Optimizer& optimizer,
                                   const RunSettings& run, uint64_t seed, std::string origin)
    : world_(roles.workers), everyone_(roles.everyone), server_(roles.server), keys_(keys), params_(params),
      optimizer_(optimizer), run_(run), seed_(seed), origin_(std::move(origin)) {
  if (server_ >= 0) return;  // a dedicated parameter server: serve() is all it does
  const int n = world_.size();
  RATION_CHECK(keys_.dp.weights.empty() || static_cast<int>(keys_.dp.weights.size()) == n, origin_,
               ": dist.weights must hold one weight per rank: ", n, " ranks, got ", keys_.dp.weights.size(),
               " weights");
  // One process has no server to wait for: a parameter server's partial modes are its synchronous one.
  dist::DataParallelSettings settings = keys_.dp;
  if (world_.size() <= 1) settings.ps.mode = dist::PsAggregation::Synchronous;
  owned_aggregator_ = dist::make_aggregator(settings, &optimizer_, origin_);
  aggregator_ = owned_aggregator_.get();
  RATION_CHECK(!evolution_strategies() || (keys_.dp.topology == dist::Topology::AllReduce &&
                                           keys_.dp.aggregate == dist::Aggregate::Gradients &&
                                           keys_.dp.compress == "none" && keys_.dp.reducer.sync_every == 1 &&
                                           keys_.drop_last && !keys_.members),
               origin_, ": optim.name = \"es\" sends only the population's losses (one all-reduce per step): "
               "dist.topology, dist.aggregate, dist.compress and dist.sync_every must keep their defaults and "
               "data.drop_last must be true (every rank evaluates its pairs on a batch)");
  RATION_CHECK(!natural_gradient() || (keys_.dp.topology == dist::Topology::AllReduce &&
                                       keys_.dp.aggregate == dist::Aggregate::Gradients &&
                                       keys_.dp.compress == "none" && keys_.drop_last),
               origin_, ": optim.name = \"kfac\" preconditions the global gradient with factors all-reduced over "
               "every rank: it needs dist.topology = \"allreduce\", dist.aggregate = \"gradients\", dist.compress = "
               "\"none\" and data.drop_last = true (every rank observes a batch at every step)");
}

DataParallelStep::~DataParallelStep() = default;

bool DataParallelStep::active() const {
  return world_.size() > 1 || keys_.dp.servers > 0 || keys_.dp.reducer.sync_every > 1 || evolution_strategies() || natural_gradient();
}

bool DataParallelStep::central() const { return reducer_ && aggregator_->central(); }

int64_t DataParallelStep::fixed_bytes(int64_t num_parameters) const {
  if (!active()) return 0;
  if (evolution_strategies()) return 2 * 4 * num_parameters;  // the parameters' copy and the estimate
  int64_t factors = 0;  // K-FAC: the factors and their inverses, (in+1)^2 + out^2 floats each, twice
  for (const auto& [name, p] : params_)
    if (natural_gradient() && (p.dim() == 2 || p.dim() == 4)) {
      const int64_t out = p.size(0), in = p.numel() / p.size(0) + 1;
      factors += 2 * 4 * (in * in + out * out);
    }
  // The buckets, the aggregator's state.
  return 4 * num_parameters + aggregator_->fixed_bytes(num_parameters) + factors;
}

std::string DataParallelStep::attach(StepRuntime& runtime, const optim::WarmupCosine& schedule, int64_t first_step,
                                     const optim::NamedTensors& resumed) {
  if (!active()) return {};
  if (evolution_strategies()) {
    optim::NamedParams trainable;
    for (const auto& [name, p] : params_)
      if (p.requires_grad()) trainable.emplace_back(name, p);
    es_ = std::make_unique<EsStep>(world_, trainable, EsSettings{run_.es_population, run_.es_sigma}, seed_);
    return {};
  }
  const int n = world_.size();
  RATION_CHECK(keys_.dp.debug_delay_ms == 0 || keys_.dp.debug_delay_rank < n, origin_,
               ": dist.debug_delay_rank must name a rank in [0, ", n, ") or be -1, got ", keys_.dp.debug_delay_rank);
  RATION_CHECK(keys_.dp.ps.mode != dist::PsAggregation::BackupWorkers || n <= 1 || keys_.dp.ps.backup_workers < n,
               origin_, ": dist.backup_workers must be in [1, ", n - 1, "] with ", n,
               " ranks (each round aggregates the first N - k pushes), got ", keys_.dp.ps.backup_workers);
  reducer_ = std::make_unique<dist::Reducer>(world_, params_, std::move(owned_aggregator_), keys_.dp.reducer);
  reducer_hook_ = std::make_unique<ReducerHook>(*reducer_);
  const dist::AggregatorContext context = make_context(schedule, first_step, resumed);
  const std::string note = aggregator_->attach(context);
  runtime.add_hook(reducer_hook_.get());
  if (natural_gradient()) {
    kfac_ = std::make_unique<dist::Kfac>(
        world_, params_,
        dist::KfacOptions{run_.kfac_update_every, run_.kfac_damping, run_.kfac_stat_decay, run_.kfac_kl_clip});
    kfac_hook_ = std::make_unique<KfacHook>(*kfac_, optimizer_);
    runtime.add_hook(kfac_hook_.get());
  }
  return note;
}

dist::AggregatorContext DataParallelStep::make_context(const optim::WarmupCosine& schedule, int64_t first_step,
                                                       const optim::NamedTensors& resumed) {
  dist::AggregatorContext context;
  context.world = world_;
  context.everyone = everyone_;
  context.params = params_;
  context.optimizer = &optimizer_;
  context.make_optimizer = [this](const optim::NamedParams& p) { return build_optimizer(run_, p); };
  context.clip_grad_norm = run_.clip_grad_norm;
  context.schedule = &schedule;
  context.first_step = first_step;
  context.resumed = resumed;
  context.origin = origin_;
  return context;
}

nlohmann::json DataParallelStep::serve(const optim::WarmupCosine& schedule, int64_t first_step,
                                       const optim::NamedTensors& resumed) {
  RATION_CHECK(server_ >= 0, "DataParallelStep::serve runs on a dedicated parameter server");
  dist::PsAggregationOptions rule = keys_.dp.ps;
  // One worker has nothing to wait for: its partial modes are the synchronous one (as on the workers).
  if (everyone_.size() - keys_.dp.servers <= 1) rule = {};
  return dist::serve_parameter_shard(make_context(schedule, first_step, resumed), rule,
                                     static_cast<int>(keys_.dp.servers));
}

// This rank's share of a step: its samples / the step's samples over every rank, or, with dist.weights,
// its weight / their sum (0 when it has no samples this step).
double DataParallelStep::rank_share(int64_t mine, int64_t step_samples) const {
  if (mine == 0) return 0;
  if (keys_.dp.weights.empty()) return static_cast<double>(mine) / static_cast<double>(std::max<int64_t>(step_samples, 1));
  double total = 0;
  for (double w : keys_.dp.weights) total += w;
  return keys_.dp.weights[static_cast<size_t>(world_.rank())] / total;
}

// sync_every micro-batches of this rank's shard; each backward weighted by its share of the step's
// samples over every rank (known before the first from the shard arithmetic); the last one's backward
// launches the buckets and the runtime's before_optimizer hook waits for them.
StepStats DataParallelStep::step(StepRuntime& runtime, models::Model& model, data::Loader& loader,
                                 const data::Dataset& set, int64_t& step,
                                 const std::function<StepOptions(uint64_t)>& options, int64_t& items_out) {
  const auto t0 = SteadyClock::now();
  // Test aid (dist.debug_delay_ms): this rank computes slowly, so its gradient (or its losses) come late.
  if (keys_.dp.debug_delay_ms > 0 && world_.rank() == keys_.dp.debug_delay_rank)
    std::this_thread::sleep_for(std::chrono::milliseconds(keys_.dp.debug_delay_ms));
  if (es_) return es_step(model, loader, set, step, items_out);
  const auto micro_batches = static_cast<size_t>(keys_.dp.reducer.sync_every);
  std::vector<std::vector<int64_t>> micro(micro_batches);
  int64_t step_samples = 0;
  for (auto& m : micro) {
    m = loader.next_indices();
    step_samples += loader.last_global_items();
  }
  int64_t my_samples = 0;
  for (const auto& m : micro) my_samples += static_cast<int64_t>(m.size());
  const double share = rank_share(my_samples, step_samples);
  StepStats st;
  double ms = 0, loss_sum = 0;
  int64_t samples = 0, items = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    // This micro-batch's part of this rank's share of the step (by default its samples / the step's).
    const double weight =
        keys_.dp.weights.empty() ? static_cast<double>(micro[k].size()) / static_cast<double>(step_samples)
        : my_samples > 0         ? share * static_cast<double>(micro[k].size()) / static_cast<double>(my_samples)
                                 : 0.0;
    StepOptions o = options(k);
    const bool last = k + 1 == micro.size();
    if (!last || !aggregator_->steps_locally()) o.optimizer = nullptr;  // accumulate, or a server steps
    if (micro[k].empty()) {  // a short last batch left this rank nothing: it contributes zeros
      reducer_->prepare_backward(0);
      if (last && aggregator_->steps_locally()) finish_without_batch();
      continue;
    }
    const data::Batch batch = set.get(micro[k]);  // workspace: device memory
    reducer_hook_->set_weight(weight);
    st = runtime.measure_step(model, batch, o);
    ms += st.ms;
    loss_sum += st.loss * static_cast<double>(micro[k].size());
    samples += static_cast<int64_t>(micro[k].size());
    items += batch.items;
  }
  if (!aggregator_->steps_locally())
    return exchange_with_server(st, t0, loss_sum, samples, items, share, loader, step, items_out);
  st.ms = ms;
  return agree(st, loss_sum, samples, items, items_out);
}

// The step's loss: the mean over every rank's samples. The same message carries each rank's stop request
// (SIGINT / SIGTERM seen so far), so every rank stops after the same step.
StepStats DataParallelStep::agree(StepStats st, double loss_sum, int64_t samples, int64_t items, int64_t& items_out) {
  const int signal = InterruptScope::requested();
  const std::vector<double> sums = dist::all_reduce_doubles(
      world_, {loss_sum, static_cast<double>(samples), static_cast<double>(items), signal == SIGINT ? 1.0 : 0.0,
               signal != 0 && signal != SIGINT ? 1.0 : 0.0});
  agreed_stop_ = sums[3] > 0 ? SIGINT : sums[4] > 0 ? SIGTERM : 0;
  st.loss = sums[0] / std::max(sums[1], 1.0);
  items_out = static_cast<int64_t>(sums[2]);
  return st;
}

// Evolution strategies: this rank's pairs on its shard of the step's batch, the losses all-reduced, the
// estimate as every parameter's gradient, then clipping and the run's optimiser (its schedule was applied).
StepStats DataParallelStep::es_step(models::Model& model, data::Loader& loader, const data::Dataset& set,
                                    int64_t step, int64_t& items_out) {
  const auto t0 = SteadyClock::now();
  const std::vector<int64_t> indices = loader.next_indices();
  RATION_CHECK(!indices.empty(), origin_, ": optim.name = \"es\": rank ", world_.rank(), " got no batch at step ",
               step, " (more ranks than items in a batch?)");
  const data::Batch batch = set.get(indices);
  memory::reset_peak();
  const double loss = es_->estimate(model, &batch, step);
  if (run_.clip_grad_norm > 0) optim::clip_grad_norm(params_, run_.clip_grad_norm);
  optimizer_.step();
  optimizer_.zero_grad();
  StepStats st;
  st.step = step;
  st.ms = ms_since(t0);
  st.memory = memory::stats();
  st.peak_bytes = memory::device_peak_bytes(st.memory);
  // Every rank's losses are in the population's mean already; the agreement adds the items and stops.
  return agree(st, loss * static_cast<double>(indices.size()), static_cast<int64_t>(indices.size()), batch.items,
               items_out);
}

// A server steps (partial / asynchronous aggregation): hand it this rank's weighted gradient, take the
// global parameters back. No collective: the step's loss is the mean over the pushes the server's last
// update aggregated, and a stop request travels in the push (every rank stops at its next reply). A late
// rank told to adopt the server's step skips the data of the steps it missed.
StepStats DataParallelStep::exchange_with_server(StepStats st, SteadyClock::time_point t0, double loss_sum,
                                                 int64_t samples, int64_t items, double share,
                                                 data::Loader& loader, int64_t& step, int64_t& items_out) {
  reducer_->finalize();
  const dist::ServerStep reply =
      aggregator_->exchange(step, share, loss_sum, static_cast<double>(samples), InterruptScope::requested());
  agreed_stop_ = reply.stop_signal;
  if (reply.adopt_step > step) {
    for (int64_t skipped = step + 1; skipped <= reply.adopt_step; ++skipped)
      for (int64_t k = 0; k < keys_.dp.reducer.sync_every; ++k) (void)loader.next_indices();
    step = reply.adopt_step;
  }
  st.loss = reply.loss;
  st.ms = ms_since(t0);
  items_out = items;  // this rank's (there is no per-step sum over ranks)
  return st;
}

// The synchronising micro-batch of a rank without data: join the reduction, then the same update.
void DataParallelStep::finish_without_batch() {
  reducer_->finalize();
  if (run_.clip_grad_norm > 0) optim::clip_grad_norm(params_, run_.clip_grad_norm);
  optimizer_.step();
  optimizer_.zero_grad();
  reducer_->after_optimizer_step();
}

bool DataParallelStep::checkpoint(optim::NamedTensors& weights, optim::NamedTensors& state,
                                  optim::NamedTensors& residuals) {
  residuals = reducer_ ? aggregator_->gather_state(world_) : optim::NamedTensors{};
  if (!central() || world_.rank() != 0) return false;
  aggregator_->snapshot(weights, state);  // the server's global model and optimiser, not rank 0's working copy
  return true;
}

void DataParallelStep::finish() {
  if (reducer_) reducer_->finish();
}

int64_t DataParallelStep::bucket_bytes() const { return reducer_ ? reducer_->bucket_bytes() : 0; }

nlohmann::json DataParallelStep::report() const {
  nlohmann::json d = {{"world_size", world_.size()}, {"rank", world_.rank()}};
  if (kfac_)
    d["kfac"] = {{"updates", kfac_->updates()}, {"last_nu", kfac_->last_nu()}, {"state_bytes", kfac_->state_bytes()},
                 {"update_every", run_.kfac_update_every}, {"damping", run_.kfac_damping}};
  if (es_) {
    d["es"] = {{"population", es_->settings().population}, {"sigma", es_->settings().sigma},
               {"bytes_sent_per_step", es_->bytes_per_step()}};
    return d;
  }
  if (!reducer_) return d;
  const dist::ReducerStats& st = reducer_->stats();
  const double syncs = static_cast<double>(std::max<int64_t>(st.synchronizations, 1));
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : reducer_->buckets()) buckets.push_back(b.numel * 4);
  d.update({{"backend", dist::to_string(world_.backend())},
            {"topology", aggregator_->name()},
            {"compress", keys_.dp.compress},
            {"sync_every", keys_.dp.reducer.sync_every},
            {"sampling", data::to_string(keys_.sampling)},
            {"weights", keys_.dp.weights.empty() ? nlohmann::json("samples") : nlohmann::json(keys_.dp.weights)},
            {"bucket_bytes", buckets},
            {"synchronizations", st.synchronizations},
            {"bytes_sent_per_step", static_cast<double>(st.traffic.payload_bytes) / syncs},
            {"wire_bytes_per_step", static_cast<double>(st.traffic.wire_bytes) / syncs},
            {"comm_ms", st.comm_ms / syncs},
            {"exposed_comm_ms", st.exposed_ms / syncs},
            {"parameter_exchange_ms", st.exchange_ms / syncs},
            {"overlap", st.overlap()},
            {"error_feedback_bytes", aggregator_->state_bytes()}});
  d.update(aggregator_->report());
  return d;
}

}  // namespace ration::train
