// bench_util.h — small helpers every bench program uses (not part of the library).
#pragma once
#include <time.h>

#include <algorithm>
#include <vector>

namespace ration::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

// Process CPU time (all threads): robust to CPU stolen by neighbours on a shared VM, which wall time is not.
inline double cpu_ms_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

}  // namespace ration::bench
