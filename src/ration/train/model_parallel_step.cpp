// model_parallel_step.cpp — see model_parallel_step.h; the method is in docs/DISTRIBUTED.md, "Model and
// hybrid parallelism".
#include "ration/train/model_parallel_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>

#include "ration/base/allocator.h"
#include "ration/base/check.h"
#include "ration/base/timing.h"
#include "ration/core/node.h"
#include "ration/distributed/agreed_profile.h"
#include "ration/distributed/data_parallel.h"
#include "ration/distributed/tensor_parallel.h"
#include "ration/optim/clip.h"

namespace ration::train {
namespace {

using Clock = std::chrono::steady_clock;

bool in_modules(const std::string& path, const std::vector<std::string>& modules) {
  for (const auto& m : modules)
    if (path == m || path.rfind(m + ".", 0) == 0) return true;
  return false;
}

// The unit a profiled node belongs to: the first unit one of whose modules is a prefix of the node's
// scope; nodes outside every unit's modules (the loss, a tied head's matmul) belong to the last unit.
int64_t unit_of_scope(const std::string& scope, const std::vector<std::vector<std::string>>& unit_modules) {
  for (size_t u = 0; u < unit_modules.size(); ++u)
    if (in_modules(scope, unit_modules[u])) return static_cast<int64_t>(u);
  return static_cast<int64_t>(unit_modules.size()) - 1;
}

// A shape as 9 int64s (rank, then up to 8 sizes): what a stage sends before an activation, so the next
// stage can allocate it.
constexpr int64_t kMaxDims = 8;
at::Tensor shape_header(const at::Tensor& t) {
  RATION_CHECK(t.dim() <= kMaxDims, "pipeline activations have at most ", kMaxDims, " dimensions; got ", t.sizes());
  at::Tensor h = at::zeros({kMaxDims + 1}, at::kLong);
  h[0] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[d + 1] = t.size(d);
  return h;
}
std::vector<int64_t> header_sizes(const at::Tensor& h) {
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < h[0].item<int64_t>(); ++d) sizes.push_back(h[d + 1].item<int64_t>());
  return sizes;
}

// Messages between two neighbour stages travel in one order on each side (every activation preceded by its
// shape; gradients the other way), so one tag serves a step's traffic and another evaluation's.
constexpr int kStepTag = 0;
constexpr int kEvalTag = 1;

}  // namespace

// ---- the split -----------------------------------------------------------------------------------------

double PipelineSplit::stage_ms(int64_t s) const {
  double ms = 0;
  for (int64_t u = first_unit[static_cast<size_t>(s)]; u < first_unit[static_cast<size_t>(s) + 1]; ++u)
    ms += unit_ms[static_cast<size_t>(u)];
  return ms;
}

int64_t PipelineSplit::stage_bytes(int64_t s) const {
  int64_t b = 0;
  for (int64_t u = first_unit[static_cast<size_t>(s)]; u < first_unit[static_cast<size_t>(s) + 1]; ++u)
    b += unit_saved_bytes[static_cast<size_t>(u)] + unit_param_bytes[static_cast<size_t>(u)];
  return b;
}

nlohmann::json PipelineSplit::to_json() const {
  nlohmann::json stages = nlohmann::json::array();
  for (int64_t s = 0; s < this->stages(); ++s) {
    std::vector<std::string> names(unit_names.begin() + first_unit[static_cast<size_t>(s)],
                                   unit_names.begin() + first_unit[static_cast<size_t>(s) + 1]);
    stages.push_back({{"stage", s}, {"units", names}, {"predicted_ms", stage_ms(s)},
                      {"parameter_and_activation_bytes", stage_bytes(s)}});
  }
  return stages;
}

std::vector<int64_t> balance_units(const std::vector<double>& unit_ms, const std::vector<int64_t>& unit_bytes,
                                   int64_t stages) {
  const auto n = static_cast<int64_t>(unit_ms.size());
  RATION_CHECK(stages >= 1 && stages <= n, "cannot split ", n, " units into ", stages, " stages");
  double total_ms = 0, total_bytes = 0;
  for (int64_t u = 0; u < n; ++u) {
    total_ms += unit_ms[static_cast<size_t>(u)];
    total_bytes += static_cast<double>(unit_bytes[static_cast<size_t>(u)]);
  }
  std::vector<double> ms_prefix(static_cast<size_t>(n) + 1, 0), bytes_prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t u = 0; u < n; ++u) {
    ms_prefix[static_cast<size_t>(u) + 1] = ms_prefix[static_cast<size_t>(u)] + unit_ms[static_cast<size_t>(u)] / std::max(total_ms, 1e-12);
    bytes_prefix[static_cast<size_t>(u) + 1] =
        bytes_prefix[static_cast<size_t>(u)] + static_cast<double>(unit_bytes[static_cast<size_t>(u)]) / std::max(total_bytes, 1.0);
  }
  auto cost = [&](int64_t a, int64_t b) {  // units [a, b)
    return std::max(ms_prefix[static_cast<size_t>(b)] - ms_prefix[static_cast<size_t>(a)],
                    bytes_prefix[static_cast<size_t>(b)] - bytes_prefix[static_cast<size_t>(a)]);
  };
  // best[s][u]: the smallest largest-stage cost of units [0, u) in s stages; from[s][u]: where stage s-1 begins.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1, std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(stages) + 1, std::vector<int64_t>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t u = s; u <= n; ++u)
      for (int64_t v = s - 1; v < u; ++v) {
        const double c = std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(v)], cost(v, u));
        if (c < best[static_cast<size_t>(s)][static_cast<size_t>(u)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(u)] = c;
          from[static_cast<size_t>(s)][static_cast<size_t>(u)] = v;
        }
      }
  std::vector<int64_t> bounds(static_cast<size_t>(stages) + 1, 0);
  bounds[static_cast<size_t>(stages)] = n;
  for (int64_t s = stages; s >= 1; --s)
    bounds[static_cast<size_t>(s) - 1] = from[static_cast<size_t>(s)][static_cast<size_t>(bounds[static_cast<size_t>(s)])];
  return bounds;
}

