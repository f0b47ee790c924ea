// ration_run.h — run the `ration` CLI built beside the benches and read back its JSON report (bench
// programs only, not part of the library).
// Owns: the command line's common tail (--report, --json, --set overrides, silenced output), the report's
// temporary file, the quiet `ration train` (optionally under `ration launch`) the data-parallel and
// parameter-server benches start from, and a run whose progress lines are kept with their arrival times.
// Does not own: which model, world size and settings a bench runs.
#pragma once
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "bench_util.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace ration::bench {

// "[launch -n N --master-port 0 -- ]train SRC/configs/MODEL.toml --steps S --set ...": one thread per
// process, no checkpoints, no progress lines, `batch` per process; `launch_n` > 0 runs it under
// `ration launch -n launch_n`.
inline std::string quiet_train_args(const std::string& source_dir, const std::string& model, int launch_n,
                                    int64_t steps, int64_t batch, const std::string& launch_flags = "") {
  std::ostringstream args;
  if (launch_n > 0) args << "launch -n " << launch_n << " --master-port 0 " << launch_flags << " -- ";
  args << "train " << source_dir << "/configs/" << model << ".toml --steps " << steps
       << " --set train.threads=1 --set train.checkpoint_dir= --set train.log_every=100000"
       << " --set train.batch_size=" << batch;
  return args.str();
}

// Runs `<binary_dir>/ration <args> --report TMP --json --set <extra>...` with its output discarded and
// returns the report (empty when the run wrote none; a failed command is named on stderr).
inline nlohmann::json run_ration_report(const std::string& binary_dir, const std::string& args,
                                        const std::vector<std::string>& extra, const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path report = fs::temp_directory_path() / ("ration-" + tag + "-bench-" + std::to_string(::getpid()) + ".json");
  std::ostringstream cmd;
  cmd << binary_dir << "/ration " << args << " --report " << report << " --json";
  for (const auto& e : extra) cmd << " --set " << e;
  cmd << " > /dev/null 2>&1";
  if (std::system(cmd.str().c_str()) != 0) std::cerr << "command failed: " << cmd.str() << "\n";
  nlohmann::json r;
  std::ifstream in(report);
  if (in.good()) in >> r;
  fs::remove(report);
  return r;
}

// A run whose output was kept: its report (empty when it wrote none) and every line it printed, stdout and
// stderr together (under `ration launch`, each prefixed "[rank k] "), stamped as it arrived.
struct TimedReport {
  nlohmann::json report;
  std::vector<TimedLine> lines;
  int status = 0;  // the shell's status (0: every rank exited 0)
};

// Runs `<binary_dir>/ration <args> --report TMP --set <extra>...` like run_ration_report but without
// --json, so rank 0's progress and evaluation lines come back with the times they were printed at
// (`ration train` flushes each line; set train.log_every for the step lines wanted).
inline TimedReport run_ration_timed(const std::string& binary_dir, const std::string& args,
                                    const std::vector<std::string>& extra, const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path report = fs::temp_directory_path() / ("ration-" + tag + "-bench-" + std::to_string(::getpid()) + ".json");
  std::ostringstream cmd;
  cmd << binary_dir << "/ration " << args << " --report " << report;
  for (const auto& e : extra) cmd << " --set " << e;
  cmd << " 2>&1";
  TimedReport r;
  r.lines = run_command_timed(cmd.str(), &r.status);
  if (r.status != 0) std::cerr << "command failed: " << cmd.str() << "\n";
  std::ifstream in(report);
  if (in.good()) in >> r.report;
  fs::remove(report);
  return r;
}

}  // namespace ration::bench
