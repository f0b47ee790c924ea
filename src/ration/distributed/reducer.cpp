// reducer.cpp — buckets, weighted accumulation, the communication thread (see reducer.h).
#include "ration/distributed/reducer.h"

#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <map>

#include "ration/base/check.h"
#include "ration/core/trace.h"
#include "ration/base/allocator.h"
#include "ration/distributed/aggregators.h"

namespace ration::dist {
namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

double ReducerStats::overlap() const {
  if (comm_ms <= 0) return 0;
  return std::clamp(1.0 - exposed_ms / comm_ms, 0.0, 1.0);
}

Reducer::Reducer(World world, const std::vector<std::pair<std::string, Value>>& params, std::unique_ptr<CommHook> hook,
                 ReducerOptions options)
    : Reducer(std::move(world), params, make_allreduce_aggregator(std::move(hook)), options) {}

Reducer::Reducer(World world, const std::vector<std::pair<std::string, Value>>& params,
                 std::unique_ptr<Aggregator> aggregator, ReducerOptions options)
    : world_(std::move(world)), aggregator_(std::move(aggregator)), options_(options) {
  RATION_CHECK(world_.defined(), "Reducer needs an initialised World");
  RATION_CHECK(aggregator_ != nullptr, "Reducer needs an aggregator");
  RATION_CHECK(options_.bucket_bytes > 0 && options_.first_bucket_bytes > 0,
               "dist.bucket_bytes and dist.first_bucket_bytes must be positive sizes such as 25MiB; got ",
               options_.bucket_bytes, " and ", options_.first_bucket_bytes);
  RATION_CHECK(options_.sync_every >= 1, "dist.sync_every must be an integer >= 1, got ", options_.sync_every);

  // Layout: reverse parameter order (the order gradients become ready), a bucket closes once it reaches
  // its cap, the first with the smaller cap.
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const auto& [name, p] = *it;
    if (!p.requires_grad()) continue;
    RATION_CHECK(p.dtype() == at::kFloat, "data-parallel training reduces float32 gradients; parameter '", name,
                 "' is ", c10::toString(p.dtype()));
    const int64_t cap = layouts_.size() <= 1 ? options_.first_bucket_bytes : options_.bucket_bytes;
    if (layouts_.empty() || layouts_.back().numel * 4 >= cap) layouts_.emplace_back();
    BucketLayout& b = layouts_.back();
    slots_.push_back({p.impl(), layouts_.size() - 1, b.numel});
    b.names.push_back(name);
    b.offsets.push_back(b.numel);
    b.numels.push_back(p.numel());
    b.numel += p.numel();
  }
  RATION_CHECK(!slots_.empty(), "Reducer given no trainable parameters");
  {
    memory::CategoryGuard gradient_memory(memory::Category::Gradients);
    for (const auto& l : layouts_) buckets_.push_back({at::zeros({l.numel}, at::kFloat), 0, BucketState::Filling});
  }
  aggregator_->init_buckets(layouts_);
  for (size_t i = 0; i < slots_.size(); ++i) slot_of_.emplace_back(slots_[i].param.get(), i);
  std::sort(slot_of_.begin(), slot_of_.end());

  self_ = std::make_shared<Reducer*>(this);
  std::weak_ptr<Reducer*> weak = self_;
  for (const auto& s : slots_) {
    Value(s.param).on_grad_ready([weak](ValueImpl& param) {
      if (auto self = weak.lock()) (*self)->on_grad_ready(param);
    });
  }
  comm_thread_ = std::thread([this] { comm_loop(); });
}

Reducer::~Reducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (comm_thread_.joinable()) comm_thread_.join();
  self_.reset();
}

int64_t Reducer::bucket_bytes() const {
  int64_t total = 0;
  for (const auto& l : layouts_) total += l.numel * 4;
  return total;
}

void Reducer::prepare_backward(double weight) {
  RATION_CHECK(weight >= 0 && weight <= 1, "Reducer::prepare_backward: weight ", weight,
               " is not a share of the step's samples (expected a number in [0, 1])");
  if (micro_ == options_.sync_every) micro_ = 0;  // finalize() was skipped: start a fresh window anyway
  if (micro_ == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    RATION_ASSERT(queue_.empty() && (next_launch_ == 0 || reduced_ == next_launch_),
                  "Reducer: a new window while buckets are still in flight");
    for (const Slot& s : slots_) s.param->grad = at::Tensor();  // last window's sums (views of the buckets)
    for (size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].flat.zero_();
      buckets_[b].state = BucketState::Filling;
      buckets_[b].unready = static_cast<int64_t>(layouts_[b].names.size());
    }
    next_launch_ = 0;
    reduced_ = 0;
    window_comm_ms_ = 0;
    window_weight_ = 0;
    aggregator_->begin_window(context_);
  }
  weight_ = weight;
  window_weight_ += weight;
  ++micro_;
}

