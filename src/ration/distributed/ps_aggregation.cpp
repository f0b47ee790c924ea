// ps_aggregation.cpp — backup-worker rounds, bounded-asynchronous applies, and their wire protocol
// (see ps_aggregation.h).
#include "ration/distributed/ps_aggregation.h"

#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <chrono>
#include <limits>

#include "ration/base/check.h"

namespace ration::dist {
namespace {

// Messages on the parameter-server channel (one tag per direction and part, so a worker's header and
// gradient and the server's header and parameters never pair with each other).
constexpr int kPushHeaderTag = 1, kPushGradientTag = 2, kReplyHeaderTag = 3, kReplyParamsTag = 4;
constexpr int kHeaderDoubles = 8;
enum class PushKind { Push = 1, Finished = 2, Snapshot = 3 };
enum class ReplyKind { Parameters = 1, Failed = 3 };

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

at::Tensor header() { return at::zeros({kHeaderDoubles}, at::kDouble); }  // (8) float64

}  // namespace

const char* to_string(PsAggregation a) {
  switch (a) {
    case PsAggregation::Synchronous: return "sync";
    case PsAggregation::BackupWorkers: return "backup";
    case PsAggregation::BoundedAsync: return "async";
  }
  return "?";
}

int64_t PsAggregationStats::total(const std::vector<int64_t>& per_rank) const {
  int64_t t = 0;
  for (int64_t v : per_rank) t += v;
  return t;
}

double PsAggregationStats::mean_staleness() const {
  int64_t n = 0;
  double sum = 0;
  for (size_t d = 0; d < staleness.size(); ++d) {
    n += staleness[d];
    sum += static_cast<double>(d) * static_cast<double>(staleness[d]);
  }
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

int64_t PsAggregationStats::max_staleness() const {
  for (size_t d = staleness.size(); d > 0; --d)
    if (staleness[d - 1] > 0) return static_cast<int64_t>(d - 1);
  return 0;
}

// ---- the server's rule -----------------------------------------------------------------------------
PsAggregator::PsAggregator(int world_size, PsAggregationOptions options, ServerModel& model, int64_t first_version)
    : n_(world_size), options_(options), model_(model), version_(first_version), ranks_(static_cast<size_t>(world_size)) {
  RATION_CHECK(n_ >= 1, "PsAggregator needs at least one rank, got ", n_);
  RATION_CHECK(options_.mode != PsAggregation::Synchronous,
               "PsAggregator serves dist.backup_workers or dist.sync = \"async\"; the synchronous parameter server "
               "is distributed/topology.h's");
  if (options_.mode == PsAggregation::BackupWorkers)
    RATION_CHECK(options_.backup_workers >= 1 && options_.backup_workers < n_, "dist.backup_workers must be in [1, ",
                 n_ - 1, "] for ", n_, " ranks (each round aggregates N - k >= 1 pushes), got ", options_.backup_workers);
  RATION_CHECK(options_.max_staleness >= 0, "dist.max_staleness must be >= 0, got ", options_.max_staleness);
  stats_.pushes.assign(ranks_.size(), 0);
  stats_.included.assign(ranks_.size(), 0);
  stats_.dropped.assign(ranks_.size(), 0);
  stats_.wait_ms.assign(ranks_.size(), 0.0);
}

void PsAggregator::throw_if_failed() {
  if (failure_) throw CollectiveError(*failure_);
}

void PsAggregator::submit(Push push) {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_failed();
  RATION_CHECK(push.rank >= 0 && push.rank < n_, "PsAggregator: push from rank ", push.rank, " outside [0, ", n_, ")");
  RATION_CHECK(push.gradient.defined() && push.gradient.numel() == model_.numel(), "PsAggregator: rank ", push.rank,
               " pushed ", push.gradient.defined() ? push.gradient.numel() : 0, " gradient elements, expected ",
               model_.numel());
  RankState& rs = ranks_[static_cast<size_t>(push.rank)];
  RATION_ASSERT(rs.reply == ReplyState::None, "PsAggregator: rank ", push.rank, " pushed again before its reply");
  RATION_ASSERT(push.base_version <= version_, "PsAggregator: rank ", push.rank, " pushed on version ",
                push.base_version, " ahead of the server's ", version_);
  rs.reply = ReplyState::Waiting;
  rs.dropped = false;
  rs.pushed_at_ns = now_ns();
  ++stats_.pushes[static_cast<size_t>(push.rank)];
  if (push.stop_signal != 0 && stop_signal_ == 0) stop_signal_ = push.stop_signal;
  if (options_.mode == PsAggregation::BackupWorkers) {
    if (push.base_version < version_) {  // its round closed: dropped, answered with the current version
      rs.dropped = true;
      rs.reply = ReplyState::Ready;
      ++stats_.dropped[static_cast<size_t>(push.rank)];
    } else {
      pending_.push_back(std::move(push));
      close_round();
    }
  } else {
    pending_.push_back(std::move(push));
    release_within_bound();
  }
  cv_.notify_all();
}

void PsAggregator::close_round() {
  int64_t training = 0;
  for (const RankState& rs : ranks_) training += rs.activity == Activity::Training ? 1 : 0;
  const int64_t needed = std::min<int64_t>(n_ - options_.backup_workers, training);
  if (pending_.empty() || static_cast<int64_t>(pending_.size()) < needed) return;
  std::sort(pending_.begin(), pending_.end(), [](const Push& a, const Push& b) { return a.rank < b.rank; });
  double shares = 0;
  for (const Push& p : pending_) shares += p.share;
  std::vector<int> answered;
  for (const Push& p : pending_) answered.push_back(p.rank);
  apply(pending_, shares);
  pending_.clear();
  const int64_t t = now_ns();
  for (int r : answered) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    rs.reply = ReplyState::Ready;
    stats_.wait_ms[static_cast<size_t>(r)] += static_cast<double>(t - rs.pushed_at_ns) / 1e6;
  }
}

void PsAggregator::release_within_bound() {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (ranks_[r].activity == Activity::Training) slowest = std::min(slowest, stats_.pushes[r]);
  std::vector<size_t> released;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].reply != ReplyState::Waiting) continue;
    if (stats_.pushes[r] - slowest <= options_.max_staleness) released.push_back(r);
  }
  if (released.empty()) return;
  if (!pending_.empty()) {
    std::sort(pending_.begin(), pending_.end(),
              [](const Push& a, const Push& b) { return a.step != b.step ? a.step < b.step : a.rank < b.rank; });
    apply(pending_, 1.0);
    pending_.clear();
  }
  const int64_t t = now_ns();
  for (size_t r : released) {
    ranks_[r].reply = ReplyState::Ready;
    stats_.max_ahead = std::max(stats_.max_ahead, stats_.pushes[r] - slowest);
    stats_.wait_ms[r] += static_cast<double>(t - ranks_[r].pushed_at_ns) / 1e6;
  }
}