data::Batch micro_batch(const data::Batch& batch, int64_t index, int64_t count) {
  if (count == 1) return batch;
  RATION_CHECK(batch.sparse.empty(), "pipeline micro-batches of sparse (click-through) batches are not supported");
  const int64_t b = batch.input.size(0);
  RATION_CHECK(b % count == 0, "a batch of ", b, " does not split into parallel.micro_batches = ", count,
               " equal micro-batches; hint: make train.batch_size a multiple of ", count);
  const int64_t m = b / count;
  data::Batch out;
  out.input = Value(batch.input.tensor().narrow(0, index * m, m));
  for (const Value& extra : batch.extra_inputs) out.extra_inputs.emplace_back(extra.tensor().narrow(0, index * m, m));
  if (batch.target.defined()) out.target = Value(batch.target.tensor().narrow(0, index * m, m));
  out.items = batch.items / count;
  return out;
}

// ---- the pipeline: one stage's units, its schedule and its traffic -------------------------------------

class ModelParallelStep::Pipeline {
 public:
  Pipeline(models::Model& model, const dist::ParallelGroups& g, int64_t first_unit, int64_t end_unit,
           const dist::ParallelSettings& settings)
      : model_(model), world_(g.pipeline), stage_(g.layout.stage), stages_(g.layout.pipeline),
        first_unit_(first_unit), end_unit_(end_unit), micro_(settings.micro_batches), schedule_(settings.schedule) {}

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  int64_t micro_batches() const { return micro_; }
  int64_t in_flight() const {
    return schedule_ == dist::PipelineSchedule::GPipe ? micro_ : std::min<int64_t>(stages_ - stage_, micro_);
  }

  Value run_units(Value x) {
    for (int64_t u = first_unit_; u < end_unit_; ++u) x = model_.pipeline_unit(u, x);
    return x;
  }

  // One step of every micro-batch of `batch` on this stage (forward and backward, gradients accumulated
  // in the parameters). Returns the sum over micro-batches of loss / M on the last stage (0 elsewhere).
  double run(StepRuntime& runtime, const data::Batch& batch, const std::optional<uint64_t>& seed);

  // One micro-batch as a step of its own, with stand-ins for what neighbours send (the profile of a stage).
  // Returns the bytes it held between forward and backward (its input, output and saved activations).
  int64_t stand_alone(const data::Batch& mb, const std::vector<int64_t>& input_sizes) {
    const at::Device device = model_.parameter_options().device();
    const int64_t before = memory::device_current_bytes(device);
    int64_t held = 0;
    Value x = first() ? model_.model_input(mb) : Value(at::randn(input_sizes, model_.parameter_options()), true);
    if (last()) {  // the model's output is not held past the loss (as in run())
      Value loss = model_.output_loss(run_units(x), mb);
      held = memory::device_current_bytes(device) - before;
      loss.backward(at::scalar_tensor(1.0 / static_cast<double>(micro_), loss.tensor().options()));
    } else {
      Value y = run_units(x);
      held = memory::device_current_bytes(device) - before;
      y.backward(at::randn_like(y.tensor()));
    }
    return held;
  }

  models::EvalStats evaluate(const data::Batch& batch);

  double wait_ms = 0;       // blocked on a neighbour this step
  double compute_ms = 0;    // inside micro-batches' forward and backward this step
  int64_t sent_bytes = 0;   // activations and gradients sent this step

 private:
  struct Held {
    data::Batch mb;
    Value input;   // stages > 0: the received activation (a leaf whose gradient goes back)
    Value output;  // the activation sent on, or on the last stage the micro-batch's loss
  };
  int prev() const { return stage_ - 1; }
  int next() const { return stage_ + 1; }
  void exchange(const dist::World::PeerTensors& sends, const dist::World::PeerTensors& recvs, int t) {
    if (sends.empty() && recvs.empty()) return;
    for (const auto& [peer, t] : sends) sent_bytes += t.numel() * static_cast<int64_t>(t.element_size());
    const auto t0 = Clock::now();
    world_.send_recv(sends, recvs, t);
    wait_ms += ms_since(t0);
  }
  at::Tensor receive_activation(int tag = kStepTag);
  void forward(int64_t micro, const data::Batch& batch, const at::Tensor& received, StepRuntime& runtime,
               const std::optional<uint64_t>& seed, double& loss_sum);
  at::Tensor backward(int64_t micro, const at::Tensor& grad, StepRuntime& runtime);

