#include "ration/train/data_parallel_step.h"

#include <chrono>
#include <csignal>
#include <thread>

#include "ration/base/check.h"
#include "ration/distributed/comm_hook.h"
#include "ration/distributed/reducer.h"
#include "ration/optim/adamw.h"
#include "ration/optim/clip.h"
#include "ration/train/ps_exchange.h"
#include "ration/train/signals.h"

namespace ration::train {

DataParallelKeys read_data_parallel_keys(Config& cfg) {
  DataParallelKeys k;
  k.dp = dist::read_data_parallel_settings(cfg);
  k.sampling = cfg.get_choice("data.sampling", "shuffle", {"shuffle", "bootstrap"}) == "bootstrap"
                   ? data::Sampling::Bootstrap
                   : data::Sampling::Shuffle;
  k.drop_last = cfg.get_bool("data.drop_last", true);
  return k;
}

// The reducer attached to the step: each backward's weight is set after forward (the reducer's own
// gradient-ready hooks fill and launch the buckets during backward); the window is finalised before
// clipping and the optimiser. A onebit hook coding in the update space (dist.onebit_space = "update")
// takes AdamW's denominators before its compressed steps.
class DataParallelStep::ReducerHook : public StepHook {
 public:
  ReducerHook(dist::Reducer& reducer, optim::Optimizer& optimizer) : reducer_(reducer), optimizer_(optimizer) {}
  void set_weight(double weight) { weight_ = weight; }
  void after_forward(int64_t step, const Value& loss) override {
    give_denominators_if_due(step);
    reducer_.set_window_context({step});
    reducer_.prepare_backward(weight_);
  }
  void before_optimizer(int64_t step) override {
    if (reducer_.window_complete()) reducer_.finalize();
  }
  void after_step(int64_t step, const StepStats& stats) override { reducer_.after_optimizer_step(); }

