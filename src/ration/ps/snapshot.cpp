// snapshot.cpp — RocksDB snapshots of a shard (see snapshot.h).
// Keys: "spec/<table>" -> serialized wire::TableSpec; "row/<table>\0<id, 8 bytes big-endian>" -> values
// (dim floats), state (state floats), RowInfo fields; "disabled/<table>\0<id, 8 bytes big-endian>" -> the
// pushes a disabled id has seen since it was disabled (uint32), so a resumed shard neither resurrects an
// evicted id nor forgets how close it is to re-admission; "disabled_count" -> their number; "complete" ->
// row count (written last, checked on read). Values are native little-endian float32. A snapshot written
// before disabled ids were saved has neither key and restores with none disabled. "identity/shard" -> "I/N"
// of the writer and "identity/tables" -> its table names, '\n'-separated (checked on read; a snapshot
// written before them has neither and restores without the shard check).
#include "ration/ps/snapshot.h"

#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <rocksdb/db.h>
#include <sys/file.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "proto/ps.pb.h"
#include "ration/base/check.h"
#include "ration/base/paths.h"
#include "ration/ps/shard.h"

namespace ration::ps {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kExportRows = 65536;

std::string version_dir(const std::string& dir, int64_t version) {
  return (fs::path(dir) / ("v" + std::to_string(version))).string();
}

std::string id_key(const std::string& prefix, const std::string& table, uint64_t id) {
  std::string k = prefix + table;
  k.push_back('\0');
  for (int b = 7; b >= 0; --b) k.push_back(static_cast<char>((id >> (8 * b)) & 0xFF));
  return k;
}

std::string row_key(const std::string& table, uint64_t id) { return id_key("row/", table, id); }
std::string disabled_key(const std::string& table, uint64_t id) { return id_key("disabled/", table, id); }

// "<prefix><table>\0<8 bytes>" -> (table, id); false when malformed.
bool parse_id_key(const std::string& k, size_t prefix, std::string& table, uint64_t& id) {
  const size_t nul = k.find('\0', prefix);
  if (nul == std::string::npos || k.size() != nul + 9) return false;
  table = k.substr(prefix, nul - prefix);
  id = 0;
  for (size_t b = 0; b < 8; ++b) id = (id << 8) | static_cast<uint8_t>(k[nul + 1 + b]);
  return true;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void check_ok(const rocksdb::Status& s, const std::string& what, const std::string& path) {
  RATION_CHECK(s.ok(), "snapshot ", path, ": ", what, " failed: ", s.ToString());
}

// 24 bytes; first_step sits where an older layout had padding (the row's age for the eviction grace).
struct PackedInfo {
  uint32_t pushes;
  int32_t first_step;
  int64_t last_step;
  float score;
};

// A killed writer leaves its "vN.tmp-PID" behind (only a rename names a version): remove those of
// processes that no longer run (a live one may be writing right now).
void remove_dead_writers_leftovers(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t tag = name.find(".tmp-");
    if (name.empty() || name[0] != 'v' || tag == std::string::npos) continue;
    const std::string pid_text = name.substr(tag + 5);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stoll(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno == EPERM) continue;  // alive (or not ours to judge)
    fs::remove_all(e.path(), ec);
  }
}


// The writer's identity: its shard (when known) and its tables.
void put_identity(rocksdb::DB& db, const rocksdb::WriteOptions& wo, const EmbeddingStore& store,
                  const std::optional<ShardId>& shard, const std::string& tmp) {
  std::string tables;
  for (const std::string& name : store.table_names()) tables += (tables.empty() ? "" : "\n") + name;
  check_ok(db.Put(wo, "identity/tables", tables), "put identity", tmp);
  if (shard) check_ok(db.Put(wo, "identity/shard", shard->to_string()), "put identity", tmp);
}

// Refuses a snapshot another shard wrote, or one whose tables differ from what the store declared.
void check_identity(rocksdb::DB& db, const rocksdb::ReadOptions& ro, const EmbeddingStore& declared,
                    const EmbeddingStore& fresh, const std::optional<ShardId>& shard, const std::string& path) {
  std::string written;
  const rocksdb::Status s = db.Get(ro, "identity/shard", &written);
  RATION_CHECK(s.ok() || s.IsNotFound(), "snapshot ", path, ": read its identity failed: ", s.ToString());
  RATION_CHECK(!shard || !s.ok() || written == shard->to_string(), "snapshot ", path, " was written by shard ", written,
               ", but this is shard ", shard ? shard->to_string() : std::string(), ": each shard needs its own snapshot ",
               "directory (--snapshot-dir; two shards sharing one overwrite each other's rows), and a server restores only ",
               "snapshots of its own shard I/N (--shard)");
  std::string listed;
  const rocksdb::Status t = db.Get(ro, "identity/tables", &listed);
  RATION_CHECK(t.ok() || t.IsNotFound(), "snapshot ", path, ": read its identity failed: ", t.ToString());
  std::string have;
  for (const std::string& name : fresh.table_names()) have += (have.empty() ? "" : "\n") + name;
  RATION_CHECK(!t.ok() || listed == have, "snapshot ", path, " is damaged: its identity lists the tables [", listed,
               "] but it holds the specs of [", have, "]");
  for (const std::string& name : declared.table_names()) {
    const Table* want = declared.find(name);
    const Table* got = fresh.find(name);
    RATION_CHECK(got != nullptr, "snapshot ", path, " has no table '", name, "', which this shard's client declared ",
                 "(the snapshot holds [", have, "]): a snapshot of another model or run?");
    RATION_CHECK(got->dim() == want->dim() && got->options().optimizer.kind == want->options().optimizer.kind,
                 "snapshot ", path, ": table '", name, "' has dim ", got->dim(), " and optimiser ",
                 optimizer_kind_name(got->options().optimizer.kind), ", but the client declared dim ", want->dim(),
                 " and ", optimizer_kind_name(want->options().optimizer.kind), ": a snapshot of another model or run?");
  }
}

}  // namespace