  models::Model& model_;
  dist::World world_;
  int stage_, stages_;
  int64_t first_unit_, end_unit_, micro_;
  dist::PipelineSchedule schedule_;
  std::deque<Held> held_;  // forwarded, not yet backward, oldest first
  int64_t oldest_ = 0;     // micro-batch index of held_.front()
};

at::Tensor ModelParallelStep::Pipeline::receive_activation(int tag) {
  at::Tensor header = at::zeros({kMaxDims + 1}, at::kLong);
  exchange({}, {{prev(), header}}, tag);
  at::Tensor x = at::empty(header_sizes(header), model_.parameter_options());
  exchange({}, {{prev(), x}}, tag);
  return x;
}

void ModelParallelStep::Pipeline::forward(int64_t micro, const data::Batch& batch, const at::Tensor& received,
                                          StepRuntime& runtime, const std::optional<uint64_t>& seed,
                                          double& loss_sum) {
  const auto t0 = Clock::now();
  Held h;
  h.mb = micro_batch(batch, micro, micro_);
  runtime.begin_micro_batch(micro);
  // Dropout masks: a function of (step seed, micro-batch), so a resumed run draws what it would have.
  if (seed) manual_seed(*seed + static_cast<uint64_t>(micro) * 0x9E3779B97F4A7C15ULL);
  Value x = first() ? model_.model_input(h.mb) : Value(received, true);
  if (!first()) h.input = x;
  Value y = run_units(x);
  if (last()) {
    h.output = model_.output_loss(y, h.mb);
    loss_sum += h.output.item() / static_cast<double>(micro_);
  } else {
    h.output = y;
  }
  held_.push_back(std::move(h));
  compute_ms += ms_since(t0);
}

at::Tensor ModelParallelStep::Pipeline::backward(int64_t micro, const at::Tensor& grad, StepRuntime& runtime) {
  RATION_CHECK(!held_.empty() && micro == oldest_, "pipeline schedule: backward of micro-batch ", micro,
               " out of order (oldest held: ", oldest_, ")");
  const auto t0 = Clock::now();
  Held h = std::move(held_.front());
  held_.pop_front();
  ++oldest_;
  runtime.resume_micro_batch(micro);
  if (last()) {
    h.output.backward(at::scalar_tensor(1.0 / static_cast<double>(micro_), h.output.tensor().options()));
  } else {
    h.output.backward(grad);
  }
  at::Tensor dx = first() ? at::Tensor() : h.input.grad().contiguous();
  compute_ms += ms_since(t0);
  return dx;
}

// The non-interleaved 1F1B schedule (PipeDream-Flush, as Megatron-LM runs it): stage s runs
// min(P - s - 1, M) forwards to fill the pipe, then alternates one forward and one backward, then drains.
// Each exchange issues its sends and receives together (World::send_recv), so neighbours never wait on
// each other in a cycle. GPipe: every forward, then every backward.
double ModelParallelStep::Pipeline::run(StepRuntime& runtime, const data::Batch& batch,
                                        const std::optional<uint64_t>& seed) {
  wait_ms = 0;
  compute_ms = 0;
  sent_bytes = 0;
  held_.clear();
  oldest_ = 0;
  double loss_sum = 0;
  const int64_t warmup =
      schedule_ == dist::PipelineSchedule::GPipe ? micro_ : std::min<int64_t>(stages_ - stage_ - 1, micro_);
  const int64_t steady = micro_ - warmup;
  auto send_forward = [&](int64_t micro) {
    if (last()) return;
    const at::Tensor& y = held_.back().output.tensor();
    exchange({{next(), shape_header(y)}, {next(), y.contiguous()}}, {}, kStepTag);
  };
  auto input_of = [&](int64_t) { return first() ? at::Tensor() : receive_activation(); };
  auto output_grad = [&](int64_t micro) {  // an empty tensor on the last stage (its loss seeds backward)
    return last() ? at::Tensor() : at::empty_like(held_.front().output.tensor());
  };
  for (int64_t i = 0; i < warmup; ++i) {
    forward(i, batch, input_of(i), runtime, seed, loss_sum);
    send_forward(i);
  }
  at::Tensor x = steady > 0 ? input_of(warmup) : at::Tensor();
  for (int64_t i = 0; i < steady; ++i) {
    const int64_t f = warmup + i;
    forward(f, batch, x, runtime, seed, loss_sum);
    at::Tensor g = output_grad(i);
    if (!last()) {  // send this activation, receive the oldest's gradient
      const at::Tensor& y = held_.back().output.tensor();
      exchange({{next(), shape_header(y)}, {next(), y.contiguous()}}, {{next(), g}}, kStepTag);
    }
    const at::Tensor dx = backward(i, g, runtime);
    if (i + 1 == steady) {
      if (!first()) exchange({{prev(), dx}}, {}, kStepTag);
    } else if (!first()) {  // send this gradient, receive the next activation's shape, then the activation
      at::Tensor header = at::zeros({kMaxDims + 1}, at::kLong);
      exchange({{prev(), dx}}, {{prev(), header}}, kStepTag);
      x = at::empty(header_sizes(header), model_.parameter_options());
      exchange({}, {{prev(), x}}, kStepTag);
    }
  }
  for (int64_t i = steady; i < micro_; ++i) {
    at::Tensor g = output_grad(i);
    if (!last()) exchange({}, {{next(), g}}, kStepTag);
    const at::Tensor dx = backward(i, g, runtime);
    if (!first()) exchange({{prev(), dx}}, {}, kStepTag);
  }
  return loss_sum;
}