void PsAggregator::apply(std::vector<Push>& pushes, double divide_by) {
  // Sum in the given order (rank order within a step): the first push's gradient, then each other added.
  at::NoGradGuard no_grad;
  at::Tensor sum = pushes.front().gradient.clone();
  double loss_sum = pushes.front().loss_sum, samples = pushes.front().samples;
  for (size_t i = 1; i < pushes.size(); ++i) {
    sum.add_(pushes[i].gradient);
    loss_sum += pushes[i].loss_sum;
    samples += pushes[i].samples;
  }
  if (divide_by > 0 && divide_by != 1.0) sum.div_(divide_by);
  int64_t step = pushes.front().step;
  for (const Push& p : pushes) {
    step = std::min(step, p.step);
    const auto stale = static_cast<size_t>(version_ - p.base_version);
    if (stats_.staleness.size() <= stale) stats_.staleness.resize(stale + 1, 0);
    ++stats_.staleness[stale];
    ++stats_.included[static_cast<size_t>(p.rank)];
  }
  model_.apply(sum, step);
  ++version_;
  ++stats_.versions;
  last_loss_ = samples > 0 ? loss_sum / samples : 0.0;
}

Reply PsAggregator::await_reply(int rank, at::Tensor& params) {
  std::unique_lock<std::mutex> lock(mu_);
  RankState& rs = ranks_[static_cast<size_t>(rank)];
  cv_.wait(lock, [&] { return failure_ || rs.reply == ReplyState::Ready; });
  throw_if_failed();
  model_.read(params);
  rs.reply = ReplyState::None;
  Reply r;
  r.version = version_;
  r.stop_signal = stop_signal_;
  r.dropped = rs.dropped;
  r.loss = last_loss_;
  return r;
}