SnapshotDirLock::SnapshotDirLock(const std::string& dir, ShardId shard, const std::string& flag) {
  check_path_length(dir, flag);
  RATION_CHECK(!fs::exists(dir) || fs::is_directory(dir), flag, " '", dir, "' is a file; expected a directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  RATION_CHECK(!ec, flag, " '", dir, "' cannot be created: ", ec.message());
  const std::string lock = (fs::path(dir) / "LOCK").string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  RATION_CHECK(fd_ >= 0, flag, " '", dir, "' cannot be written (", std::strerror(errno),
               "); snapshots need a writable directory");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[128] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("another process");
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    RATION_CHECK(false, flag, " '", dir, "' is in use by another server (", who, "): each shard needs its own ",
                 "snapshot directory, or two shards overwrite each other's rows");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + ", shard " + shard.to_string() + "\n";
  const bool wrote = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) == static_cast<ssize_t>(me.size());
  if (!wrote) {
    ::close(fd_);
    fd_ = -1;
  }
  RATION_CHECK(wrote, flag, " '", dir, "' cannot be written (", std::strerror(errno), "); snapshots need a writable directory");
}

SnapshotDirLock::~SnapshotDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

SnapshotInfo write_snapshot(const EmbeddingStore& store, const std::string& dir, int64_t version, int keep,
                            std::optional<ShardId> shard) {
  RATION_CHECK(version >= 0, "snapshot version must be >= 0; got ", version);
  std::error_code ec;
  check_path_length(dir, "snapshot directory");
  RATION_CHECK(!fs::exists(dir) || fs::is_directory(dir), "snapshot directory '", dir, "' is a file; expected a directory");
  fs::create_directories(dir, ec);
  RATION_CHECK(!ec, "snapshot directory '", dir, "' cannot be created: ", ec.message());
  const std::string final_path = version_dir(dir, version);
  const std::string tmp = final_path + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  remove_dead_writers_leftovers(dir);

  SnapshotInfo info{final_path, 0, 0};
  {
    rocksdb::Options opt;
    opt.create_if_missing = true;
    opt.error_if_exists = true;
    rocksdb::DB* raw = nullptr;
    check_ok(rocksdb::DB::Open(opt, tmp, &raw), "open", tmp);
    std::unique_ptr<rocksdb::DB> db(raw);
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;  // the database is flushed and renamed as a whole; a partial one is never named
    for (const std::string& name : store.table_names()) {
      const Table* t = store.find(name);
      check_ok(db->Put(wo, "spec/" + name, spec_from_table_options(t->options()).SerializeAsString()), "put spec", tmp);
      const int64_t dim = t->dim(), st = t->state_size();
      ExportCursor cursor;
      while (!cursor.done) {
        ExportedRows rows;
        t->export_batch(cursor, kExportRows, rows);
        rocksdb::WriteBatch batch;
        std::string value;
        for (int64_t i = 0; i < rows.size(); ++i) {
          value.assign(reinterpret_cast<const char*>(rows.values.data() + i * dim), static_cast<size_t>(dim) * 4);
          value.append(reinterpret_cast<const char*>(rows.state.data() + i * st), static_cast<size_t>(st) * 4);
          const RowInfo& ri = rows.infos[static_cast<size_t>(i)];
          PackedInfo p{ri.pushes, ri.first_step, ri.last_step, ri.score};
          value.append(reinterpret_cast<const char*>(&p), sizeof p);
          batch.Put(row_key(name, rows.ids[static_cast<size_t>(i)]), value);
        }
        check_ok(db->Write(wo, &batch), "write rows", tmp);
        info.rows += rows.size();
      }
      rocksdb::WriteBatch batch;
      for (const auto& [id, sightings] : t->disabled_entries()) {
        batch.Put(disabled_key(name, id),
                  rocksdb::Slice(reinterpret_cast<const char*>(&sightings), sizeof sightings));
        ++info.disabled;
      }
      check_ok(db->Write(wo, &batch), "write disabled ids", tmp);
    }
    put_identity(*db, wo, store, shard, tmp);
    check_ok(db->Put(wo, "disabled_count", std::to_string(info.disabled)), "put disabled count", tmp);
    check_ok(db->Put(wo, "complete", std::to_string(info.rows)), "put marker", tmp);
    check_ok(db->Flush(rocksdb::FlushOptions()), "flush", tmp);
    check_ok(db->Close(), "close", tmp);
  }
  fs::remove_all(final_path, ec);
  fs::rename(tmp, final_path, ec);
  RATION_CHECK(!ec, "snapshot ", tmp, ": rename to ", final_path, " failed: ", ec.message());
  fsync_path(dir);
  // LATEST names the newest complete version; replaced by rename so a reader sees the old or new name.
  const std::string latest_tmp = (fs::path(dir) / ("LATEST.tmp-" + std::to_string(::getpid()))).string();
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    out << version << "\n";
    out.flush();
    RATION_CHECK(out.good(), "snapshot directory '", dir, "': cannot write ", latest_tmp);
  }
  fsync_path(latest_tmp);
  fs::rename(latest_tmp, fs::path(dir) / "LATEST", ec);
  RATION_CHECK(!ec, "snapshot directory '", dir, "': cannot update LATEST: ", ec.message());
  fsync_path(dir);

  // Keep the newest `keep` versions (and never the one just written).
  std::vector<int64_t> versions;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 1 && n[0] == 'v' && n.find(".tmp") == std::string::npos &&
        std::all_of(n.begin() + 1, n.end(), ::isdigit))
      versions.push_back(std::stoll(n.substr(1)));
  }
  std::sort(versions.rbegin(), versions.rend());
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < versions.size(); ++i)
    if (versions[i] != version) fs::remove_all(version_dir(dir, versions[i]), ec);
  return info;
}

