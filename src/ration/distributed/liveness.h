// liveness.h — which rank was lost: heartbeats through the world's rendezvous store, and the diagnosis a
// rank runs when one of its collectives fails.
// Owns: the heartbeat thread (key live/hb/<rank>, a counter bumped every period), the "leaving" note a
//       rank writes before it exits on purpose (live/gone/<rank> = why), and diagnose(): watch every
//       peer's heartbeat for a window and name the ranks that neither beat nor left a note.
// Does not own: the collectives (distributed/world.h) or what the caller does with the answer (the trainer
//       reports it and exits non-zero).
//
// Why it works: a rank killed with SIGKILL takes its sockets with it, so its peers' next collective fails
// at once (Gloo sees the connection close) or after the world's timeout; the heartbeat tells a dead rank
// from one that is merely slow. Every survivor diagnoses for the same window before leaving, so a
// survivor is never mistaken for the lost rank. Rank 0 serves the TCP store: it lingers after its own
// diagnosis until every surviving peer has left its note, and when rank 0 itself is lost the store stops
// answering, which names rank 0.
#pragma once
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "ration/distributed/world.h"

namespace ration::dist {

class Liveness {
 public:
  explicit Liveness(World world, std::chrono::milliseconds period = std::chrono::milliseconds(250));
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // A sentence naming the lost rank(s) ("lost rank 1 (no heartbeat for 3.0 s: ...)"), or saying that
  // every peer is alive. Blocks for about `window`; rank 0 then waits up to `linger` (default: `window`)
  // for the survivors' notes before returning (a survivor busy in a long step under load reaches its
  // failing collective, and its diagnosis, late: if rank 0 left before, the store would be gone and that
  // survivor would blame rank 0). Also writes this rank's own leaving note with the answer.
  std::string diagnose(std::chrono::milliseconds window, std::chrono::milliseconds linger = {});
  // Tells the others this rank is about to exit on purpose, and why (after an error of its own).
  void leaving(const std::string& why);

 private:
  void beat_loop();
  std::string key(const char* kind, int rank) const;

  World world_;
  std::chrono::milliseconds period_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ration::dist
