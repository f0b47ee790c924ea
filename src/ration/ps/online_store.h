// online_store.h — the serving side's copy of the training parameter servers' tables: a mirror per
// (training shard, table) holding values only, kept current by deltas, persisted in RocksDB.
// Owns: Delta (one table's changes from one source: rows with versions, tombstones, from/to version,
//       epoch, full or incremental), DeltaSource (where deltas come from: a ShardCore in this process
//       or a training shard over gRPC), OnlineStore (applying a delta atomically — a Lookup sees the
//       table wholly before or wholly after it —, refusing a delta whose from_version is not the
//       mirror's version, so gaps and out-of-order deltas force a full copy; the RocksDB state written in
//       one atomic batch per delta with the version; Lookup; counters), sync_source (pull every table's
//       delta from one source, falling back to a full copy when needed), the follower's connection to a
//       training shard (TLS when it serves TLS; the token only over TLS or loopback).
// Does not own: producing deltas (ps/shard.h, ps/store.h), the serving RPCs and the sync timer
//       (serving/online_server.h), the dense model (models/ctr.h).
// Method: docs/METHODS.md, "Sparse embeddings on parameter servers", "Online parameter server".
#pragma once
#include <grpcpp/support/status.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "proto/ps.pb.h"
#include "ration/ps/shard.h"
#include "ration/ps/store.h"

namespace rocksdb {
class DB;
}

namespace ration::ps {

struct Delta {
  int source = 0;  // training shard index
  std::string table;
  TableOptions options;
  uint64_t epoch = 0;
  bool full = false;
  int64_t from_version = 0, to_version = 0;
  std::vector<uint64_t> ids;
  std::vector<float> values;  // ids.size() * dim
  std::vector<int64_t> versions;
  std::vector<uint64_t> tombstones;
  std::vector<int64_t> tombstone_versions;
};

// Where one training shard's deltas come from.
class DeltaSource {
 public:
  virtual ~DeltaSource() = default;
  virtual std::string endpoint() const = 0;
  virtual grpc::Status list_tables(const wire::ListTablesRequest& q, wire::ListTablesResponse* r) = 0;
  virtual grpc::Status get_delta(const wire::DeltaRequest& q, wire::DeltaResponse* r) = 0;
};
std::unique_ptr<DeltaSource> embedded_delta_source(ShardCore& core);
// How a follower reaches the training shards: a bearer token (or none), and TLS when tls_ca names the CA
// that signed their certificates (with a client certificate for shards started with --tls-ca).
struct FollowSecurity {
  std::string token;
  std::string tls_ca, tls_cert, tls_key;  // PEM files
  std::string tls_target_name;            // override the name checked in the shard's certificate
};
// Checks `endpoint` (HOST:PORT) against `security`: the token goes only over TLS or to a loopback address;
// a client certificate needs its key and the CA. Errors name the flags (--follow, --follow-tls-*).
void check_follow_security(const std::string& endpoint, const FollowSecurity& security);
// A training shard at HOST:PORT (checked by check_follow_security).
std::unique_ptr<DeltaSource> remote_delta_source(const std::string& endpoint, const FollowSecurity& security,
                                                 int64_t max_message_bytes = 256 << 20);

// How a delta was applied.
enum class ApplyResult {
  Applied,     // the mirror is at delta.to_version
  Gap,         // delta.from_version != the mirror's version (missing or out-of-order delta); nothing changed
  EpochChanged // an incremental delta from a different table object; nothing changed
};

struct OnlineCounters {
  int64_t syncs = 0, full_resyncs = 0, delta_rows = 0, tombstones = 0, gaps = 0, lookups = 0;
};

struct MirrorInfo {
  int source = 0;
  std::string table;
  int64_t version = -1;        // -1: holds nothing yet
  int64_t source_version = 0;  // the source's version seen at the last sync
  uint64_t epoch = 0;
  int64_t rows = 0, disabled = 0, bytes = 0;
};

class OnlineStore {
 public:
  // num_sources: training shards (ids are split among them by the stable hash). state_dir empty: nothing
  // persisted; else the RocksDB state there is loaded (mirrors resume at their persisted versions).
  OnlineStore(int num_sources, std::string state_dir);
  ~OnlineStore();
  OnlineStore(const OnlineStore&) = delete;
  OnlineStore& operator=(const OnlineStore&) = delete;

  // Applies the delta atomically (persisted first, then swapped in under the write lock).
  ApplyResult apply(const Delta& delta);
  // Test hook: sleep this long after persisting nothing yet, before writing a delta (kill -9 tests).
  void set_apply_delay_ms(int64_t ms) { apply_delay_ms_ = ms; }

  // Values of ids (n * dim into out). Absent ids read their initial value, disabled ids zeros — as the
  // training side's read-only pull. Returns false if the table is unknown.
  bool lookup(const std::string& table, const uint64_t* ids, int64_t n, float* out);
  int64_t dim(const std::string& table) const;  // -1 when unknown
  std::vector<MirrorInfo> mirrors() const;
  // The mirror's version of (source, table), -1 when it holds none; and its epoch.
  int64_t version(int source, const std::string& table) const;
  uint64_t epoch(int source, const std::string& table) const;
  OnlineCounters counters() const;
  void count_sync(bool full) {
    ++syncs_;
    if (full) ++full_resyncs_;
  }

 private:
  struct Mirror;
  Mirror* find(int source, const std::string& table) const;
  int64_t dim_unlocked(const std::string& table) const;
  void load_state();
  void persist(const Delta& delta, const Mirror* before);

  int num_sources_;
  std::string state_dir_;
  std::unique_ptr<rocksdb::DB> db_;
  mutable std::shared_mutex mu_;  // Lookup shared; apply exclusive
  std::map<std::pair<int, std::string>, std::unique_ptr<Mirror>> mirrors_;
  std::atomic<int64_t> apply_delay_ms_{0};
  std::atomic<int64_t> syncs_{0}, full_resyncs_{0}, delta_rows_{0}, tombstones_{0}, gaps_{0}, lookups_{0};
};

struct SyncReport {
  int64_t rows = 0, tombstones = 0, bytes = 0;
  bool full = false;
  bool gap = false;  // a delta was refused and the table copied in full
};

// Pulls every table of `source_index` from `source` into `store` (page size max_rows). A table the mirror
// does not hold, a new epoch, a `need_full` answer or a refused delta (ApplyResult::Gap) make it copy the
// table in full. Errors (unreachable source) as ration::Error naming the endpoint.
SyncReport sync_source(OnlineStore& store, int source_index, DeltaSource& source, int64_t max_rows = 65536);
// Fetches one delta (all its pages) without applying it: from_version -1 is a full copy.
Delta fetch_delta(DeltaSource& source, int source_index, const std::string& table, int64_t from_version,
                  int64_t max_rows, bool* need_full);

}  // namespace ration::ps
