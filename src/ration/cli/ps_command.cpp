// ps_command.cpp — `ration ps serve` (see ps_command.h).
#include "ps_command.h"

#include "ration/base/check.h"
#include "ration/ps/client.h"

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
  // Disabling sub-features (docs/METHODS.md, "Disabling and re-admission").
  cmd->serve->add_option("--evict", cmd->evict, "importance | frequency | lru | l2 | none (default none)");
  cmd->serve->add_option("--evict-scope", cmd->evict_scope,
                         "slot (lowest rows chosen within each table, default) | shard (all tables pooled)");
  cmd->serve->add_option("--max-bytes", o.evict.max_bytes, "cap on this shard's accounted table bytes (0: none)");
  cmd->serve->add_option("--evict-every", o.evict.evict_every, "an eviction round every N steps (default 100)");
  cmd->serve->add_option("--keep-fraction", o.evict.keep_fraction, "each round keeps at most this fraction of rows");
  cmd->serve->add_option("--evict-threshold", o.evict.threshold, "each round disables rows scoring below it");
  cmd->serve->add_option("--readmit-after", o.evict.readmit_after, "pushes a disabled id needs to come back (2)");
  cmd->serve->add_option("--importance-decay", o.evict.importance_decay, "per-step decay of the importance (0.95)");
  cmd->serve->add_option("--evict-grace", o.evict.grace_steps, "steps a new row ranks above older ones (0: off)");
  cmd->serve->add_option("--disabled-share", o.evict.disabled_share,
                         "share of the byte budget remembered disabled ids may use (0.05)");
  // The online (serving) side.
  cmd->serve->add_flag("--online", cmd->online, "serve a mirror of the training shards (Lookup, Predict)");
  cmd->serve->add_option("--follow", cmd->follow, "--online: the training shards' HOST:PORT list, in shard order");
  ps::OnlineOptions& on = cmd->online_options;
  cmd->serve->add_option("--state-dir", on.state_dir, "--online: RocksDB state directory (restart resumes from it)");
  cmd->serve->add_option("--sync-interval-s", on.sync_interval_s, "--online: seconds between syncs (0: on demand)");
  cmd->serve->add_option("--delta-rows", on.max_rows, "--online: rows per delta page");
  cmd->serve->add_option("--model-config", on.model_config, "--online: the trainer's config (for Predict)");
  cmd->serve->add_option("--checkpoint-dir", on.checkpoint_dir, "--online: the trainer's checkpoint directory");
  cmd->serve->add_option("--apply-delay-ms", on.apply_delay_ms, "--online, tests: pause before writing each delta");
  cmd->serve->add_option("--follow-tls-ca", on.follow_tls_ca,
                         "--online: PEM CA that signed the training shards' certificates (connect to them with TLS)");
  cmd->serve->add_option("--follow-tls-cert", on.follow_tls_cert,
                         "--online: PEM client certificate for training shards started with --tls-ca");
  cmd->serve->add_option("--follow-tls-key", on.follow_tls_key, "--online: PEM private key of --follow-tls-cert");
  cmd->serve->add_option("--follow-tls-target-name", on.follow_tls_target_name,
                         "--online: the name to check in the training shards' certificates (default: the host)");
  return cmd;
}

int run_ps_command(PsCommand& cmd) {
  if (cmd.online) {
    ps::OnlineOptions o = cmd.online_options;
    o.follow = ps::split_endpoints(cmd.follow);
    RATION_CHECK(!o.follow.empty(), "ps serve --online: --follow needs the training shards' HOST:PORT list");
    o.listen = cmd.options.listen;
    o.auth_token_file = cmd.options.auth_token_file;
    o.tls_cert = cmd.options.tls_cert;
    o.tls_key = cmd.options.tls_key;
    o.tls_ca = cmd.options.tls_ca;
    return ps::serve_online_until_signal(o);
  }
  RATION_CHECK(cmd.follow.empty(), "ps serve: --follow is for --online servers");
  const ps::OnlineOptions& on = cmd.online_options;
  RATION_CHECK(on.follow_tls_ca.empty() && on.follow_tls_cert.empty() && on.follow_tls_key.empty(),
               "ps serve: --follow-tls-ca/--follow-tls-cert/--follow-tls-key are for --online servers");
  cmd.options.evict.policy = ps::evict_policy_from_name(cmd.evict, "--evict");
  cmd.options.evict.scope = ps::evict_scope_from_name(cmd.evict_scope, "--evict-scope");
  cmd.options.shard = ps::parse_shard(cmd.shard, "--shard");
  RATION_CHECK(cmd.options.limits.max_ids >= 1, "--max-ids must be >= 1");
  RATION_CHECK(cmd.options.limits.max_message_bytes >= 1024 && cmd.options.limits.max_message_bytes <= (int64_t{1} << 31) - 1,
               "--max-message-bytes must be in [1024, 2^31)");
  return ps::serve_until_signal(cmd.options);
}

}  // namespace ration::cli
