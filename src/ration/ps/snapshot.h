// snapshot.h — persistence of one shard's tables in RocksDB, written atomically.
// Owns: the snapshot layout — DIR/v<version>/ a RocksDB database (table specs, then every row: values,
//       optimiser state and RowInfo, then the disabled ids with their sighting counts) written under a temporary name and renamed when complete; DIR/LATEST
//       names the newest complete version (replaced by rename). Old versions beyond `keep` are removed.
// Does not own: when snapshots are taken (the trainer's checkpoints through the client) or the tables.
#pragma once
#include <cstdint>
#include <string>

#include "ration/ps/store.h"

namespace ration::ps {

struct SnapshotInfo {
  std::string path;
  int64_t rows = 0;
  int64_t disabled = 0;  // disabled ids saved / restored
};

// Writes every table of `store` as version `version` under `dir` (created if needed).
SnapshotInfo write_snapshot(const EmbeddingStore& store, const std::string& dir, int64_t version, int keep = 3);
// Replaces the contents of `store` with snapshot `version` from `dir`. A missing or malformed snapshot is
// an error naming the path and what is wrong; the store is untouched in that case.
SnapshotInfo read_snapshot(EmbeddingStore& store, const std::string& dir, int64_t version);
// The version named by DIR/LATEST, or -1 when there is none.
int64_t latest_snapshot_version(const std::string& dir);

}  // namespace ration::ps
