// openmp.cpp — the bounded OpenMP spin-wait and its one re-execution (see openmp.h).
#include "ration/base/openmp.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace ration::openmp {
namespace {
const char* env(const char* name) { return std::getenv(name); }

std::string& busy_text() {
  static std::string text;
  return text;
}

// The aggregate "cpu" line of /proc/stat: {busy, total} jiffies (busy: user, system, irq, softirq, steal).
bool read_cpu_times(long long& busy, long long& total) {
  std::ifstream in("/proc/stat");
  std::string label;
  long long v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // user nice system idle iowait irq softirq steal
  if (!(in >> label) || label != "cpu") return false;
  for (long long& x : v)
    if (!(in >> x)) return false;
  busy = v[0] + v[2] + v[5] + v[6] + v[7];
  total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  return true;
}
}  // namespace

double busy_cores(int ms) {
  if (const char* forced = env("RATION_CORES_BUSY")) return std::atof(forced);
  long long b0 = 0, t0 = 0, b1 = 0, t1 = 0;
  if (!read_cpu_times(b0, t0)) return -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (!read_cpu_times(b1, t1) || t1 <= t0) return -1;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<double>(b1 - b0) / static_cast<double>(t1 - t0) * static_cast<double>(cores);
}

std::string busy_at_start() {
  if (const char* carried = env("RATION_OMP_BUSY")) return carried;  // measured before the restart
  return busy_text();
}

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
  const double busy = busy_cores();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  char text[96];
  std::snprintf(text, sizeof text, "%.2f of %ld cores busy", busy, cores);
  busy_text() = busy < 0 ? "unknown" : text;
  if (busy >= 0 && busy <= static_cast<double>(cores - threads) + 0.5) return;  // free: libgomp's default
  setenv("GOMP_SPINCOUNT", kBoundedSpinCount, 1);
  setenv("RATION_OMP_SELECTED", "1", 1);
  setenv("RATION_OMP_BUSY", busy_text().c_str(), 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "warning: restarting with GOMP_SPINCOUNT=%s failed (%s); OpenMP threads keep libgomp's "
               "default spin-wait, slow on a busy machine (set GOMP_SPINCOUNT yourself)\n",
               kBoundedSpinCount, std::strerror(errno));
  unsetenv("GOMP_SPINCOUNT");
  unsetenv("RATION_OMP_SELECTED");
  unsetenv("RATION_OMP_BUSY");
}

}  // namespace ration::openmp
