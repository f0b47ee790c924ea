// online_server.h — the online (serving) parameter server: follows the training shards, serves Lookup
// and Predict, reports staleness.
// Owns: OnlineOptions (validation naming the flag), OnlineServer (the sources — embedded ShardCores or
//       gRPC endpoints —, the sync loop every interval and on demand, staleness bookkeeping, the dense
//       model loaded from the trainer's latest checkpoint for Predict, the OnlineParameterServer gRPC
//       service when a listen address is given), serve_online_until_signal for `ration ps serve --online`.
// Does not own: mirrors and delta application (ps/online_store.h), producing deltas (ps/shard.h), the
//       model's architecture (models/ctr.h).
// Method: docs/METHODS.md, "Sparse embeddings on parameter servers", "Online parameter server".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/ps.pb.h"
#include "ration/ps/online_store.h"
#include "ration/ps/server.h"

namespace ration::ps {

struct OnlineOptions {
  std::vector<std::string> follow;  // training shard endpoints, in shard order
  std::string listen;               // HOST:PORT for the serving RPCs; empty: no gRPC server (embedded)
  std::string state_dir;            // RocksDB state (empty: nothing persisted)
  double sync_interval_s = 1.0;     // 0: sync only on demand (Sync RPC, sync_now())
  int64_t max_rows = 65536;         // rows per GetDelta page
  std::string auth_token_file;      // token sent to the training shards and required from callers
  // Reaching the training shards: TLS when follow_tls_ca names the CA of their certificates (the token,
  // if any, then travels encrypted; without TLS it goes only to loopback shards), with a client
  // certificate for shards started with --tls-ca.
  std::string follow_tls_ca, follow_tls_cert, follow_tls_key, follow_tls_target_name;
  std::string tls_cert, tls_key;    // PEM files: serve Lookup/Predict over TLS
  std::string tls_ca;               // PEM: also require client certificates signed by it
  std::string model_config;         // the trainer's config (for Predict); empty: Predict unavailable
  std::string checkpoint_dir;       // where the trainer writes checkpoints (the latest is loaded)
  int64_t apply_delay_ms = 0;       // test hook: pause before writing each delta
  // The listen rule is the training shard's (ps/server.h, check_serve_security): loopback by default,
  // any other address needs clients to authenticate (--auth-token-file, or --tls-ca: mutual TLS); the
  // follow rule is check_follow_security's (ps/online_store.h). Errors name the flag.
  void validate() const;
  ServeSecurity security() const { return {auth_token_file, tls_cert, tls_key, tls_ca}; }
};

class OnlineServer {
 public:
  // Remote sources from options.follow.
  explicit OnlineServer(OnlineOptions options);
  // Embedded sources (tests, benches): the training shards of this process, in shard order.
  OnlineServer(OnlineOptions options, std::vector<std::unique_ptr<DeltaSource>> sources);
  ~OnlineServer();
  OnlineServer(const OnlineServer&) = delete;
  OnlineServer& operator=(const OnlineServer&) = delete;

  // One sync of every source now (also what the timer runs). Returns what it moved.
  SyncReport sync_now();
  // Starts/stops the background sync every sync_interval_s.
  void start_sync_loop();
  void stop_sync_loop();

  grpc::Status lookup(const wire::LookupRequest& q, wire::LookupResponse* r);
  grpc::Status predict(const wire::PredictRequest& q, wire::PredictResponse* r);
  grpc::Status stats(wire::OnlineStatsResponse* r);
  // (Re)loads the dense model from the latest checkpoint when a newer one exists. Returns its step.
  int64_t reload_model();

  // Calls refused for a missing or wrong token (also in Stats).
  void count_auth_failure();
  int64_t auth_failures() const;
  OnlineStore& store() { return *store_; }
  int port() const;
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<OnlineStore> store_;
};

// `ration ps serve --online`: prints "listening on HOST:PORT", syncs every interval until SIGTERM/SIGINT.
int serve_online_until_signal(const OnlineOptions& options);

}  // namespace ration::ps