SnapshotInfo read_snapshot(EmbeddingStore& store, const std::string& dir, int64_t version,
                           std::optional<ShardId> shard) {
  const std::string path = version_dir(dir, version);
  RATION_CHECK(fs::is_directory(path), "snapshot ", path, " does not exist (versions are named v<step> under the ",
               "snapshot directory; LATEST names the newest)");
  rocksdb::Options opt;
  opt.paranoid_checks = true;
  rocksdb::DB* raw = nullptr;
  check_ok(rocksdb::DB::OpenForReadOnly(opt, path, &raw), "open", path);
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  std::string complete;
  check_ok(db->Get(ro, "complete", &complete), "read the completion marker (an incomplete snapshot?)", path);

  EmbeddingStore fresh;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (it->Seek("spec/"); it->Valid() && it->key().starts_with("spec/"); it->Next()) {
    wire::TableSpec spec;
    RATION_CHECK(spec.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())), "snapshot ", path,
                 ": table spec '", it->key().ToString(), "' is malformed");
    fresh.ensure_table(table_options_from_spec(spec));
  }
  check_ok(it->status(), "read specs", path);
  check_identity(*db, ro, store, fresh, shard, path);
  int64_t rows = 0;
  for (it->Seek("row/"); it->Valid() && it->key().starts_with("row/"); it->Next()) {
    const rocksdb::Slice key = it->key();
    std::string table;
    uint64_t id = 0;
    RATION_CHECK(parse_id_key(key.ToString(), 4, table, id), "snapshot ", path, ": malformed row key");
    Table* t = fresh.find(table);
    RATION_CHECK(t != nullptr, "snapshot ", path, ": row of table '", table, "' which has no spec");
    const int64_t dim = t->dim(), st = t->state_size();
    const size_t expect = static_cast<size_t>(dim + st) * 4 + sizeof(PackedInfo);
    RATION_CHECK(it->value().size() == expect, "snapshot ", path, ": row ", id, " of table '", table, "' has ",
                 it->value().size(), " bytes; expected ", expect, " (dim ", dim, ", ", st, " state floats)");
    std::vector<float> vals(static_cast<size_t>(dim + st));
    std::memcpy(vals.data(), it->value().data(), static_cast<size_t>(dim + st) * 4);
    PackedInfo p;
    std::memcpy(&p, it->value().data() + (dim + st) * 4, sizeof p);
    RowInfo ri;
    ri.id = id;
    ri.pushes = p.pushes;
    ri.last_step = static_cast<int32_t>(p.last_step);
    ri.first_step = p.first_step;
    ri.score = p.score;
    t->assign(&id, 1, vals.data(), vals.data() + dim, &ri);
    ++rows;
  }
  check_ok(it->status(), "read rows", path);
  RATION_CHECK(std::to_string(rows) == complete, "snapshot ", path, ": holds ", rows, " rows but its marker says ",
               complete);
  int64_t disabled = 0;
  for (it->Seek("disabled/"); it->Valid() && it->key().starts_with("disabled/"); it->Next()) {
    std::string table;
    uint64_t id = 0;
    RATION_CHECK(parse_id_key(it->key().ToString(), 9, table, id), "snapshot ", path, ": malformed disabled-id key");
    Table* t = fresh.find(table);
    RATION_CHECK(t != nullptr, "snapshot ", path, ": disabled id of table '", table, "' which has no spec");
    RATION_CHECK(it->value().size() == sizeof(uint32_t), "snapshot ", path, ": disabled id ", id, " of table '", table,
                 "' has ", it->value().size(), " bytes; expected 4 (its sighting count)");
    uint32_t sightings = 0;
    std::memcpy(&sightings, it->value().data(), sizeof sightings);
    t->restore_disabled(&id, &sightings, 1);
    ++disabled;
  }
  check_ok(it->status(), "read disabled ids", path);
  std::string disabled_count;
  const rocksdb::Status ds = db->Get(ro, "disabled_count", &disabled_count);
  RATION_CHECK(ds.ok() || ds.IsNotFound(), "snapshot ", path, ": read the disabled count failed: ", ds.ToString());
  RATION_CHECK(!ds.ok() || std::to_string(disabled) == disabled_count, "snapshot ", path, ": holds ", disabled,
               " disabled ids but its count says ", disabled_count);
  store.replace_tables(std::move(fresh));
  return {path, rows, disabled};
}

