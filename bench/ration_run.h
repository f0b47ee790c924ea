// ration_run.h — run the `ration` CLI built beside the benches and read back its JSON report (bench
// programs only, not part of the library).
// Owns: the command line's common tail (--report, --json, --set overrides, silenced output) and the
// report's temporary file. Does not own: which subcommand and flags a bench runs.
#pragma once
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace ration::bench {

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
