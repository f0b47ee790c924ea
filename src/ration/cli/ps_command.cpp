// ps_command.cpp — `ration ps serve` (see ps_command.h).
#include "ps_command.h"

#include "ration/core/check.h"

namespace ration::cli {

std::unique_ptr<PsCommand> add_ps_command(CLI::App& app) {
  auto cmd = std::make_unique<PsCommand>();
  cmd->ps = app.add_subcommand("ps", "parameter-server commands");
  cmd->ps->require_subcommand(1);
  cmd->serve = cmd->ps->add_subcommand("serve", "serve one shard of embedding tables over gRPC until SIGTERM");
  ps::ServeOptions& o = cmd->options;
  o.listen = "127.0.0.1:7070";
  cmd->serve->add_option("--listen", o.listen, "HOST:PORT to listen on (default 127.0.0.1:7070; port 0 picks one)");
  cmd->serve->add_option("--shard", cmd->shard, "this server's shard I/N (ids are split by a stable hash)");
  cmd->serve->add_option("--snapshot-dir", o.snapshot_dir, "directory for snapshots (restored from at start)");
  cmd->serve->add_option("--auth-token-file", o.auth_token_file, "file with the shared token clients must send");
  cmd->serve->add_option("--tls-cert", o.tls_cert, "PEM certificate: serve TLS");
  cmd->serve->add_option("--tls-key", o.tls_key, "PEM private key of --tls-cert");
  cmd->serve->add_option("--tls-ca", o.tls_ca, "PEM CA: require client certificates signed by it");
  cmd->serve->add_option("--max-ids", o.limits.max_ids, "most ids per Pull/Push request");
  cmd->serve->add_option("--max-message-bytes", o.limits.max_message_bytes, "gRPC message size limit");
  return cmd;
}

int run_ps_command(PsCommand& cmd) {
  cmd.options.shard = ps::parse_shard(cmd.shard, "--shard");
  RATION_CHECK(cmd.options.limits.max_ids >= 1, "--max-ids must be >= 1");
  RATION_CHECK(cmd.options.limits.max_message_bytes >= 1024 && cmd.options.limits.max_message_bytes <= (int64_t{1} << 31) - 1,
               "--max-message-bytes must be in [1024, 2^31)");
  return ps::serve_until_signal(cmd.options);
}

}  // namespace ration::cli