 private:
  void give_denominators_if_due(int64_t step) {
    auto* onebit = dynamic_cast<dist::OneBitHook*>(&reducer_.hook());
    if (!onebit || !onebit->denominators_due(step)) return;
    auto* adamw = dynamic_cast<optim::AdamW*>(&optimizer_);
    RATION_ASSERT(adamw != nullptr, "dist.onebit_space = \"update\" without an AdamW optimiser");
    onebit->set_denominators(reducer_.bucket_layout_of(adamw->denominators(), 1.f));
  }
  dist::Reducer& reducer_;
  optim::Optimizer& optimizer_;
  double weight_ = 1;
};

// onebit with dist.onebit_second_moment = "freeze": AdamW's second moment stays as it was after the last
// fp32 warm-up step; both it and dist.onebit_space = "update" use AdamW's second moment
// (docs/DISTRIBUTED.md, "1-bit compression").
DataParallelStep::DataParallelStep(const dist::World& world, const DataParallelKeys& keys,
                                   const optim::NamedParams& params, optim::Optimizer& optimizer,
                                   const RunSettings& run, std::string origin)
    : world_(world), keys_(keys), params_(params), optimizer_(optimizer), run_(run), origin_(std::move(origin)) {
  if (keys_.dp.compress != "onebit") return;
  const bool freeze = keys_.dp.onebit.second_moment == dist::SecondMoment::Freeze;
  if (!freeze && keys_.dp.onebit.space == dist::CodeSpace::Gradient) return;
  auto* adamw = dynamic_cast<optim::AdamW*>(&optimizer_);
  RATION_CHECK(adamw != nullptr, origin_,
               ": dist.onebit_second_moment = \"freeze\" and dist.onebit_space = \"update\" use AdamW's second "
               "moment; they need optim.name = \"adamw\" (SGD keeps none), got \"", run_.optimizer, "\"");
  if (freeze) adamw->freeze_second_moment(keys_.dp.onebit.warmup_steps);
}

DataParallelStep::~DataParallelStep() = default;

bool DataParallelStep::active() const { return world_.size() > 1 || keys_.dp.reducer.sync_every > 1; }

int64_t DataParallelStep::fixed_bytes(int64_t num_parameters) const {
  if (!active()) return 0;
  const bool onebit = keys_.dp.compress == "onebit";
  const bool residual = onebit && keys_.dp.onebit.feedback == dist::ErrorFeedback::On;
  const bool denominator = onebit && keys_.dp.onebit.space == dist::CodeSpace::Update;
  return (1 + (residual ? 1 : 0) + (denominator ? 1 : 0)) * 4 * num_parameters;
}

std::string DataParallelStep::attach(StepRuntime& runtime, const optim::WarmupCosine& schedule, int64_t first_step,
                                     const optim::NamedTensors& resumed) {
  if (!active()) return {};
  reducer_ = std::make_unique<dist::Reducer>(world_, params_, dist::make_comm_hook(keys_.dp.compress, keys_.dp.onebit, origin_),
                                             keys_.dp.reducer);
  reducer_hook_ = std::make_unique<ReducerHook>(*reducer_, optimizer_);
  // dist.backup_workers / dist.sync = "async" (train/ps_exchange.h): every rank opens the parameter
  // server's channel; rank 0 builds the global model's copy and serves it.
  const int n = world_.size();
  RATION_CHECK(keys_.dp.debug_delay_ms == 0 || keys_.dp.debug_delay_rank < n, origin_,
               ": dist.debug_delay_rank must name a rank in [0, ", n, ") or be -1, got ", keys_.dp.debug_delay_rank);
  if (keys_.dp.ps.mode != dist::PsAggregation::Synchronous && n > 1) {
    RATION_CHECK(keys_.dp.ps.mode != dist::PsAggregation::BackupWorkers || keys_.dp.ps.backup_workers < n, origin_,
                 ": dist.backup_workers must be in [1, ", n - 1, "] with ", n,
                 " ranks (each round aggregates the first N - k pushes), got ", keys_.dp.ps.backup_workers);
    ps_ = std::make_unique<PsExchange>(world_, keys_.dp.ps, params_, run_, optimizer_, schedule, first_step);
  }
  const std::string note = dist::restore_hook_state(world_, reducer_->hook(), resumed);
  runtime.add_hook(reducer_hook_.get());
  return note;
}

// sync_every micro-batches of this rank's shard; each backward weighted by its share of the step's
// samples over every rank (known before the first from the shard arithmetic); the last one's backward
// launches the buckets and the runtime's before_optimizer hook waits for them.
StepStats DataParallelStep::step(StepRuntime& runtime, models::Model& model, data::Loader& loader,
                                 const data::Dataset& set, int64_t& step,
                                 const std::function<StepOptions(uint64_t)>& options, int64_t& items_out) {
  const auto t0 = SteadyClock::now();
  // Test aid (dist.debug_delay_ms): this rank computes slowly, so its gradient comes late.
  if (keys_.dp.debug_delay_ms > 0 && world_.rank() == keys_.dp.debug_delay_rank)
    std::this_thread::sleep_for(std::chrono::milliseconds(keys_.dp.debug_delay_ms));
  const auto micro_batches = static_cast<size_t>(keys_.dp.reducer.sync_every);
  std::vector<std::vector<int64_t>> micro(micro_batches);
  int64_t step_samples = 0;
  for (auto& m : micro) {
    m = loader.next_indices();
    step_samples += loader.last_global_items();
  }
  StepStats st;
  double ms = 0, loss_sum = 0;
  int64_t samples = 0, items = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    const double weight = static_cast<double>(micro[k].size()) / static_cast<double>(step_samples);
    StepOptions o = options(k);
    const bool last = k + 1 == micro.size();
    if (!last || central()) o.optimizer = nullptr;  // accumulate (or the server steps): the reducer holds them
    if (micro[k].empty()) {  // a short last batch left this rank nothing: it contributes zeros
      reducer_->prepare_backward(0);
      if (last && !central()) finish_without_batch();
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
  if (central()) return exchange_with_server(st, t0, loss_sum, samples, items, step_samples, loader, step, items_out);
  // The step's loss: the mean over every rank's samples. The same message carries each rank's stop
  // request (SIGINT / SIGTERM seen so far), so every rank stops after the same step.
  const int signal = InterruptScope::requested();
  const std::vector<double> sums = dist::all_reduce_doubles(
      world_, {loss_sum, static_cast<double>(samples), static_cast<double>(items), signal == SIGINT ? 1.0 : 0.0,
               signal != 0 && signal != SIGINT ? 1.0 : 0.0});
  agreed_stop_ = sums[3] > 0 ? SIGINT : sums[4] > 0 ? SIGTERM : 0;
  st.loss = sums[0] / std::max(sums[1], 1.0);
  st.ms = ms;
  items_out = static_cast<int64_t>(sums[2]);
  return st;
}

// Partial / asynchronous aggregation: push this rank's weighted gradient, take the global parameters
// back. No collective: the step's loss is the mean over the pushes the server's last update aggregated,
// and a stop request travels in the push (every rank stops at its next reply). With backup workers a
// late rank adopts the server's version as its step and skips the data of the steps it missed.
StepStats DataParallelStep::exchange_with_server(StepStats st, SteadyClock::time_point t0, double loss_sum,
                                                 int64_t samples, int64_t items, int64_t step_samples,
                                                 data::Loader& loader, int64_t& step, int64_t& items_out) {
  reducer_->finalize();
  const double share = static_cast<double>(samples) / static_cast<double>(std::max<int64_t>(step_samples, 1));
  const dist::Reply reply =
      ps_->exchange(step, share, loss_sum, static_cast<double>(samples), InterruptScope::requested());
  agreed_stop_ = reply.stop_signal;
  if (keys_.dp.ps.mode == dist::PsAggregation::BackupWorkers && reply.version > step + 1) {
    for (int64_t skipped = step + 1; skipped < reply.version; ++skipped)
      for (int64_t k = 0; k < keys_.dp.reducer.sync_every; ++k) (void)loader.next_indices();
    step = reply.version - 1;  // the loop's ++step makes it the server's version
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
  residuals = reducer_ && !central() ? dist::gather_hook_state(world_, reducer_->hook()) : optim::NamedTensors{};
  if (!central() || world_.rank() != 0) return false;
  ps_->snapshot(weights, state);  // the server's global model and optimiser, not rank 0's working copy
  return true;
}

void DataParallelStep::finish(optim::Optimizer& optimizer) {
  if (ps_) ps_->finish(optimizer);  // rank 0: every worker done; the model holds the final global one
  if (reducer_) reducer_->average_parameters_now();  // dist.aggregate = "parameters": one final model
}

int64_t DataParallelStep::bucket_bytes() const { return reducer_ ? reducer_->bucket_bytes() : 0; }

nlohmann::json DataParallelStep::report() const {
  nlohmann::json d = {{"world_size", world_.size()}, {"rank", world_.rank()}};
  if (!reducer_) return d;
  const dist::ReducerStats& st = reducer_->stats();
  const double syncs = static_cast<double>(std::max<int64_t>(st.synchronizations, 1));
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : reducer_->buckets()) buckets.push_back(b.numel * 4);
  d.update({{"backend", dist::to_string(world_.backend())},
            {"topology", dist::to_string(keys_.dp.reducer.topology)},
            {"compress", reducer_->hook().name()},
            {"error_feedback", keys_.dp.onebit.feedback == dist::ErrorFeedback::On},
            {"sync_every", keys_.dp.reducer.sync_every},
            {"sampling", keys_.sampling == data::Sampling::Bootstrap ? "bootstrap" : "shuffle"},
            {"bucket_bytes", buckets},
            {"synchronizations", st.synchronizations},
            {"bytes_sent_per_step", static_cast<double>(st.traffic.payload_bytes) / syncs},
            {"wire_bytes_per_step", static_cast<double>(st.traffic.wire_bytes) / syncs},
            {"comm_ms", st.comm_ms / syncs},
            {"exposed_comm_ms", st.exposed_ms / syncs},
            {"parameter_exchange_ms", st.exchange_ms / syncs},
            {"overlap", st.overlap()},
            {"error_feedback_bytes", reducer_->hook_state_bytes()}});
  // onebit: the smallest lambda_j of the last step's code per bucket; the error bound is
  // sqrt(1 - lambda^2) ||v|| (docs/DISTRIBUTED.md). Bytes per compressed step apart from the fp32 warm-up
  // (dist.compress_warmup), whose steps the whole-run average bytes_sent_per_step includes.
  if (const auto* onebit = dynamic_cast<const dist::OneBitHook*>(&reducer_->hook())) {
    d["onebit_lambda"] = onebit->last_lambda();
    const dist::OneBitHook::Counts& c = onebit->counts();
    d["onebit"] = {{"warmup_steps", c.warmup_windows},
                   {"compressed_steps", c.compressed_windows},
                   {"bytes_sent_per_compressed_step",
                    c.compressed_windows ? static_cast<double>(c.compressed.payload_bytes) / c.compressed_windows : 0.0},
                   {"second_moment", keys_.dp.onebit.second_moment == dist::SecondMoment::Freeze ? "freeze" : "track"},
                   {"space", keys_.dp.onebit.space == dist::CodeSpace::Update ? "update" : "gradient"},
                   {"residual_bytes", onebit->residual_bytes()},
                   {"denominator_bytes", onebit->state_bytes() - onebit->residual_bytes()}};
  }
  if (keys_.dp.reducer.aggregate == dist::Aggregate::Parameters)
    d.update({{"aggregate", "parameters"}, {"average_every", keys_.dp.reducer.average_every}, {"averages", st.averages}});
  if (ps_) d.update(ps_->report());
  return d;
}

}  // namespace ration::train
