// shard.h — one parameter-server shard's service logic, independent of transport.
// Owns: ShardCore (request validation with clear errors, the shard's EmbeddingStore, counters, the
//       incarnation (random per ShardCore: a restarted server has another), the byte cap on every insert
//       (admission through the Evictor: make room first, refuse what cannot fit; the peak bytes held),
//       and snapshot/restore into its snapshot directory, checking the snapshot's shard identity). The gRPC server (ps/server.h) and the embedded
//       in-process channel (ps/client.h) both call exactly these methods with the wire messages.
// Does not own: authentication (ps/server.h, network only), storage layout (ps/store.h), snapshot
//       files (ps/snapshot.h).
#pragma once
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "proto/ps.pb.h"
#include "ration/ps/evict.h"
#include "ration/ps/partition.h"
#include "ration/ps/store.h"

namespace ration::ps {

struct ShardLimits {
  int64_t max_ids = 1 << 20;        // ids per Pull/Push request
  int64_t max_message_bytes = 256 << 20;  // also the gRPC receive/send limit
};

TableOptions table_options_from_spec(const wire::TableSpec& spec);
wire::TableSpec spec_from_table_options(const TableOptions& options);

class ShardCore {
 public:
  // snapshot_dir empty: Snapshot/Restore answer FAILED_PRECONDITION.
  ShardCore(ShardId shard, std::string snapshot_dir, ShardLimits limits = {});

  grpc::Status declare_tables(const wire::DeclareTablesRequest& req, wire::DeclareTablesResponse* resp);
  grpc::Status pull(const wire::PullRequest& req, wire::PullResponse* resp);
  grpc::Status push(const wire::PushRequest& req, wire::PushResponse* resp);
  grpc::Status stats(const wire::StatsRequest& req, wire::StatsResponse* resp);
  grpc::Status snapshot(const wire::SnapshotRequest& req, wire::SnapshotResponse* resp);
  grpc::Status restore(const wire::RestoreRequest& req, wire::RestoreResponse* resp);
  grpc::Status health(const wire::HealthRequest& req, wire::HealthResponse* resp);
  // Deltas for online mirrors (docs/METHODS.md, "Online parameter server").
  grpc::Status get_delta(const wire::DeltaRequest& req, wire::DeltaResponse* resp);
  grpc::Status list_tables(const wire::ListTablesRequest& req, wire::ListTablesResponse* resp);

  // Disabling (ps/evict.h): from now on, every push of step s runs a round when s % evict_every == 0.
  void set_eviction(const EvictOptions& options);
  Evictor* evictor() { return evictor_.get(); }

  // Restores the newest complete snapshot in the snapshot directory, if any (server start). Returns its
  // version or -1.
  int64_t restore_latest();
  // Restores snapshot `version` from another directory (an embedded shard resuming a checkpoint that was
  // written under a different run directory). Errors as ration::Error.
  void restore_from(const std::string& dir, int64_t version);

  EmbeddingStore& store() { return store_; }
  ShardId shard() const { return shard_; }
  // Random at construction (never 0): the server's identity for this run of it (HealthResponse).
  uint64_t incarnation() const { return incarnation_; }
  // Why this shard cannot snapshot ("" when it can: a server checks, makes and locks its directory at
  // start). Health reports it, so a trainer that checkpoints fails before its first step.
  const std::string& snapshot_problem() const { return snapshot_problem_; }
  // The most accounted bytes held after any insert or eviction round (the byte cap's witness).
  int64_t peak_bytes() const { return peak_bytes_.load(); }
  int64_t refused_rows() const { return refused_rows_.load(); }
  void count_auth_failure() { ++auth_failures_; }
  int64_t auth_failures() const { return auth_failures_.load(); }

 private:
  grpc::Status check_ids(const char* rpc, const std::string& table, int64_t n, Table** out);
  // Under a byte cap: makes room for the rows ids[0, n) would create (an eviction round first when they
  // would not fit). False when they cannot fit: the caller inserts none of them.
  bool admit(Table& t, const uint64_t* ids, int64_t n, bool push, int64_t step);
  // Records the bytes held now (peak) and, should an insert have gone past the cap, cuts back at once.
  void note_held(int64_t step);
  // Pushes only the ids that have a row (a refused admission): their gradients, the others dropped.
  void push_existing(Table& t, const wire::PushRequest& req, const float* grads);
  grpc::Status reject(grpc::StatusCode code, const std::string& message);

  ShardId shard_;
  std::string snapshot_dir_;
  ShardLimits limits_;
  EmbeddingStore store_;
  std::mutex snapshot_mu_;  // one snapshot/restore at a time
  // Pull/Push/Snapshot hold it shared; Restore (which replaces the tables) exclusive.
  mutable std::shared_mutex tables_mu_;
  std::unique_ptr<Evictor> evictor_;
  std::mutex admission_mu_;  // under a byte cap: one admission (room, insert, bytes) at a time
  uint64_t incarnation_ = 0;
  std::string snapshot_problem_;
  std::atomic<int64_t> peak_bytes_{0}, refused_rows_{0}, last_step_{0};
  std::atomic<int64_t> pulls_{0}, pushes_{0}, auth_failures_{0}, rejected_{0}, snapshot_version_{-1};
};

}  // namespace ration::ps
