// snapshot.h — persistence of one shard's tables in RocksDB, written atomically.
// Owns: the snapshot layout — DIR/v<version>/ a RocksDB database (table specs, then every row: values,
//       optimiser state and RowInfo, then the disabled ids with their sighting counts) written under a temporary name and renamed when complete; DIR/LATEST
//       names the newest complete version (replaced by rename). Old versions beyond `keep` are removed.
//       Each snapshot records who wrote it (the shard I/N and its tables), checked on restore; a server
//       holds SnapshotDirLock (DIR/LOCK, flock) so two servers never share a directory.
// Does not own: when snapshots are taken (the trainer's checkpoints through the client) or the tables.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "ration/ps/partition.h"
#include "ration/ps/store.h"

namespace ration::ps {

struct SnapshotInfo {
  std::string path;
  int64_t rows = 0;
  int64_t disabled = 0;  // disabled ids saved / restored
};

// Writes every table of `store` as version `version` under `dir` (created if needed), recording `shard`
// (when given) and the table names as the snapshot's identity.
SnapshotInfo write_snapshot(const EmbeddingStore& store, const std::string& dir, int64_t version, int keep = 3,
                            std::optional<ShardId> shard = std::nullopt);
// Replaces the contents of `store` with snapshot `version` from `dir`. A missing or malformed snapshot is
// an error naming the path and what is wrong; the store is untouched in that case. With `shard`, a
// snapshot written by another shard (index or count) is refused; tables the store has declared must be in
// the snapshot with the same dim and optimiser (a snapshot of another model is refused). A snapshot
// written before identities were recorded restores without the shard check.
SnapshotInfo read_snapshot(EmbeddingStore& store, const std::string& dir, int64_t version,
                           std::optional<ShardId> shard = std::nullopt);
// The version named by DIR/LATEST, or -1 when there is none.
int64_t latest_snapshot_version(const std::string& dir);

// Exclusive use of a snapshot directory by one server: DIR is created if needed (a file, or a directory
// that cannot be written, is an error naming `flag`), then DIR/LOCK is locked with flock (released when
// the holder dies) and holds the holder's pid and shard. A second holder is refused naming the first.
class SnapshotDirLock {
 public:
  SnapshotDirLock(const std::string& dir, ShardId shard, const std::string& flag);
  ~SnapshotDirLock();
  SnapshotDirLock(const SnapshotDirLock&) = delete;
  SnapshotDirLock& operator=(const SnapshotDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace ration::ps