bool PsAggregator::reply_ready(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_[static_cast<size_t>(rank)].reply == ReplyState::Ready;
}

void PsAggregator::finished(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_[static_cast<size_t>(rank)].activity = Activity::Finished;
  if (failure_) return;
  // Fewer ranks train now: a round (or the slowest-worker bound) may be complete without it.
  if (options_.mode == PsAggregation::BackupWorkers) close_round();
  else release_within_bound();
  cv_.notify_all();
}

void PsAggregator::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_) failure_ = why;
  cv_.notify_all();
}

PsAggregationStats PsAggregator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---- rank 0: one receiving thread per worker -------------------------------------------------------
struct PsServerLinks::Shared {
  World channel;
  std::shared_ptr<PsAggregator> aggregator;
  int worker_offset = 0;
  std::function<void(const World&, int)> on_snapshot;
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;                    // workers that said they finished
  int ended = 0;                       // threads that returned (finished or failed)
  std::optional<std::string> failure;  // the first lost worker
  std::atomic<int64_t> bytes_sent{0};
};

PsServerLinks::PsServerLinks(World channel, std::shared_ptr<PsAggregator> aggregator, int worker_offset,
                             std::function<void(const World&, int)> on_snapshot)
    : shared_(std::make_shared<Shared>()) {
  shared_->channel = std::move(channel);
  shared_->aggregator = std::move(aggregator);
  shared_->worker_offset = worker_offset;
  shared_->on_snapshot = std::move(on_snapshot);
  for (int r = 0; r < shared_->channel.size(); ++r) {
    if (r == 0) continue;
    std::shared_ptr<Shared> s = shared_;
    threads_.emplace_back([s, r] { serve(s, r); });
  }
}

PsServerLinks::~PsServerLinks() {
  bool all_ended;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    all_ended = shared_->ended == static_cast<int>(threads_.size());
  }
  if (!all_ended) shared_->aggregator->fail("the server stopped serving the parameters");  // no apply from now on
  for (std::thread& t : threads_) {
    if (all_ended) t.join();
    else t.detach();  // may be blocked in a receive from a lost rank; the process exits soon
  }
}

int64_t PsServerLinks::bytes_sent() const { return shared_->bytes_sent.load(); }

