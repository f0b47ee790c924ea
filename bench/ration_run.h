// ration_run.h — run the `ration` CLI built beside the benches and read back its JSON report (bench
// programs only, not part of the library).
// Owns: the command line's common tail (--report, --json, --set overrides, silenced output), the report's
// temporary file, and the quiet `ration train` (optionally under `ration launch`) the data-parallel and
// parameter-server benches start from. Does not own: which model, world size and settings a bench runs.
#pragma once
#include <nlohmann/json.hpp>
#include <unistd.h>

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
                                    int64_t steps, int64_t batch) {
  std::ostringstream args;
  if (launch_n > 0) args << "launch -n " << launch_n << " --master-port 0 -- ";
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

}  // namespace ration::bench
