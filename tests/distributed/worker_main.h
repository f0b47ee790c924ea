// worker_main.h — the shared main() of the multi-process test workers: one rank joins the world from
// the launcher's environment, runs its GoogleTest cases, and leaves together with the others.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <random>
#include <string>

#include "ration/distributed/world.h"

namespace ration::dist::testing {

// The world every test of this worker uses (set up by run_worker before any test runs).
inline World& world() {
  static World w;
  return w;
}

// max |a - b| / max |b| over one tensor (0 when both are 0).
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// A fresh temporary directory name every rank agrees on (rank 0 draws it): ration-<tag>-<number>.
inline std::filesystem::path shared_dir(const std::string& tag) {
  at::Tensor id = at::empty({1}, at::kLong);
  id.data_ptr<int64_t>()[0] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  world().broadcast(id, 0);
  return std::filesystem::temp_directory_path() / ("ration-" + tag + "-" + std::to_string(id.data_ptr<int64_t>()[0]));
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