void PsServerLinks::serve(const std::shared_ptr<Shared>& s, int rank) {
  const World& ch = s->channel;
  PsAggregator& agg = *s->aggregator;
  const int worker = rank - s->worker_offset;  // the aggregator's index of this channel rank
  auto end = [&](const std::optional<std::string>& failure) {
    std::lock_guard<std::mutex> lock(s->mu);
    ++s->ended;
    if (failure && !s->failure) s->failure = failure;
    if (!failure) ++s->finished;
    s->cv.notify_all();
  };
  std::string stage = "receive a push from";
  try {
    at::Tensor params;
    for (;;) {
      at::Tensor h = header();
      stage = "receive a push from";
      ch.send_recv({}, {{rank, h}}, kPushHeaderTag);
      const double* hv = h.data_ptr<double>();
      if (static_cast<int>(hv[0]) == static_cast<int>(PushKind::Finished)) {
        agg.finished(worker);
        end(std::nullopt);
        return;
      }
      if (static_cast<int>(hv[0]) == static_cast<int>(PushKind::Snapshot)) {
        RATION_CHECK(s->on_snapshot != nullptr, "rank ", rank, " asked for a snapshot this server does not give");
        stage = "send a snapshot to";
        s->on_snapshot(ch, rank);
        continue;
      }
      Push p;
      p.rank = worker;
      p.base_version = static_cast<int64_t>(hv[1]);
      p.step = static_cast<int64_t>(hv[2]);
      p.share = hv[3];
      p.loss_sum = hv[4];
      p.samples = hv[5];
      p.stop_signal = static_cast<int>(hv[6]);
      int64_t numel = static_cast<int64_t>(hv[7]);
      p.gradient = at::empty({numel}, at::kFloat);
      ch.send_recv({}, {{rank, p.gradient}}, kPushGradientTag);
      if (!params.defined()) params = at::empty({numel}, at::kFloat);
      at::Tensor reply = header();
      double* rv = reply.data_ptr<double>();
      try {
        agg.submit(std::move(p));
        const Reply r = agg.await_reply(worker, params);
        rv[0] = static_cast<double>(ReplyKind::Parameters);
        rv[1] = static_cast<double>(r.version);
        rv[2] = r.stop_signal;
        rv[3] = r.dropped ? 1 : 0;
        rv[4] = r.loss;
      } catch (const CollectiveError&) {
        rv[0] = static_cast<double>(ReplyKind::Failed);  // another worker was lost: tell this one at once
        stage = "tell of the lost worker";
        ch.send_recv({{rank, reply}}, {}, kReplyHeaderTag);
        end(std::string("stopped after another worker was lost"));
        return;
      }
      stage = "send the parameters to";
      ch.send_recv({{rank, reply}}, {}, kReplyHeaderTag);
      ch.send_recv({{rank, params}}, {}, kReplyParamsTag);
      s->bytes_sent += (reply.numel() * 8 + params.numel() * 4);
    }
  } catch (const std::exception& e) {
    const std::string why = s->worker_offset == 0
                                ? detail::str("parameter server (rank 0) could not ", stage, " rank ", rank, ": ", e.what())
                                : detail::str("parameter server could not ", stage, " worker ", worker, ": ", e.what());
    agg.fail(why);
    end(why);
  }
}

void PsServerLinks::wait_for_workers() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [&] { return shared_->ended == static_cast<int>(threads_.size()); });
  if (shared_->failure) throw CollectiveError(*shared_->failure);
}

// ---- a worker --------------------------------------------------------------------------------------
PsClient::PsClient(World channel, int64_t numel, std::string server)
    : channel_(std::move(channel)), numel_(numel), server_(std::move(server)) {
  RATION_CHECK(channel_.rank() != 0, "PsClient runs on workers; the channel's rank 0 serves the parameters");
}

Reply PsClient::exchange(const Push& p, at::Tensor& params) {
  push(p);
  return await_reply(params);
}

void PsClient::push(const Push& push) {
  RATION_CHECK(push.gradient.defined() && push.gradient.numel() == numel_ && push.gradient.is_contiguous(),
               "PsClient: the pushed gradient must be ", numel_, " contiguous floats");
  at::Tensor h = header();
  double* hv = h.data_ptr<double>();
  hv[0] = static_cast<double>(PushKind::Push);
  hv[1] = static_cast<double>(push.base_version);
  hv[2] = static_cast<double>(push.step);
  hv[3] = push.share;
  hv[4] = push.loss_sum;
  hv[5] = push.samples;
  hv[6] = push.stop_signal;
  hv[7] = static_cast<double>(numel_);
  channel_.send_recv({{0, h}}, {}, kPushHeaderTag);
  channel_.send_recv({{0, push.gradient}}, {}, kPushGradientTag);
  bytes_sent_ += h.numel() * 8 + numel_ * 4;
}

