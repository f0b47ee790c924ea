// timing.h — the clocks every layer reads: wall milliseconds since a point, process and thread CPU
// milliseconds, and the median of a sample. One definition for the library, the benchmarks and the tests.
// Owns: nothing but these functions.
#pragma once
#include <time.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace ration {

using SteadyClock = std::chrono::steady_clock;

// Wall milliseconds from t0 to now.
inline double ms_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

// CPU milliseconds of the whole process (all threads): robust to a neighbour stealing CPU on a shared VM.
inline double cpu_ms_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// CPU milliseconds of the calling thread: what it spent itself, not waiting or preempted.
inline double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// The median of a sample (0 when empty; the mean of the middle two for an even count).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ration
