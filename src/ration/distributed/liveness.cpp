// liveness.cpp — heartbeats and the lost-rank diagnosis (see liveness.h).
#include "ration/distributed/liveness.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <vector>

namespace ration::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// The value at `key`, or nullopt when absent; throws when the store does not answer.
std::optional<std::string> peek(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  return string_of(store.get(key));
}

}  // namespace

Liveness::Liveness(World world, std::chrono::milliseconds period) : world_(std::move(world)), period_(period) {
  if (!world_.store() || world_.size() <= 1) return;
  world_.store()->set(key("hb", world_.rank()), bytes_of("0"));
  thread_ = std::thread([this] { beat_loop(); });
}

Liveness::~Liveness() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string Liveness::key(const char* kind, int rank) const {
  return std::string("ration/live/") + kind + "/" + std::to_string(rank);
}

void Liveness::beat_loop() {
  int64_t beat = 0;
  while (!stop_) {
    std::this_thread::sleep_for(period_);
    try {
      world_.store()->set(key("hb", world_.rank()), bytes_of(std::to_string(++beat)));
    } catch (const std::exception&) {
      // The store is gone (rank 0 exited or was lost): diagnose() reports it; nothing to do here.
    }
  }
}

void Liveness::leaving(const std::string& why) {
  if (!world_.store() || world_.size() <= 1) return;
  try {
    world_.store()->set(key("gone", world_.rank()), bytes_of(why));
  } catch (const std::exception&) {
  }
}

std::string Liveness::diagnose(std::chrono::milliseconds window, std::chrono::milliseconds linger) {
  if (linger.count() <= 0) linger = window;
  if (!world_.store() || world_.size() <= 1) return "no peer to lose (one process)";
  c10d::Store& store = *world_.store();
  const int me = world_.rank(), n = world_.size();
  std::vector<std::optional<std::string>> first(static_cast<size_t>(n));
  std::vector<bool> advanced(static_cast<size_t>(n), false);
  std::vector<std::optional<std::string>> gone(static_cast<size_t>(n));
  const double window_s = std::chrono::duration<double>(window).count();
  std::ostringstream answer;
  try {
    for (int r = 0; r < n; ++r) {
      if (r != me) first[static_cast<size_t>(r)] = peek(store, key("hb", r));
    }
    const auto end = Clock::now() + window;
    while (Clock::now() < end) {
      std::this_thread::sleep_for(period_);
      bool all_alive = true;
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<size_t>(r);
        if (r == me || advanced[i]) continue;
        advanced[i] = peek(store, key("hb", r)) != first[i];
        if (!gone[i]) gone[i] = peek(store, key("gone", r));
        all_alive = all_alive && advanced[i] && !gone[i];
      }
      if (all_alive) break;  // every peer is beating: nobody was lost
    }
    std::vector<int> lost;
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<size_t>(r);
      if (r == me) continue;
      if (!gone[i]) gone[i] = peek(store, key("gone", r));
      if (!advanced[i] && !gone[i]) lost.push_back(r);
    }
    if (lost.empty()) {
      answer << "no rank was lost (every peer's heartbeat is alive or it left on purpose)";
    } else {
      answer << "lost rank" << (lost.size() > 1 ? "s " : " ");
      for (size_t k = 0; k < lost.size(); ++k) answer << (k ? ", " : "") << lost[k];
      answer << " (no heartbeat for " << window_s << " s: crashed, killed, or its host is unreachable)";
    }
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<size_t>(r);
      if (r != me && gone[i] && gone[i]->rfind("lost rank", 0) != 0) answer << "; rank " << r << " left: " << *gone[i];
    }
    leaving(answer.str());
    // Rank 0 serves the store: stay until every surviving peer has read what it needs and left a note.
    if (me == 0) {
      const auto linger_end = Clock::now() + linger;
      for (bool waiting = true; waiting && Clock::now() < linger_end;) {
        std::this_thread::sleep_for(period_);
        waiting = false;
        for (int r = 1; r < n; ++r) {
          const auto i = static_cast<size_t>(r);
          if (!gone[i] && std::find(lost.begin(), lost.end(), r) == lost.end()) {
            gone[i] = peek(store, key("gone", r));
            waiting = waiting || !gone[i];
          }
        }
      }
    }
  } catch (const std::exception&) {
    if (me == 0) return "the rendezvous store this rank serves stopped answering";
    answer.str("");
    answer << "lost rank 0 (it serves the rendezvous store, which no longer answers: crashed, killed, or its host "
              "is unreachable)";
  }
  return answer.str();
}

}  // namespace ration::dist
