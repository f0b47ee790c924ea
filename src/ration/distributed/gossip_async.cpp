// gossip_async.cpp — asynchronous push-sum gossip over a channel of its own (see gossip_async.h).
#include "ration/distributed/gossip_async.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "ration/base/check.h"

namespace ration::dist {
namespace {

constexpr int kMessageTag = 7;  // the channel carries nothing else; receives match on (sender, tag)
constexpr int kHeader = 2;      // a message: [exchange index, kind] as int32 bits, then the (P + 1) share
constexpr int32_t kData = 0, kFinished = 1;

void write_header(at::Tensor& msg, int64_t step, int32_t kind) {
  const int32_t header[kHeader] = {static_cast<int32_t>(step), kind};
  std::memcpy(msg.data_ptr<float>(), header, sizeof(header));
}

std::pair<int64_t, int32_t> read_header(const at::Tensor& msg) {
  int32_t header[kHeader];
  std::memcpy(header, msg.data_ptr<float>(), sizeof(header));
  return {header[0], header[1]};
}

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

struct AsyncPushSum::Shared {
  struct Message {
    int64_t step = 0;
    int sender = 0;
    at::Tensor share;  // (P + 1)
  };
  World channel;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Message> queue;           // arrived, not yet mixed
  std::vector<int64_t> received_upto;   // per incoming neighbour: the step of its newest message (-1: none)
  std::vector<char> finished;           // per incoming neighbour: its 'finished' arrived
  int ended = 0;                        // receiving threads that returned
  std::optional<std::string> failure;   // the first failed receive, naming the neighbour
};

// Each message queued as it arrives; the caller's thread never blocks this one.
void AsyncPushSum::receive_loop(const std::shared_ptr<Shared>& s, size_t index, int sender, int64_t numel) {
  const World& ch = s->channel;
  try {
    for (;;) {
      at::Tensor msg = at::empty({kHeader + numel + 1}, at::kFloat);
      ch.send_recv({}, {{sender, msg}}, kMessageTag);
      const auto [step, kind] = read_header(msg);
      std::lock_guard<std::mutex> lock(s->mu);
      if (kind == kFinished) {
        s->finished[index] = 1;
        ++s->ended;
        s->cv.notify_all();
        return;
      }
      s->queue.push_back({step, sender, msg.narrow(0, kHeader, numel + 1)});
      s->received_upto[index] = step;
      s->cv.notify_all();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(s->mu);
    if (!s->failure)
      s->failure = detail::str("asynchronous gossip: rank ", ch.rank(), " of ", ch.size(),
                               " could not receive from its neighbour rank ", sender, ": ", e.what());
    ++s->ended;
    s->cv.notify_all();
  }
}

AsyncPushSum::AsyncPushSum(World world, GossipGraph graph, int64_t max_staleness)
    : world_(std::move(world)), graph_(graph), max_staleness_(max_staleness) {
  const int n = world_.size();
  distances_ = 0;  // ceil(log2 n): the distances 1, 2, 4, ... below n
  while ((1 << distances_) < n) ++distances_;
  distances_ = std::max(distances_, 1);
  const int r = world_.rank();
  if (n <= 1) return;
  if (graph_ == GossipGraph::Exponential) {
    for (int k = 0; k < distances_; ++k) incoming_.push_back({(r - (1 << k) % n + n) % n, k});
  } else {
    incoming_.push_back({(r + n - 1) % n, -1});
    if (n > 2) incoming_.push_back({(r + 1) % n, -1});
  }
}

AsyncPushSum::~AsyncPushSum() {
  if (!shared_) return;
  bool all_ended;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    all_ended = shared_->ended == static_cast<int>(threads_.size());
  }
  for (std::thread& t : threads_) {
    if (!t.joinable()) continue;
    if (all_ended) t.join();
    else t.detach();  // blocked in a receive from a neighbour that will not send (an error path); exits on its timeout
  }
}

void AsyncPushSum::open(const std::vector<at::Tensor>& params, int64_t step) {
  first_step_ = step;
  numel_ = 0;
  for (const at::Tensor& p : params) numel_ += p.numel();
  shared_ = std::make_shared<Shared>();
  shared_->channel = world_.open_channel("gossip");  // every rank at its first exchange
  shared_->received_upto.assign(incoming_.size(), -1);
  shared_->finished.assign(incoming_.size(), 0);
  for (size_t i = 0; i < incoming_.size(); ++i) {
    std::shared_ptr<Shared> s = shared_;
    const int sender = incoming_[i].rank;
    const int64_t numel = numel_;
    threads_.emplace_back([s, i, sender, numel] { receive_loop(s, i, sender, numel); });
  }
}

std::vector<int> AsyncPushSum::out_neighbours(int64_t e) const {
  const int n = world_.size(), r = world_.rank();
  if (graph_ == GossipGraph::Exponential) {
    const int d = 1 << static_cast<int>((first_step_ + e) % distances_);
    return {(r + d) % n};
  }
  if (n == 2) return {(r + 1) % n};
  return {(r + 1) % n, (r + n - 1) % n};
}

std::vector<int> AsyncPushSum::every_out_neighbour() const {
  const int n = world_.size(), r = world_.rank();
  if (graph_ == GossipGraph::Ring) return out_neighbours(0);
  std::vector<int> out;
  for (int k = 0; k < distances_; ++k) out.push_back((r + (1 << k)) % n);
  return out;
}

int64_t AsyncPushSum::needed(const Incoming& in, int64_t e) const {
  const int64_t m = e - max_staleness_;
  if (m < 0) return -1;
  if (in.phase < 0) return m;  // the ring: every exchange
  const int64_t phase = (first_step_ + m) % distances_;
  const int64_t back = (phase - in.phase + distances_) % distances_;
  return m - back >= 0 ? m - back : -1;
}

void AsyncPushSum::wait_for_needed(int64_t e) {
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mu);
  auto ready = [&] {
    if (s.failure) return true;
    for (size_t i = 0; i < incoming_.size(); ++i)
      if (s.received_upto[i] < needed(incoming_[i], e) && !s.finished[i]) return false;
    return true;
  };
  if (!ready()) {
    ++stats_.waits;
    const auto t0 = std::chrono::steady_clock::now();
    s.cv.wait(lock, ready);
    stats_.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  if (s.failure) throw CollectiveError(*s.failure + " (a neighbour that exited or timed out shows up here)");
  for (size_t i = 0; i < incoming_.size(); ++i)
    RATION_CHECK(s.received_upto[i] >= needed(incoming_[i], e), "asynchronous gossip: rank ", incoming_[i].rank,
                 " finished before sending its message of exchange ", needed(incoming_[i], e), " to rank ",
                 world_.rank(), " (every rank must make the same number of exchanges)");
}

int64_t AsyncPushSum::mix_queued(at::Tensor& acc, int64_t up_to, bool count_staleness) {
  std::vector<Shared::Message> take;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto& q = shared_->queue;
    auto later = std::stable_partition(q.begin(), q.end(),
                                       [&](const Shared::Message& m) { return up_to >= 0 && m.step > up_to; });
    take.assign(std::make_move_iterator(later), std::make_move_iterator(q.end()));
    q.erase(later, q.end());
  }
  std::sort(take.begin(), take.end(), [](const Shared::Message& a, const Shared::Message& b) {
    return a.step != b.step ? a.step < b.step : a.sender < b.sender;
  });
  at::NoGradGuard no_grad;
  for (const Shared::Message& m : take) {
    acc.add_(m.share);
    if (!count_staleness) continue;
    const int64_t staleness = up_to - m.step;
    stats_.staleness_max = std::max(stats_.staleness_max, staleness);
    staleness_sum_ += static_cast<double>(staleness);
  }
  return static_cast<int64_t>(take.size());
}

void AsyncPushSum::set_parameters(const at::Tensor& acc, const std::vector<at::Tensor>& params) {
  weight_ = push_sum_debias(acc, params);
}

Traffic AsyncPushSum::exchange(const std::vector<at::Tensor>& params, int64_t step) {
  Traffic traffic;
  if (world_.size() <= 1) return traffic;
  RATION_CHECK(!finished_, "asynchronous gossip: exchange after finish()");
  if (!shared_) open(params, step);
  const int64_t e = stats_.exchanges++;
  const std::vector<int> to = out_neighbours(e);
  at::Tensor acc = push_sum_share(pack_parameters(params), weight_, static_cast<int>(to.size()) + 1);
  at::Tensor msg = at::empty({kHeader + acc.numel()}, at::kFloat);  // header, then the same share
  write_header(msg, e, kData);
  msg.narrow(0, kHeader, acc.numel()).copy_(acc);
  World::PeerTensors sends;
  for (int peer : to) sends.emplace_back(peer, msg);
  shared_->channel.send_recv(sends, {}, kMessageTag);  // the receivers' threads take it at once
  wait_for_needed(e);
  stats_.mixed += mix_queued(acc, e, /*count_staleness=*/true);
  set_parameters(acc, params);
  traffic.payload_bytes = traffic.wire_bytes = bytes_of(msg) * static_cast<int64_t>(to.size());
  return traffic;
}

void AsyncPushSum::finish(const std::vector<at::Tensor>& params) {
  if (!shared_ || finished_) return;
  finished_ = true;
  at::Tensor msg = at::zeros({kHeader + numel_ + 1}, at::kFloat);
  write_header(msg, stats_.exchanges, kFinished);
  World::PeerTensors sends;
  for (int peer : every_out_neighbour()) sends.emplace_back(peer, msg);
  shared_->channel.send_recv(sends, {}, kMessageTag);
  {
    Shared& s = *shared_;
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.failure || s.ended == static_cast<int>(threads_.size()); });
    if (s.failure) throw CollectiveError(*s.failure + " (a neighbour that exited or timed out shows up here)");
  }
  for (std::thread& t : threads_) t.join();
  at::Tensor acc = push_sum_share(pack_parameters(params), weight_, 1);  // (w x, w)
  stats_.drained = mix_queued(acc, -1, /*count_staleness=*/false);
  if (stats_.drained > 0) set_parameters(acc, params);  // else params are x / w already (no rounding added)
}

AsyncGossipStats AsyncPushSum::stats() const {
  AsyncGossipStats s = stats_;
  s.staleness_mean = stats_.mixed > 0 ? staleness_sum_ / static_cast<double>(stats_.mixed) : 0;
  return s;
}

}  // namespace ration::dist
