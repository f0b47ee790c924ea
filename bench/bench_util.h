// bench_util.h — small helpers every bench program uses (not part of the library; of ration's headers only
// the header-only base/timing.h, so the programs that only run the CLI use it too).
// Owns: a flag's comma-separated list and a --filter's labels, medians and timers (wall since a time point,
//       process and thread CPU time), the machine's description, the peer processes' command line pieces
//       (thread environment, a Python peer script), running a command for its output (or its lines, each
//       stamped as it arrived) and reading the JSON lines it printed, writing a result JSON, a peer
//       bench's runs summarised per row and side, and main's last resort for an error.
// Does not own: building a model bench's config, model and batch (bench_setup.h) or running the `ration`
//       CLI (ration_run.h).
#pragma once
#include "ration/base/timing.h"
#include <nlohmann/json.hpp>
#include <time.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace ration::bench {

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// "1,2,3" -> {1, 2, 3}: a flag's list of numbers (integers read with std::stoll, others with std::stod).
template <typename T>
std::vector<T> numbers(const std::string& s, char sep = ',') {
  std::vector<T> out;
  for (const std::string& item : split(s, sep)) {
    if constexpr (std::is_integral_v<T>) out.push_back(static_cast<T>(std::stoll(item)));
    else out.push_back(static_cast<T>(std::stod(item)));
  }
  return out;
}

// The library's clocks and median (base/timing.h: header-only, no library to link), and seconds since t0.
using ration::cpu_ms_now;
using ration::median;
using ration::ms_since;
using ration::thread_cpu_ms;
inline double seconds_since(std::chrono::steady_clock::time_point t0) { return ms_since(t0) / 1000.0; }

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

// The environment prefix that gives a peer process ration's thread settings: OpenMP (ATen) and OpenBLAS's
// own pool both at `threads` (ration's train.threads sets both, core/compute_threads.h).
inline std::string thread_env(int threads) {
  const std::string t = std::to_string(threads);
  return "env OMP_NUM_THREADS=" + t + " OPENBLAS_NUM_THREADS=" + t + " ";
}

// A Python peer under Debian's /usr/bin/python3 (python3-torch): "/usr/bin/python3 SRC/bench/SCRIPT".
inline std::string python_peer(const std::string& source_dir, const std::string& script) {
  return "/usr/bin/python3 " + source_dir + "/bench/" + script;
}

// Runs `cmd` through the shell and returns what it printed on stdout; `status` (optional) gets pclose's
// status, or -1 when the command could not be started.
inline std::string run_command(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) {
    if (status) *status = -1;
    return out;
  }
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int rc = ::pclose(f);
  if (status) *status = rc;
  return out;
}

// One line a command printed, and when it arrived: seconds since the command was started.
struct TimedLine {
  double seconds = 0;
  std::string text;  // without its newline
};

// Runs `cmd` through the shell and returns every line it printed on stdout, each stamped as it arrived
// (exact to the reader's wake-up only when the command flushes its lines as it prints them); `status`
// (optional) as run_command's.
inline std::vector<TimedLine> run_command_timed(const std::string& cmd, int* status = nullptr) {
  std::vector<TimedLine> out;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) {
    if (status) *status = -1;
    return out;
  }
  std::string line;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) {
    line += buf;
    if (line.back() != '\n') continue;  // a line longer than the buffer: read on
    line.pop_back();
    out.push_back({seconds_since(t0), line});
    line.clear();
  }
  if (!line.empty()) out.push_back({seconds_since(t0), line});
  const int rc = ::pclose(f);
  if (status) *status = rc;
  return out;
}

// A --filter flag's selection: whether `label` is one of its '|'-separated labels (an empty filter
// selects every label).
inline bool selected(const std::string& filter, const std::string& label) {
  return filter.empty() || ("|" + filter + "|").find("|" + label + "|") != std::string::npos;
}

// Every JSON object a peer printed, one per line (from the line's first '{' to its end), in order; lines
// that do not parse are skipped.
inline std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while ((pos = text.find('{', pos)) != std::string::npos) {
    const size_t end = text.find('\n', pos);
    try {
      out.push_back(nlohmann::json::parse(text.substr(pos, end == std::string::npos ? end : end - pos)));
    } catch (const std::exception&) {
    }
    if (end == std::string::npos) break;
    pos = end;
  }
  return out;
}

// Writes `j` (indented by 2, one trailing newline) to `path`, creating its directory first. False (and a
// line on stderr) when the file could not be written.
inline bool write_json(const std::string& path, const nlohmann::json& j) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

// The value after flag argv[i] (i moves onto it), or an error naming the program and the flag.
inline std::string flag_value(int argc, char** argv, int& i, const char* program) {
  if (i + 1 >= argc) throw std::runtime_error(std::string(program) + ": " + argv[i] + " needs a value");
  return argv[++i];
}

// ---- peer benches (bench_train_peer, bench_torchscript_peer): interleaved runs of each side of a row

// One run: its row (a family, a model), its side ("ration", "pytorch", ...) and the run's figures
// (`loop_ms_median`, `peak_above_baseline_bytes`, ...).
struct PeerRun {
  std::string row, side;
  nlohmann::json result;
};

// Per side of `row`: the median over repetitions of each run's median loop time, every repetition's, the
// fastest and slowest, and the largest peak above the baseline.
inline nlohmann::json summarise_sides(const std::vector<PeerRun>& runs, const std::string& row) {
  std::map<std::string, std::vector<double>> loop;
  std::map<std::string, int64_t> peak;
  for (const PeerRun& r : runs) {
    if (r.row != row) continue;
    loop[r.side].push_back(r.result["loop_ms_median"].get<double>());
    peak[r.side] = std::max<int64_t>(peak[r.side], r.result.value("peak_above_baseline_bytes", int64_t{0}));
  }
  nlohmann::json sides = nlohmann::json::object();
  for (const auto& [side, v] : loop)
    sides[side] = {{"loop_ms_median", median(v)}, {"loop_ms_reps", v}, {"loop_ms_min", *std::min_element(v.begin(), v.end())},
                   {"loop_ms_max", *std::max_element(v.begin(), v.end())}, {"peak_above_baseline_bytes", peak[side]}};
  return sides;
}

// `ours`' median loop time over `theirs`' in a row's summary (null where either side did not run).
inline nlohmann::json loop_ratio(const nlohmann::json& sides, const char* ours, const char* theirs) {
  return sides.contains(ours) && sides.contains(theirs)
             ? nlohmann::json(sides[ours]["loop_ms_median"].get<double>() / sides[theirs]["loop_ms_median"].get<double>())
             : nlohmann::json(nullptr);
}

// A side's repetitions, "a/b/c" in whole milliseconds.
inline std::string reps_text(const nlohmann::json& side) {
  std::string reps;
  for (double v : side["loop_ms_reps"]) reps += (reps.empty() ? "" : "/") + std::to_string(static_cast<int>(v + 0.5));
  return reps;
}

// Every run's figures with its row (under `row_key`) and side, for the result JSON.
inline nlohmann::json runs_json(const std::vector<PeerRun>& runs, const char* row_key) {
  nlohmann::json all = nlohmann::json::array();
  for (const PeerRun& r : runs) {
    nlohmann::json j = r.result;
    j[row_key] = r.row;
    j["side"] = r.side;
    all.push_back(j);
  }
  return all;
}

// main's last resort: "error: WHAT" on stderr, exit status 2.
inline int report_error(const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}

}  // namespace ration::bench
