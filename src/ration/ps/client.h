// client.h — the trainer's view of the parameter servers: one object over N shards, remote or embedded.
// Owns: ShardChannel (one shard behind gRPC, or a ShardCore in this process — the embedded default,
//       the same requests and validation minus the network), PsClient (declaring tables, per-step id
//       deduplication, partitioning ids over shards by the stable hash, calling every shard in parallel,
//       retries with back-off and errors naming the endpoint, timing of pulls and pushes, snapshots; each
//       remote shard's incarnation, learnt on the first answer and sent back on every call, so a server
//       that restarted refuses the trainer instead of serving rolled-back rows; the token sent only over
//       TLS or to loopback addresses).
// Does not own: the shard logic (ps/shard.h), the server (ps/server.h), the model's use of rows
//       (models/ctr.h).
#pragma once
#include <ATen/ATen.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proto/ps.pb.h"
#include "ration/ps/shard.h"
#include "ration/ps/store.h"

namespace ration::ps {

// One shard, whatever the transport.
class ShardChannel {
 public:
  virtual ~ShardChannel() = default;
  virtual std::string endpoint() const = 0;  // "127.0.0.1:7070" or "embedded"
  virtual grpc::Status declare_tables(const wire::DeclareTablesRequest& q, wire::DeclareTablesResponse* r) = 0;
  virtual grpc::Status pull(const wire::PullRequest& q, wire::PullResponse* r) = 0;
  virtual grpc::Status push(const wire::PushRequest& q, wire::PushResponse* r) = 0;
  virtual grpc::Status stats(const wire::StatsRequest& q, wire::StatsResponse* r) = 0;
  virtual grpc::Status snapshot(const wire::SnapshotRequest& q, wire::SnapshotResponse* r) = 0;
  virtual grpc::Status restore(const wire::RestoreRequest& q, wire::RestoreResponse* r) = 0;
  virtual grpc::Status health(const wire::HealthRequest& q, wire::HealthResponse* r) = 0;
};

struct ClientOptions {
  std::vector<std::string> endpoints;  // shard i at endpoints[i]; empty: embedded
  int64_t embedded_shards = 1;         // embedded only
  std::string snapshot_dir;            // embedded only: where its shards snapshot (shard-I-of-N below it)
  std::string auth_token;              // sent as 'authorization: Bearer <token>'
  std::string tls_ca;                  // PEM file: connect with TLS, trusting this CA
  std::string tls_cert, tls_key;       // PEM files: client certificate (servers started with --tls-ca)
  std::string tls_target_name;         // override the name checked in the server certificate
  bool need_snapshots = false;         // checkpoints are on: check_health refuses a shard that cannot snapshot
  int retries = 3;                     // attempts per call on UNAVAILABLE / DEADLINE_EXCEEDED
  int64_t timeout_ms = 30000;          // per attempt
  int64_t backoff_ms = 100;            // doubled after each failed attempt
  int64_t max_ids_per_request = 1 << 18;
  int64_t max_message_bytes = 256 << 20;
};

// Rows of one pull: the unique ids of the request (first-seen order), their rows (U, D) float32, and for
// each requested position the row it maps to (n) int64.
struct PulledRows {
  std::vector<uint64_t> unique_ids;
  at::Tensor rows;
  at::Tensor local_index;
};

struct ClientTimes {
  double pull_ms = 0, push_ms = 0;
  int64_t pulls = 0, pushes = 0, rows_pulled = 0, rows_pushed = 0;
};

struct ShardStats {
  std::string endpoint;
  wire::StatsResponse stats;
};

class PsClient {
 public:
  explicit PsClient(ClientOptions options);
  ~PsClient();

  bool embedded() const { return options_.endpoints.empty(); }
  int num_shards() const { return static_cast<int>(channels_.size()); }
  const ClientOptions& options() const { return options_; }

  // Checks every shard is up and is shard i of N in endpoint order, and with need_snapshots that each
  // can snapshot (errors name the endpoint). Learns each shard's incarnation.
  void check_health();
  void declare_tables(const std::vector<TableOptions>& tables);
  // ids may repeat; each unique id is fetched once, from its shard.
  PulledRows pull(const std::string& table, const int64_t* ids, int64_t n, MissingRow missing = MissingRow::Create);
  // Unique ids and their gradients (n, dim) row-major; split by shard, sent in parallel.
  void push(const std::string& table, const uint64_t* ids, int64_t n, const float* grads, int64_t dim, int64_t step);
  std::vector<ShardStats> stats();
  // Every shard writes (or loads) snapshot `version`.
  void snapshot(int64_t version);
  // Embedded shards read from `embedded_dir`/shard-I-of-N when given (else their own directory).
  void restore(int64_t version, const std::string& embedded_dir = "");

  // Pulls and pushes may run on several threads at once (a prefetching trainer pulls the next batch's
  // rows while it pushes the current one's): the totals are kept under a lock.
  ClientTimes times() const;
  // Embedded only: the shard cores (tests and the embedded snapshot directory).
  ShardCore& embedded_shard(int i);

 private:
  template <typename Call>
  void call_shard(int shard, const char* rpc, Call call);
  template <typename Fn>
  void for_each_shard(const std::vector<int>& shards, Fn fn);

  ClientOptions options_;
  std::vector<std::unique_ptr<ShardCore>> embedded_;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  mutable std::mutex times_mutex_;
  ClientTimes times_;
};

// "a:1,b:2" -> {"a:1", "b:2"} (spaces trimmed, empty entries dropped).
std::vector<std::string> split_endpoints(const std::string& list);

}  // namespace ration::ps