int64_t latest_snapshot_version(const std::string& dir) {
  RATION_CHECK(!fs::exists(dir) || fs::is_directory(dir), "snapshot directory '", dir, "' is a file; expected a directory");
  std::ifstream in(fs::path(dir) / "LATEST");
  if (!in) {
    // No LATEST but versions on disk: starting empty would let the next snapshot overwrite them with an
    // empty table. Which of them is complete only LATEST says, so refuse rather than guess.
    std::vector<std::string> versions;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_directory() && name.size() > 1 && name[0] == 'v' &&
          name.find_first_not_of("0123456789", 1) == std::string::npos)
        versions.push_back(name);
    }
    std::sort(versions.begin(), versions.end(),
              [](const std::string& a, const std::string& b) { return std::stoll(a.substr(1)) < std::stoll(b.substr(1)); });
    std::string list;
    for (const std::string& v : versions) list += (list.empty() ? "" : ", ") + v;
    RATION_CHECK(versions.empty(), "snapshot directory '", dir, "' holds ", list, " but no LATEST file (it names the newest ",
                 "complete version): to restore one, write its number into LATEST (e.g. echo ",
                 versions.back().substr(1), " > ", (fs::path(dir) / "LATEST").string(),
                 "); to start empty, use an empty directory");
    return -1;
  }
  int64_t v = -1;
  in >> v;
  RATION_CHECK(!in.fail() && v >= 0, "snapshot directory '", dir, "': LATEST is malformed (expected a version number)");
  return v;
}

}  // namespace ration::ps