models::EvalStats ModelParallelStep::Pipeline::evaluate(const data::Batch& batch) {
  NoGradGuard no_grad;
  Value x = first() ? model_.model_input(batch) : Value(receive_activation(kEvalTag));
  Value y = run_units(x);
  models::EvalStats s;
  if (last()) {
    s = model_.output_evaluate(y, batch);
  } else {
    exchange({{next(), shape_header(y.tensor())}, {next(), y.tensor().contiguous()}}, {},
             kEvalTag);
  }
  // Every stage reports the last stage's counts (the caller sums over replicas).
  const std::vector<double> sums = dist::all_reduce_doubles(
      world_, {s.loss_sum, static_cast<double>(s.correct), static_cast<double>(s.count)});
  models::EvalStats out;
  out.loss_sum = sums[0];
  out.correct = static_cast<int64_t>(std::llround(sums[1]));
  out.count = static_cast<int64_t>(std::llround(sums[2]));
  return out;
}

// ---- evaluation through the pipeline, as a Model ------------------------------------------------------

class ModelParallelStep::EvalModel : public models::Model {
 public:
  EvalModel(models::Model& inner, Pipeline& pipeline) : inner_(inner), pipeline_(pipeline) {}
  Value loss(const data::Batch&) override {
    RATION_CHECK(false, "a pipeline stage trains through ModelParallelStep::step, not Model::loss");
    return {};
  }
  models::EvalStats evaluate(const data::Batch& batch) override {
    const bool was = inner_.is_training();
    inner_.train(is_training());
    models::EvalStats s = pipeline_.evaluate(batch);
    inner_.train(was);
    return s;
  }
  std::string family() const override { return inner_.family(); }

 private:
  models::Model& inner_;
  Pipeline& pipeline_;
};

// ---- the step ------------------------------------------------------------------------------------------

ModelParallelStep::ModelParallelStep(const dist::ParallelSettings& settings, dist::ParallelGroups groups,
                                     models::Model& model, const data::Batch& first_batch, uint64_t seed,
                                     const std::string& origin, const std::vector<int64_t>& first_unit)
    : settings_(settings), groups_(std::move(groups)), model_(model), origin_(origin) {
  const dist::ParallelLayout& l = groups_.layout;
  if (l.tensor > 1) {
    const std::string refusal = model_.shard_tensor_parallel(groups_.tensor);
    RATION_CHECK(refusal.empty(), origin_, ": parallel.tensor = ", l.tensor, ": ", refusal);
  }
  if (settings_.feature_split) {
    const std::string refusal = model_.split_features(groups_.data);
    RATION_CHECK(refusal.empty(), origin_, ": parallel.features = \"table\": ", refusal);
  }
  if (l.pipeline > 1) {
    split_pipeline(first_batch, seed, first_unit);
    release_other_stages();
  }
  for (auto& [name, p] : model_.named_parameters()) {
    if (p.numel() == 0 && l.pipeline > 1) continue;  // another stage's
    params_.emplace_back(name, p);
  }
  for (const auto& [name, p] : params_) {
    const bool duplicate_tied = l.pipeline > 1 && l.last_stage() && std::count(tied_.begin(), tied_.end(), name) > 0;
    const bool duplicate_shard = l.tensor_rank > 0 && model_.tensor_split_dim(name) < 0;
    counted_.push_back(!duplicate_tied && !duplicate_shard);
  }
}

ModelParallelStep::~ModelParallelStep() = default;

