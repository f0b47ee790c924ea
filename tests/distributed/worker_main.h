// worker_main.h — the shared main() of the multi-process test workers: one rank joins the world from
// the launcher's environment, runs its GoogleTest cases, and leaves together with the others.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <exception>

#include "ration/distributed/world.h"

namespace ration::dist::testing {

// The world every test of this worker uses (set up by run_worker before any test runs).
inline World& world() {
  static World w;
  return w;
}

inline int run_worker(int argc, char** argv, const char* name) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    WorldOptions options;
    options.timeout = std::chrono::seconds(60);
    world() = World::init(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
  const World& w = world();
  std::printf("[rank %d/%d] %s world up\n", w.rank(), w.size(), to_string(w.backend()));
  const int rc = RUN_ALL_TESTS();
  // Leave together when everything passed (a failing rank exits at once; the launcher stops the others).
  if (rc == 0) w.barrier();
  return rc;
}

}  // namespace ration::dist::testing