void Reducer::on_grad_ready(ValueImpl& param) {
  auto it = std::lower_bound(slot_of_.begin(), slot_of_.end(), std::make_pair(static_cast<const ValueImpl*>(&param), size_t{0}));
  RATION_ASSERT(it != slot_of_.end() && it->first == &param, "gradient-ready hook for a parameter the Reducer does not own");
  RATION_CHECK(micro_ > 0, "a backward ran without Reducer::prepare_backward (call it before each backward)");
  const Slot& slot = slots_[it->second];
  Bucket& bucket = buckets_[slot.bucket];
  RATION_ASSERT(bucket.state == BucketState::Filling, "gradient for '", param.name, "' arrived after its bucket left");
  if (param.grad.defined()) {
    at::NoGradGuard no_grad;
    bucket.flat.narrow(0, slot.offset, param.tensor.numel()).add_(param.grad.reshape({-1}), weight_);
  }
  param.grad = at::Tensor();  // the bucket holds it now; the next backward starts this gradient afresh
  if (!window_complete()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (--bucket.unready == 0) {
    mark_ready(slot.bucket);
    launch_ready_in_order();
  }
}

void Reducer::mark_ready(size_t bucket) { buckets_[bucket].state = BucketState::Ready; }

void Reducer::launch_ready_in_order() {
  bool any = false;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].state == BucketState::Ready) {
    buckets_[next_launch_].state = BucketState::Launched;
    queue_.push_back(next_launch_++);
    any = true;
  }
  if (any) cv_.notify_all();
}

void Reducer::comm_loop() {
  memory::CategoryGuard gradient_memory(memory::Category::Gradients);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    const size_t b = queue_.front();
    queue_.pop_front();
    const bool failed = failure_ != nullptr;
    lock.unlock();
    Traffic traffic;
    std::exception_ptr error;
    const auto t0 = Clock::now();
    if (!failed) {
      TraceRegion span("collectives", "collective",
                       [&] { return aggregator_->bucket_traffic() + " bucket " + std::to_string(b); });
      try {
        traffic = aggregator_->on_bucket(world_, static_cast<int>(b), buckets_[b].flat);
      } catch (...) {
        error = std::current_exception();
      }
    }
    const double ms = ms_between(t0, Clock::now());
    lock.lock();
    if (error && !failure_) failure_ = error;
    buckets_[b].state = BucketState::Reduced;
    stats_.traffic += traffic;
    window_comm_ms_ += ms;
    ++reduced_;
    cv_.notify_all();
  }
}

std::vector<at::Tensor> Reducer::parameter_tensors() const {
  std::vector<at::Tensor> params;
  params.reserve(slots_.size());
  for (const Slot& s : slots_) params.push_back(s.param->tensor);
  return params;
}

void Reducer::count_exchange(const Traffic& traffic, double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.traffic += traffic;
  stats_.comm_ms += ms;
  stats_.exposed_ms += ms;  // on the caller's thread, after the step: nothing hides it
  stats_.exchange_ms += ms;
}

void Reducer::after_optimizer_step() {
  if (exchange_ == ParameterExchange::Done) return;
  exchange_ = ParameterExchange::Done;
  const auto t0 = Clock::now();
  const auto traffic = aggregator_->after_optimizer(world_, parameter_tensors(), context_.step, window_weight_);
  if (traffic) count_exchange(*traffic, ms_between(t0, Clock::now()));
}

void Reducer::finish() {
  const auto t0 = Clock::now();
  const auto traffic = aggregator_->finish(world_, parameter_tensors());
  if (traffic) count_exchange(*traffic, ms_between(t0, Clock::now()));
}

void Reducer::finalize() {
  RATION_CHECK(window_complete(), "Reducer::finalize called after ", micro_, " of ", options_.sync_every,
               " backward passes of the window (call prepare_backward before each backward)");
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t b = next_launch_; b < buckets_.size(); ++b) {
    if (buckets_[b].state == BucketState::Filling) mark_ready(b);
  }
  launch_ready_in_order();
  TraceRegion wait_span("stalls", "stall", "wait for all-reduce");
  cv_.wait(lock, [&] { return reduced_ == buckets_.size(); });
  const double waited = ms_between(t0, Clock::now());
  stats_.comm_ms += window_comm_ms_;
  stats_.exposed_ms += std::min(waited, window_comm_ms_);
  ++stats_.synchronizations;
  micro_ = 0;
  next_launch_ = 0;
  reduced_ = 0;
  if (failure_) {
    std::exception_ptr e = failure_;
    failure_ = nullptr;
    std::rethrow_exception(e);
  }
  lock.unlock();
  exchange_ = ParameterExchange::Due;
  if (aggregator_->owns_gradient() && window_weight_ > 0) {
    at::NoGradGuard no_grad;
    for (Bucket& b : buckets_) b.flat.div_(window_weight_);  // this rank's own mean gradient
  }
  // Every param.grad becomes a view of its bucket (no copy; DDP's gradient_as_bucket_view), valid until
  // the next window starts.
  for (const Slot& s : slots_) {
    s.param->grad = buckets_[s.bucket].flat.narrow(0, s.offset, s.param->tensor.numel()).view(s.param->tensor.sizes());
  }
}

}  // namespace ration::dist