void ModelParallelStep::split_pipeline(const data::Batch& first_batch, uint64_t seed,
                                       const std::vector<int64_t>& first_unit) {
  const dist::ParallelLayout& l = groups_.layout;
  const int64_t units = model_.pipeline_units();
  RATION_CHECK(units > 0, origin_, ": parallel.pipeline = ", l.pipeline, ": model.type = \"", model_.family(),
               "\" cannot be split into pipeline stages (gpt and cnn can)");
  RATION_CHECK(l.pipeline <= units, origin_, ": parallel.pipeline = ", l.pipeline, " stages, but model.type = \"",
               model_.family(), "\" has only ", units, " layers to place (its pipeline units: ",
               model_.pipeline_unit_name(0), " ... ", model_.pipeline_unit_name(units - 1),
               "); hint: use at most ", units, " stages, or a deeper model");
  const data::Batch mb = micro_batch(first_batch, 0, settings_.micro_batches);
  std::vector<std::vector<std::string>> modules;
  split_.unit_names.clear();
  for (int64_t u = 0; u < units; ++u) {
    modules.push_back(model_.pipeline_unit_modules(u));
    split_.unit_names.push_back(model_.pipeline_unit_name(u));
  }
  // Each unit's output shape (what a stage receives), then one measured step of one micro-batch.
  {
    NoGradGuard no_grad;
    Value x = model_.model_input(mb);
    for (int64_t u = 0; u < units; ++u) {
      x = model_.pipeline_unit(u, x);
      split_.unit_output_sizes.push_back(x.sizes().vec());
    }
  }
  const memory::StepProfile profile = profile_step(model_, mb, seed);
  std::vector<double> costs(static_cast<size_t>(2 * units), 0.0);  // ms, then saved bytes, per unit
  for (const auto& n : profile.nodes) costs[static_cast<size_t>(unit_of_scope(n.scope, modules))] += n.forward_ms + n.backward_ms;
  std::vector<bool> counted(profile.storages.size(), false);
  for (const auto& n : profile.nodes)
    for (const auto& key : n.saved) {
      const int64_t s = profile.storage_of(key);
      if (s < 0 || counted[static_cast<size_t>(s)] || profile.storages[static_cast<size_t>(s)].allocated_by < 0) continue;
      counted[static_cast<size_t>(s)] = true;
      const auto& producer = profile.nodes[static_cast<size_t>(profile.storages[static_cast<size_t>(s)].allocated_by)];
      costs[static_cast<size_t>(units + unit_of_scope(producer.scope, modules))] +=
          static_cast<double>(profile.storages[static_cast<size_t>(s)].bytes);
    }
  // Every rank measured; the mean over the job is what every rank splits by (the same split everywhere).
  costs = dist::all_reduce_doubles(groups_.everyone, costs);
  split_.unit_ms.assign(static_cast<size_t>(units), 0);
  split_.unit_saved_bytes.assign(static_cast<size_t>(units), 0);
  split_.unit_param_bytes.assign(static_cast<size_t>(units), 0);
  const auto size = static_cast<double>(groups_.everyone.size());
  for (int64_t u = 0; u < units; ++u) {
    split_.unit_ms[static_cast<size_t>(u)] = costs[static_cast<size_t>(u)] / size;
    split_.unit_saved_bytes[static_cast<size_t>(u)] = std::llround(costs[static_cast<size_t>(units + u)] / size);
  }
  for (auto& [name, p] : model_.named_parameters())
    for (int64_t u = 0; u < units; ++u)
      if (in_modules(name, modules[static_cast<size_t>(u)]))
        split_.unit_param_bytes[static_cast<size_t>(u)] += p.numel() * static_cast<int64_t>(p.tensor().element_size());
  std::vector<int64_t> bytes(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u)
    bytes[static_cast<size_t>(u)] = split_.unit_saved_bytes[static_cast<size_t>(u)] + split_.unit_param_bytes[static_cast<size_t>(u)];
  // parallel.split: what the stages balance (bytes: the same split on every run; uniform: unit counts).
  std::vector<double> ms = split_.unit_ms;
  if (settings_.split != dist::PipelineSplit::Time) std::fill(ms.begin(), ms.end(), settings_.split == dist::PipelineSplit::Uniform ? 1.0 : 0.0);
  if (settings_.split == dist::PipelineSplit::Uniform) std::fill(bytes.begin(), bytes.end(), 0);
  split_.first_unit = balance_units(ms, bytes, l.pipeline);
  if (!first_unit.empty()) {  // a resumed run keeps the split its checkpoints were made with
    RATION_CHECK(static_cast<int64_t>(first_unit.size()) == l.pipeline + 1 && first_unit.front() == 0 &&
                     first_unit.back() == units && std::is_sorted(first_unit.begin(), first_unit.end()),
                 origin_, ": the saved pipeline split does not fit ", l.pipeline, " stages of ", units, " units");
    split_.from_checkpoint = split_.first_unit != first_unit;
    split_.first_unit = first_unit;
  }
  const int64_t begin = split_.first_unit[static_cast<size_t>(l.stage)];
  const int64_t end = split_.first_unit[static_cast<size_t>(l.stage) + 1];
  pipeline_ = std::make_unique<Pipeline>(model_, groups_, begin, end, settings_);
  eval_model_ = std::make_unique<EvalModel>(model_, *pipeline_);
}