Reply PsClient::await_reply(at::Tensor& params) {
  at::Tensor reply = header();
  channel_.send_recv({}, {{0, reply}}, kReplyHeaderTag);
  const double* rv = reply.data_ptr<double>();
  if (static_cast<int>(rv[0]) == static_cast<int>(ReplyKind::Failed))
    throw CollectiveError(detail::str("rank ", channel_.rank(), ": ", server_, " reports that a worker was lost"));
  channel_.send_recv({}, {{0, params}}, kReplyParamsTag);
  Reply r;
  r.version = static_cast<int64_t>(rv[1]);
  r.stop_signal = static_cast<int>(rv[2]);
  r.dropped = rv[3] != 0;
  r.loss = rv[4];
  return r;
}

void PsClient::request_snapshot() {
  at::Tensor h = header();
  h.data_ptr<double>()[0] = static_cast<double>(PushKind::Snapshot);
  channel_.send_recv({{0, h}}, {}, kPushHeaderTag);
}

void PsClient::finish() {
  at::Tensor h = header();
  h.data_ptr<double>()[0] = static_cast<double>(PushKind::Finished);
  channel_.send_recv({{0, h}}, {}, kPushHeaderTag);  // not counted: bytes_sent() counts the pushes
}

// ---- named tensors over a channel ------------------------------------------------------------------------
// First the description (int64: count, then per tensor: name length, dtype, rank, sizes), its length
// sent before it; then the names' bytes; then each tensor's data.
void send_named_tensors(const World& channel, int to, const optim::NamedTensors& tensors, int tag) {
  std::vector<int64_t> desc = {static_cast<int64_t>(tensors.size())};
  std::string names;
  for (const auto& [name, t] : tensors) {
    desc.push_back(static_cast<int64_t>(name.size()));
    desc.push_back(static_cast<int64_t>(t.scalar_type()));
    desc.push_back(t.dim());
    for (int64_t d : t.sizes()) desc.push_back(d);
    names += name;
  }
  at::Tensor length = at::full({1}, static_cast<int64_t>(desc.size()), at::kLong);
  at::Tensor d = at::from_blob(desc.data(), {static_cast<int64_t>(desc.size())}, at::kLong).clone();
  channel.send_recv({{to, length}}, {}, tag);
  channel.send_recv({{to, d}}, {}, tag);
  if (!names.empty()) {
    at::Tensor bytes = at::from_blob(names.data(), {static_cast<int64_t>(names.size())}, at::kByte).clone();
    channel.send_recv({{to, bytes}}, {}, tag);
  }
  for (const auto& [name, t] : tensors)
    if (t.numel() > 0) channel.send_recv({{to, t.contiguous()}}, {}, tag);
}

optim::NamedTensors receive_named_tensors(const World& channel, int from, int tag) {
  at::Tensor length = at::empty({1}, at::kLong);
  channel.send_recv({}, {{from, length}}, tag);
  at::Tensor d = at::empty({length.item<int64_t>()}, at::kLong);
  channel.send_recv({}, {{from, d}}, tag);
  const int64_t* desc = d.data_ptr<int64_t>();
  const int64_t count = desc[0];
  struct Entry {
    int64_t name_length;
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
  };
  std::vector<Entry> entries;
  int64_t at_desc = 1, name_bytes = 0;
  for (int64_t i = 0; i < count; ++i) {
    Entry e{desc[at_desc], static_cast<at::ScalarType>(desc[at_desc + 1]), {}};
    const int64_t dims = desc[at_desc + 2];
    e.sizes.assign(desc + at_desc + 3, desc + at_desc + 3 + dims);
    at_desc += 3 + dims;
    name_bytes += e.name_length;
    entries.push_back(std::move(e));
  }
  at::Tensor bytes = at::empty({name_bytes}, at::kByte);
  if (name_bytes > 0) channel.send_recv({}, {{from, bytes}}, tag);
  optim::NamedTensors out;
  const char* names = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  for (const Entry& e : entries) {
    at::Tensor t = at::empty(e.sizes, at::TensorOptions().dtype(e.dtype));
    if (t.numel() > 0) channel.send_recv({}, {{from, t}}, tag);
    out.emplace_back(std::string(names, static_cast<size_t>(e.name_length)), t);
    names += e.name_length;
  }
  return out;
}

}  // namespace ration::dist
