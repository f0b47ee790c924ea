// bench_util.h — small helpers every bench program uses (not part of the library).
#pragma once
#include <time.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
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

// The machine, as /proc/cpuinfo and /proc/meminfo name it: "2 vCPU AMD EPYC ..., 24 GiB" (for the JSON).
inline std::string machine() {
  std::string model = "unknown CPU", line;
  std::ifstream cpu("/proc/cpuinfo");
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  long long mem_kb = 0;
  std::ifstream mem("/proc/meminfo");
  while (std::getline(mem, line))
    if (line.rfind("MemTotal:", 0) == 0) mem_kb = std::stoll(line.substr(9));
  return std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " vCPU " + model + ", " +
         std::to_string((mem_kb + (1 << 19)) >> 20) + " GiB";
}

}  // namespace ration::bench