// Parameters of units on other stages give their memory back (their tensors become empty, in place, so
// every handle sees it); a weight the first and last stage both use stays on both (tied_).
void ModelParallelStep::release_other_stages() {
  const dist::ParallelLayout& l = groups_.layout;
  auto modules_of = [&](int64_t s) {
    std::vector<std::string> m;
    for (int64_t u = split_.first_unit[static_cast<size_t>(s)]; u < split_.first_unit[static_cast<size_t>(s) + 1]; ++u)
      for (auto& name : model_.pipeline_unit_modules(u)) m.push_back(name);
    return m;
  };
  const std::vector<std::string> mine = modules_of(l.stage);
  const std::vector<std::string> first = modules_of(0), last = modules_of(l.pipeline - 1);
  for (auto& [name, p] : model_.named_parameters()) {
    if (in_modules(name, first) && in_modules(name, last)) tied_.push_back(name);
    if (in_modules(name, mine)) continue;
    at::Tensor t = p.tensor();
    t.set_data(at::empty({0}, t.options()));
  }
}

int64_t ModelParallelStep::in_flight() const { return pipeline_ ? pipeline_->in_flight() : 1; }

models::Model& ModelParallelStep::eval_model() { return eval_model_ ? static_cast<models::Model&>(*eval_model_) : model_; }


// ---- memory plan of a stage ----------------------------------------------------------------------------

