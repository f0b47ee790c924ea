// openmp.cpp — the bounded OpenMP spin-wait and its one re-execution (see openmp.h).
#include "ration/base/openmp.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ration::openmp {
namespace {
const char* env(const char* name) { return std::getenv(name); }
}  // namespace

std::string spin_setting() {
  if (const char* count = env("GOMP_SPINCOUNT")) return count;
  if (const char* policy = env("OMP_WAIT_POLICY")) return policy;
  return {};
}

std::string spin_chosen_by() {
  if (env("RATION_OMP_SELECTED") != nullptr) return "ration";
  if (env("GOMP_SPINCOUNT") != nullptr || env("OMP_WAIT_POLICY") != nullptr) return "user";
  return "runtime";
}

void bound_spin_wait(char** argv, int threads) {
  if (threads <= 1 || env("GOMP_SPINCOUNT") != nullptr || env("OMP_WAIT_POLICY") != nullptr) return;
  setenv("GOMP_SPINCOUNT", kBoundedSpinCount, 1);
  setenv("RATION_OMP_SELECTED", "1", 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "warning: restarting with GOMP_SPINCOUNT=%s failed (%s); OpenMP threads keep libgomp's "
               "default spin-wait, slow on a busy machine (set GOMP_SPINCOUNT yourself)\n",
               kBoundedSpinCount, std::strerror(errno));
  unsetenv("GOMP_SPINCOUNT");
  unsetenv("RATION_OMP_SELECTED");
}

}  // namespace ration::openmp
