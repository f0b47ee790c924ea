// ps_command.h — the `ration ps serve` subcommand: flags -> ps::ServeOptions (a training shard, with
// eviction flags) or ps::OnlineOptions (--online: a serving mirror) -> serve until SIGTERM.
// Owns: the flags and their parsing. Does not own: the servers (ps/server.h, serving/online_server.h).
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "ration/serving/online_server.h"
#include "ration/ps/server.h"

namespace ration::cli {

struct PsCommand {
  CLI::App* ps = nullptr;
  CLI::App* serve = nullptr;
  ps::ServeOptions options;
  std::string shard = "0/1";
  std::string evict = "none";
  std::string evict_scope = "slot";
  bool online = false;
  std::string follow;
  ps::OnlineOptions online_options;
};

std::unique_ptr<PsCommand> add_ps_command(CLI::App& app);
int run_ps_command(PsCommand& cmd);

}  // namespace ration::cli