// Under 1F1B stage s holds up to k = min(P - s, M) micro-batches between their forward and backward; the
// peak comes while one of them runs forward or backward and the k - 1 others each hold what the plan
// keeps of theirs (H: the activations and the stage's input and output at the end of forward, less what
// the plan drops). The plan of one micro-batch is made with (k - 1) H as fixed memory; H depends on the
// plan, so plans are made again with the H the last plan holds until one holds no more than it assumed.
const memory::Plan* ModelParallelStep::prepare(StepRuntime& runtime, const data::Batch& batch,
                                               optim::Optimizer* optimizer, uint64_t seed) {
  if (!runtime.settings().budget.has_budget()) return nullptr;
  // A tensor group's ranks must drop and offload the same values (a recomputed row-parallel output re-runs
  // its all-reduce; an offloaded replicated value is all-gathered): they plan from shard 0's measurements.
  const bool tensor = groups_.layout.tensor > 1;
  RATION_CHECK(!tensor || runtime.engine() == nullptr, origin_, ": parallel.tensor with --memory-budget and ",
               "--offload is not supported yet (the ranks' measured copy costs differ); drop --offload or the budget");
  auto agree = [&] {
    memory::StepProfile p = runtime.step_profile();
    dist::agree_profile(p, groups_.tensor);
    runtime.set_profile(std::move(p));
  };
  if (!pipeline_ && !tensor) return runtime.prepare(model_, batch, seed, optimizer, 0);
  if (!pipeline_) {
    runtime.profile(model_, batch, seed);
    agree();
    return runtime.prepare_profiled(optimizer, model_.prefetch_bytes(batch) + model_.batch_variation_bytes(batch));
  }
  // With an offload tier the copy costs are measured first, while nothing of the step is live; the engine
  // keeps each micro-batch's copies apart (OffloadEngine::select_micro_batch), so one micro-batch's plan
  // holds for all of them, and what a micro-batch holds in flight excludes what it offloaded.
  if (runtime.engine()) runtime.offload_costs();
  const data::Batch mb = micro_batch(batch, 0, settings_.micro_batches);
  const int64_t first = split_.first_unit[static_cast<size_t>(groups_.layout.stage)];
  const std::vector<int64_t> input_sizes =
      first > 0 ? split_.unit_output_sizes[static_cast<size_t>(first) - 1] : std::vector<int64_t>{};
  int64_t held_all = 0;  // what one micro-batch holds between its forward and backward, everything kept
  // From the second micro-batch of a step on, every gradient of the stage exists while the next one runs
  // (they accumulate): the profiled micro-batch starts with them allocated, as those do.
  runtime.profile_run(model_, seed, [&] {
    {
      memory::CategoryGuard gradients(memory::Category::Gradients);
      for (auto& [name, p] : params_)
        if (!p.grad().defined()) p.grad() = at::zeros_like(p.tensor());
    }
    held_all = pipeline_->stand_alone(mb, input_sizes);
  });
  if (tensor) {
    agree();
    const double shard0 = groups_.layout.tensor_rank == 0 ? static_cast<double>(held_all) : 0.0;
    held_all = std::llround(dist::all_reduce_doubles(groups_.tensor, {shard0})[0]);
  }
  const int64_t others = pipeline_->in_flight() - 1;
  auto held_by = [&](const memory::Plan& p) { return std::max<int64_t>(0, held_all - p.dropped_bytes); };
  auto plan_for = [&](int64_t assumed) -> std::optional<memory::Plan> {
    try {
      return *runtime.prepare_profiled(optimizer, others * assumed);
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  // Assuming the others hold everything always gives a valid plan (if any); the least the others may be
  // assumed to hold is found by bisection: assuming less leaves more room, so the plan keeps more.
  std::optional<memory::Plan> best = plan_for(held_all);
  if (!best) {
    try {
      runtime.prepare_profiled(optimizer, others * held_all);
    } catch (const Error& e) {
      throw Error(detail::str(e.message(), " (stage ", groups_.layout.stage, " of ", groups_.layout.pipeline,
                              " holds ", others + 1, " micro-batches in flight under ",
                              dist::to_string(settings_.schedule), "; the other ", others, " hold up to ",
                              memory::format_bytes(others * held_all),
                              "; more parallel.micro_batches make each one smaller)"));
    }
  }
  int64_t best_assumed = held_all;
  for (int64_t lo = 0, hi = held_all, tries = 0; others > 0 && hi - lo > 4096 && tries < 16; ++tries) {
    const int64_t mid = lo + (hi - lo) / 2;
    std::optional<memory::Plan> p = plan_for(mid);
    if (p && held_by(*p) <= mid) {
      hi = mid;
      if (p->prediction.recompute_ms <= best->prediction.recompute_ms) {
        best = std::move(p);
        best_assumed = mid;
      }
    } else {
      lo = mid;
    }
  }
  // The plan was made for the others holding best_assumed each; they hold what it keeps (the bisection
  // stops a few KiB above that, or a plan made for less keeps more): predict with what they hold.
  if (others > 0 && held_by(*best) < best_assumed) {
    memory::lower_fixed_bytes(*best, others * (best_assumed - held_by(*best)));
    best_assumed = held_by(*best);
  }
  planned_in_flight_bytes_ = others * best_assumed;
  return &runtime.use_plan(std::move(*best));
}

StepStats ModelParallelStep::step(StepRuntime& runtime, const data::Batch& batch, const StepOptions& options) {
  const auto t0 = Clock::now();
  StepStats st;
  st.step = options.step.value_or(steps_);
  double loss_sum = 0, wait = 0;
  const int64_t tensor_bytes = dist::tensor_parallel_collective_bytes();  // the blocks' all-reduces, below
  if (!pipeline_) {
    StepOptions local = options;
    local.optimizer = nullptr;
    local.gradients = GradientsAfter::Kept;
    st = runtime.measure_step(model_, batch, local);
    loss_sum = st.loss;
  } else {
    const at::Device device = model_.parameter_options().device();
    st.baseline_bytes = memory::device_current_bytes(device);
    memory::reset_peak();
    memory::CategoryGuard workspace(memory::Category::Workspace);
    {
      StepRuntime::Scope scope(runtime);
      loss_sum = pipeline_->run(runtime, batch, options.seed);
    }
    wait = pipeline_->wait_ms;
    sent_bytes_ += pipeline_->sent_bytes;
  }
  sent_bytes_ += dist::tensor_parallel_collective_bytes() - tensor_bytes;
  exchange_gradients();
  // The schedule ends when the gradients are exchanged: a stage that finished its last backward early
  // waits there (the pipeline's drain), so its idle time is counted.
  if (pipeline_) {
    schedule_ms_ += ms_since(t0);
    compute_ms_ += pipeline_->compute_ms;
  }
  if (options.optimizer) {
    if (options.clip_grad_norm > 0) st.grad_norm = clip(options.clip_grad_norm);
    options.optimizer->step();
    options.optimizer->zero_grad();
  }
  st.loss = agree_loss(loss_sum);
  st.ms = ms_since(t0);
  if (pipeline_) {
    st.memory = memory::stats();
    st.peak_bytes = memory::device_peak_bytes(st.memory);
  }
  comm_wait_ms_ += wait;
  step_ms_ += st.ms;
  ++steps_;
  return st;
}

// A weight the first and last stage both hold gets the sum of both stages' gradients on both; then every
// gradient becomes the mean over the data-parallel replicas (one all-reduce of all of them, flattened).
void ModelParallelStep::exchange_gradients() {
  NoGradGuard no_grad;
  memory::CategoryGuard workspace(memory::Category::Workspace);
  auto grad_of = [](Value& p) -> at::Tensor& {
    if (!p.grad().defined()) p.grad() = at::zeros_like(p.tensor());
    return p.grad();
  };
  if (groups_.ends.defined() && groups_.ends.size() > 1)
    for (auto& [name, p] : params_)
      if (std::count(tied_.begin(), tied_.end(), name) > 0) {
        groups_.ends.all_reduce_sum(grad_of(p));
        sent_bytes_ += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
      }
  const int replicas = groups_.data.defined() ? groups_.data.size() : 1;
  if (replicas <= 1 || params_.empty()) return;
  std::vector<at::Tensor> flat;
  for (auto& [name, p] : params_) flat.push_back(grad_of(p).reshape({-1}));
  at::Tensor all = at::cat(flat);
  groups_.data.all_reduce_sum(all);
  sent_bytes_ += all.numel() * static_cast<int64_t>(all.element_size());
  all.div_(static_cast<double>(replicas));
  int64_t at = 0;
  for (auto& [name, p] : params_) {
    at::Tensor& g = p.grad();
    g.copy_(all.narrow(0, at, g.numel()).view_as(g));
    at += g.numel();
  }
}

// The global L2 norm over every rank of the replica, each parameter counted once (a tensor-parallel
// layer's replicated weights by shard 0, a tied weight by the first stage), then every gradient scaled
// as torch.nn.utils.clip_grad_norm_ scales it.
double ModelParallelStep::clip(double max_norm) {
  NoGradGuard no_grad;
  double squares = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = params_[i].second.grad();
    if (counted_[i] && g.defined()) squares += std::pow(g.norm().item<double>(), 2);
  }
  const double total = std::sqrt(dist::all_reduce_doubles(groups_.model, {squares})[0]);
  std::vector<Value> values;
  for (auto& [name, p] : params_) values.push_back(p);
  optim::clip_by_norms(values, max_norm, {at::scalar_tensor(total, at::kDouble)});
  return total;
}

// The step's loss on every rank: the last stage's (shard 0's) summed over the replica's model group, then
// the mean over replicas.
double ModelParallelStep::agree_loss(double local_loss_sum) const {
  const dist::ParallelLayout& l = groups_.layout;
  const double mine = l.last_stage() && l.tensor_rank == 0 ? local_loss_sum : 0.0;
  double replica = dist::all_reduce_doubles(groups_.model, {mine})[0];
  const int replicas = groups_.data.defined() ? groups_.data.size() : 1;
  return dist::all_reduce_doubles(groups_.data, {replica})[0] / static_cast<double>(replicas);
}

void ModelParallelStep::gather_memory(int64_t measured_peak_bytes, const memory::Plan* plan) {
  // measured peak, predicted peak, budget, time blocked on a neighbour stage, time not computing a micro-batch
  constexpr size_t kFields = 5;
  std::vector<double> all(kFields * static_cast<size_t>(groups_.everyone.size()), 0.0);
  double* mine = &all[kFields * static_cast<size_t>(groups_.layout.rank)];
  mine[0] = static_cast<double>(measured_peak_bytes);
  mine[1] = static_cast<double>(plan ? plan->prediction.peak_bytes : 0);
  mine[2] = static_cast<double>(plan ? plan->budget_bytes : 0);
  mine[3] = step_ms_ > 0 ? comm_wait_ms_ / step_ms_ : 0.0;
  mine[4] = idle_fraction();
  all = dist::all_reduce_doubles(groups_.everyone, all);
  memory_ = nlohmann::json::array();
  const std::vector<std::string> where = groups_.layout.describe_all();
  for (size_t r = 0; r < all.size() / kFields; ++r) {
    const double* f = &all[kFields * r];
    nlohmann::json m = {{"rank", where[r]}, {"measured_peak_bytes", std::llround(f[0])}, {"wait_fraction", f[3]}};
    if (pipeline_) m["idle_fraction"] = f[4];
    if (f[2] > 0) {
      m["predicted_peak_bytes"] = std::llround(f[1]);
      m["budget_bytes"] = std::llround(f[2]);
    }
    memory_.push_back(m);
  }
}

nlohmann::json ModelParallelStep::report() const {
  const dist::ParallelLayout& l = groups_.layout;
  nlohmann::json r = {{"tensor", l.tensor},
                      {"pipeline", l.pipeline},
                      {"data", l.data},
                      {"this_rank", l.describe()},
                      {"ranks", l.describe_all()},
                      {"features", settings_.feature_split ? "table" : "none"},
                      {"memory", memory_},
                      {"bytes_sent_per_step", steps_ > 0 ? sent_bytes_ / steps_ : 0}};
  if (pipeline_) {
    const auto m = static_cast<double>(settings_.micro_batches), p = static_cast<double>(l.pipeline);
    r["schedule"] = dist::to_string(settings_.schedule);
    // A resumed run whose checkpoint was split otherwise keeps that split: the report says so.
    r["split"] = split_.from_checkpoint ? "checkpoint" : dist::to_string(settings_.split);
    r["micro_batches"] = settings_.micro_batches;
    r["stages"] = split_.to_json();
    r["in_flight"] = pipeline_->in_flight();
    r["planned_in_flight_bytes"] = planned_in_flight_bytes_;
    // The bubble: the share of the schedule (a step up to its gradients exchanged, optimiser excluded) a
    // stage spends not computing a micro-batch's forward or backward — filling and draining the pipe,
    // waiting on a neighbour, sending — for the busiest stage (the least idle: its share is the bubble the
    // formula (P - 1) / (M + P - 1) describes for equal stages, 1F1B and GPipe alike), the mean over every
    // rank and this rank's; beside it the share of whole steps blocked in a neighbour exchange alone.
    double mean = 0, busiest = memory_.empty() ? 0.0 : 1.0, wait_mean = 0;
    for (const auto& e : memory_) {
      mean += e["idle_fraction"].get<double>() / static_cast<double>(memory_.size());
      wait_mean += e["wait_fraction"].get<double>() / static_cast<double>(memory_.size());
      busiest = std::min(busiest, e["idle_fraction"].get<double>());
    }
    r["bubble"] = {{"measured_idle_fraction_busiest_stage", busiest},
                   {"measured_idle_fraction_mean", mean},
                   {"measured_idle_fraction_this_rank", idle_fraction()},
                   {"measured_wait_fraction_mean", wait_mean},
                   {"formula", (p - 1) / (m + p - 1)}};
    r["tied_parameters"] = tied_;
  }
  return r;
}

}  // namespace ration::train
