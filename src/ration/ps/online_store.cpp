// online_store.cpp — mirrors, atomic delta application, RocksDB state, sync (see online_store.h).
#include "ration/ps/online_store.h"

#include <absl/container/flat_hash_map.h>
#include <grpcpp/grpcpp.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "proto/ps.grpc.pb.h"
#include "ration/base/check.h"
#include "ration/base/net.h"
#include "ration/ps/partition.h"
#include "ration/ps/server.h"

namespace ration::ps {

// ---- sources ----------------------------------------------------------------------------------------
namespace {

class EmbeddedSource final : public DeltaSource {
 public:
  explicit EmbeddedSource(ShardCore& core) : core_(core) {}
  std::string endpoint() const override { return "embedded"; }
  grpc::Status list_tables(const wire::ListTablesRequest& q, wire::ListTablesResponse* r) override {
    return core_.list_tables(q, r);
  }
  grpc::Status get_delta(const wire::DeltaRequest& q, wire::DeltaResponse* r) override { return core_.get_delta(q, r); }

 private:
  ShardCore& core_;
};

class RemoteSource final : public DeltaSource {
 public:
  RemoteSource(std::string endpoint, const FollowSecurity& security, int64_t max_message_bytes)
      : endpoint_(std::move(endpoint)), token_(security.token) {
    check_follow_security(endpoint_, security);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
    args.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!security.tls_ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = read_pem(security.tls_ca, "--follow-tls-ca");
      if (!security.tls_cert.empty()) {
        ssl.pem_cert_chain = read_pem(security.tls_cert, "--follow-tls-cert");
        ssl.pem_private_key = read_pem(security.tls_key, "--follow-tls-key");
      }
      creds = grpc::SslCredentials(ssl);
      if (!security.tls_target_name.empty()) args.SetSslTargetNameOverride(security.tls_target_name);
    }
    stub_ = wire::ParameterServer::NewStub(grpc::CreateCustomChannel(endpoint_, creds, args));
  }
  std::string endpoint() const override { return endpoint_; }
  grpc::Status list_tables(const wire::ListTablesRequest& q, wire::ListTablesResponse* r) override {
    grpc::ClientContext c;
    prepare(c);
    return stub_->ListTables(&c, q, r);
  }
  grpc::Status get_delta(const wire::DeltaRequest& q, wire::DeltaResponse* r) override {
    grpc::ClientContext c;
    prepare(c);
    return stub_->GetDelta(&c, q, r);
  }

 private:
  static std::string read_pem(const std::string& path, const char* flag) {
    std::ifstream in(path, std::ios::binary);
    RATION_CHECK(in.good(), flag, " '", path, "' cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void prepare(grpc::ClientContext& c) const {
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!token_.empty()) c.AddMetadata("authorization", "Bearer " + token_);
  }
  std::string endpoint_, token_;
  std::unique_ptr<wire::ParameterServer::Stub> stub_;
};

}  // namespace

void check_follow_security(const std::string& endpoint, const FollowSecurity& o) {
  std::string host;
  int port = 0;
  split_host_port(endpoint, "--follow", &host, &port);
  RATION_CHECK(o.tls_cert.empty() == o.tls_key.empty(), "--follow-tls-cert and --follow-tls-key must be given together");
  RATION_CHECK(o.tls_cert.empty() || !o.tls_ca.empty(), "--follow-tls-cert / --follow-tls-key (this follower's client ",
               "certificate) need --follow-tls-ca (the CA that verifies the training shards): without it the follower ",
               "would connect in plaintext");
  RATION_CHECK(o.token.empty() || !o.tls_ca.empty() || is_loopback_host(host), "--follow ", endpoint,
               " is not a loopback address and --follow-tls-ca is not given, so the token (--auth-token-file) would ",
               "travel in clear; give --follow-tls-ca CA (the CA that signed the training shards' certificates)");
}

std::unique_ptr<DeltaSource> embedded_delta_source(ShardCore& core) { return std::make_unique<EmbeddedSource>(core); }
std::unique_ptr<DeltaSource> remote_delta_source(const std::string& endpoint, const FollowSecurity& security,
                                                 int64_t max_message_bytes) {
  return std::make_unique<RemoteSource>(endpoint, security, max_message_bytes);
}

// ---- mirrors ----------------------------------------------------------------------------------------
struct OnlineStore::Mirror {
  std::unique_ptr<Table> table;  // values only (sgd: no state)
  int64_t version = -1;
  int64_t source_version = 0;
  uint64_t epoch = 0;
};

namespace {

TableOptions mirror_options(TableOptions o) {
  o.optimizer = OptimizerOptions{};
  o.optimizer.kind = OptimizerKind::Sgd;
  return o;
}

std::unique_ptr<Table> new_mirror_table(const TableOptions& o) {
  auto t = std::make_unique<Table>(mirror_options(o));
  t->set_tombstone_limit(0);
  return t;
}

// RocksDB keys: "s/" spec, "v/" version, "r/" row, "d/" disabled; then source (4 bytes BE), table, NUL,
// and for rows/disabled the id (8 bytes BE).
std::string mirror_prefix(char kind, int source, const std::string& table) {
  std::string k(1, kind);
  k += '/';
  for (int b = 3; b >= 0; --b) k.push_back(static_cast<char>((static_cast<uint32_t>(source) >> (8 * b)) & 0xff));
  k += table;
  k.push_back('\0');
  return k;
}
std::string id_key(char kind, int source, const std::string& table, uint64_t id) {
  std::string k = mirror_prefix(kind, source, table);
  for (int b = 7; b >= 0; --b) k.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
  return k;
}
void check_ok(const rocksdb::Status& s, const char* what, const std::string& dir) {
  RATION_CHECK(s.ok(), "online state ", dir, ": ", what, " failed: ", s.ToString());
}

// Which rows and tombstones of a delta take effect: per id the higher version wins.
struct Effective {
  std::vector<size_t> rows;
  std::vector<size_t> tombs;
};
Effective effective(const Delta& d) {
  absl::flat_hash_map<uint64_t, int64_t> tomb_version;
  for (size_t i = 0; i < d.tombstones.size(); ++i) tomb_version[d.tombstones[i]] = d.tombstone_versions[i];
  absl::flat_hash_map<uint64_t, int64_t> row_version;
  Effective e;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    auto t = tomb_version.find(d.ids[i]);
    if (t != tomb_version.end() && t->second > d.versions[i]) continue;
    row_version[d.ids[i]] = d.versions[i];
    e.rows.push_back(i);
  }
  for (size_t i = 0; i < d.tombstones.size(); ++i) {
    auto r = row_version.find(d.tombstones[i]);
    if (r != row_version.end() && r->second >= d.tombstone_versions[i]) continue;
    e.tombs.push_back(i);
  }
  return e;
}

}  // namespace

OnlineStore::OnlineStore(int num_sources, std::string state_dir) : num_sources_(num_sources), state_dir_(std::move(state_dir)) {
  RATION_CHECK(num_sources_ >= 1, "online parameter server: needs at least one training shard to follow");
  if (state_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(state_dir_, ec);
  RATION_CHECK(!ec, "--state-dir '", state_dir_, "' cannot be created: ", ec.message());
  rocksdb::Options o;
  o.create_if_missing = true;
  rocksdb::DB* db = nullptr;
  check_ok(rocksdb::DB::Open(o, state_dir_ + "/online.db", &db), "open", state_dir_);
  db_.reset(db);
  load_state();
}

OnlineStore::~OnlineStore() {
  if (db_) db_->Close();
}

void OnlineStore::load_state() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  auto parse = [&](const std::string& k, int* source, std::string* table, uint64_t* id) {
    uint32_t s = 0;
    for (int b = 0; b < 4; ++b) s = (s << 8) | static_cast<uint8_t>(k[2 + b]);
    *source = static_cast<int>(s);
    const size_t nul = k.find('\0', 6);
    RATION_CHECK(nul != std::string::npos, "online state ", state_dir_, ": malformed key");
    *table = k.substr(6, nul - 6);
    if (id != nullptr) {
      RATION_CHECK(k.size() == nul + 9, "online state ", state_dir_, ": malformed row key");
      *id = 0;
      for (size_t b = 0; b < 8; ++b) *id = (*id << 8) | static_cast<uint8_t>(k[nul + 1 + b]);
    }
  };
  // Specs first ("s/" sorts after "r/" and "d/", so walk by prefix).
  for (it->Seek("s/"); it->Valid() && it->key().starts_with("s/"); it->Next()) {
    int source;
    std::string table;
    parse(it->key().ToString(), &source, &table, nullptr);
    wire::TableSpec spec;
    RATION_CHECK(spec.ParseFromString(it->value().ToString()), "online state ", state_dir_, ": bad spec of '", table, "'");
    auto m = std::make_unique<Mirror>();
    m->table = new_mirror_table(table_options_from_spec(spec));
    std::string v;
    check_ok(db_->Get(rocksdb::ReadOptions(), mirror_prefix('v', source, table), &v), "read version", state_dir_);
    std::istringstream in(v);
    in >> m->epoch >> m->version;
    mirrors_[{source, table}] = std::move(m);
  }
  for (it->Seek("r/"); it->Valid() && it->key().starts_with("r/"); it->Next()) {
    int source;
    std::string table;
    uint64_t id;
    parse(it->key().ToString(), &source, &table, &id);
    Mirror* m = find(source, table);
    RATION_CHECK(m != nullptr, "online state ", state_dir_, ": row of table '", table, "' without a spec");
    const int64_t dim = m->table->dim();
    RATION_CHECK(static_cast<int64_t>(it->value().size()) == dim * 4 + 8, "online state ", state_dir_,
                 ": row of '", table, "' has ", it->value().size(), " bytes; expected ", dim * 4 + 8);
    std::vector<float> vals(static_cast<size_t>(dim));
    std::memcpy(vals.data(), it->value().data(), static_cast<size_t>(dim) * 4);
    RowInfo ri;
    ri.id = id;
    std::memcpy(&ri.version, it->value().data() + dim * 4, 8);
    m->table->assign(&id, 1, vals.data(), nullptr, &ri);
  }
  for (it->Seek("d/"); it->Valid() && it->key().starts_with("d/"); it->Next()) {
    int source;
    std::string table;
    uint64_t id;
    parse(it->key().ToString(), &source, &table, &id);
    if (Mirror* m = find(source, table)) m->table->disable(&id, 1);
  }
  check_ok(it->status(), "read", state_dir_);
}

OnlineStore::Mirror* OnlineStore::find(int source, const std::string& table) const {
  auto it = mirrors_.find({source, table});
  return it == mirrors_.end() ? nullptr : it->second.get();
}

void OnlineStore::persist(const Delta& d, const Mirror* before) {
  if (!db_) return;
  rocksdb::WriteBatch batch;
  const int64_t dim = d.options.dim;
  if (d.full || before == nullptr) {
    for (char kind : {'r', 'd'}) {
      std::string lo = mirror_prefix(kind, d.source, d.table), hi = lo;
      hi.back() = '\x01';  // every key of this mirror is prefix + id, and prefix ends in NUL
      batch.DeleteRange(lo, hi);
    }
  }
  const Effective e = effective(d);
  std::string value;
  for (size_t i : e.rows) {
    value.assign(reinterpret_cast<const char*>(d.values.data() + static_cast<int64_t>(i) * dim), static_cast<size_t>(dim) * 4);
    value.append(reinterpret_cast<const char*>(&d.versions[i]), 8);
    batch.Put(id_key('r', d.source, d.table, d.ids[i]), value);
    batch.Delete(id_key('d', d.source, d.table, d.ids[i]));
  }
  for (size_t i : e.tombs) {
    batch.Delete(id_key('r', d.source, d.table, d.tombstones[i]));
    batch.Put(id_key('d', d.source, d.table, d.tombstones[i]), "");
  }
  batch.Put(mirror_prefix('s', d.source, d.table), spec_from_table_options(d.options).SerializeAsString());
  batch.Put(mirror_prefix('v', d.source, d.table), std::to_string(d.epoch) + " " + std::to_string(d.to_version));
  // One batch: after a crash the state is wholly before or wholly after this delta (WAL replay).
  check_ok(db_->Write(rocksdb::WriteOptions(), &batch), "write delta", state_dir_);
}

ApplyResult OnlineStore::apply(const Delta& d) {
  RATION_CHECK(d.source >= 0 && d.source < num_sources_, "online parameter server: delta from source ", d.source,
               " but it follows ", num_sources_);
  RATION_CHECK(d.ids.size() == d.versions.size() && d.values.size() == d.ids.size() * static_cast<size_t>(d.options.dim) &&
                   d.tombstones.size() == d.tombstone_versions.size(),
               "online parameter server: malformed delta of table '", d.table, "'");
  // Checked under the write lock below as well; checked here first to refuse before any work.
  {
    std::shared_lock<std::shared_mutex> read(mu_);
    const Mirror* m = find(d.source, d.table);
    if (!d.full) {
      if (m == nullptr || m->version != d.from_version) {
        ++gaps_;
        return ApplyResult::Gap;
      }
      if (m->epoch != d.epoch) {
        ++gaps_;
        return ApplyResult::EpochChanged;
      }
    }
  }
  if (apply_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(apply_delay_ms_.load()));
  const Effective e = effective(d);
  const int64_t dim = d.options.dim;
  auto write_rows = [&](Table& t) {
    std::vector<uint64_t> ids;
    std::vector<float> vals;
    std::vector<RowInfo> infos;
    for (size_t i : e.rows) {
      ids.push_back(d.ids[i]);
      vals.insert(vals.end(), d.values.begin() + static_cast<int64_t>(i) * dim, d.values.begin() + static_cast<int64_t>(i + 1) * dim);
      RowInfo ri;
      ri.id = d.ids[i];
      ri.version = d.versions[i];
      infos.push_back(ri);
    }
    t.assign(ids.data(), static_cast<int64_t>(ids.size()), vals.data(), nullptr, infos.data());
    std::vector<uint64_t> tombs;
    for (size_t i : e.tombs) tombs.push_back(d.tombstones[i]);
    t.disable(tombs.data(), static_cast<int64_t>(tombs.size()));
  };
  std::unique_ptr<Table> fresh;
  if (d.full) {
    // Built aside; swapped in whole.
    fresh = new_mirror_table(d.options);
    write_rows(*fresh);
  }
  std::unique_lock<std::shared_mutex> write(mu_);
  Mirror* m = find(d.source, d.table);
  if (!d.full && (m == nullptr || m->version != d.from_version || m->epoch != d.epoch)) {
    ++gaps_;
    return ApplyResult::Gap;
  }
  persist(d, m);
  if (m == nullptr) {
    auto owned = std::make_unique<Mirror>();
    m = owned.get();
    mirrors_[{d.source, d.table}] = std::move(owned);
  }
  if (d.full) {
    std::swap(m->table, fresh);  // the old table is freed below, outside the lock
  } else {
    write_rows(*m->table);
  }
  // A new epoch (the training shard restarted) starts its versions afresh: the old epoch's maximum is
  // not this source's version any more.
  const bool new_epoch = m->epoch != d.epoch;
  m->version = d.to_version;
  m->epoch = d.epoch;
  m->source_version = new_epoch ? d.to_version : std::max(m->source_version, d.to_version);
  delta_rows_ += static_cast<int64_t>(e.rows.size());
  tombstones_ += static_cast<int64_t>(e.tombs.size());
  write.unlock();
  fresh.reset();
  return ApplyResult::Applied;
}

bool OnlineStore::lookup(const std::string& table, const uint64_t* ids, int64_t n, float* out) {
  std::shared_lock<std::shared_mutex> read(mu_);
  ++lookups_;
  // Ids are split over the training shards by the stable hash; each reads from its source's mirror.
  std::vector<Mirror*> by_source(static_cast<size_t>(num_sources_), nullptr);
  bool any = false;
  for (int s = 0; s < num_sources_; ++s) {
    by_source[static_cast<size_t>(s)] = find(s, table);
    any = any || by_source[static_cast<size_t>(s)] != nullptr;
  }
  if (!any) return false;
  const int64_t d = dim_unlocked(table);
  if (num_sources_ == 1) {
    by_source[0]->table->pull(ids, n, out, MissingRow::ReadDefault);
    return true;
  }
  for (int64_t i = 0; i < n; ++i) {
    Mirror* m = by_source[static_cast<size_t>(shard_of(ids[i], static_cast<uint32_t>(num_sources_)))];
    if (m == nullptr) {
      std::memset(out + i * d, 0, static_cast<size_t>(d) * 4);
      continue;
    }
    m->table->pull(ids + i, 1, out + i * d, MissingRow::ReadDefault);
  }
  return true;
}

int64_t OnlineStore::dim(const std::string& table) const {
  std::shared_lock<std::shared_mutex> read(mu_);
  return dim_unlocked(table);
}

int64_t OnlineStore::dim_unlocked(const std::string& table) const {
  for (const auto& [key, m] : mirrors_)
    if (key.second == table) return m->table->dim();
  return -1;
}

std::vector<MirrorInfo> OnlineStore::mirrors() const {
  std::shared_lock<std::shared_mutex> read(mu_);
  std::vector<MirrorInfo> out;
  for (const auto& [key, m] : mirrors_) {
    MirrorInfo i;
    i.source = key.first;
    i.table = key.second;
    i.version = m->version;
    i.source_version = m->source_version;
    i.epoch = m->epoch;
    const TableBytes b = m->table->bytes();
    i.rows = b.rows;
    i.disabled = b.disabled;
    i.bytes = b.total();
    out.push_back(i);
  }
  return out;
}

int64_t OnlineStore::version(int source, const std::string& table) const {
  std::shared_lock<std::shared_mutex> read(mu_);
  const Mirror* m = find(source, table);
  return m == nullptr ? -1 : m->version;
}

uint64_t OnlineStore::epoch(int source, const std::string& table) const {
  std::shared_lock<std::shared_mutex> read(mu_);
  const Mirror* m = find(source, table);
  return m == nullptr ? 0 : m->epoch;
}

OnlineCounters OnlineStore::counters() const {
  OnlineCounters c;
  c.syncs = syncs_;
  c.full_resyncs = full_resyncs_;
  c.delta_rows = delta_rows_;
  c.tombstones = tombstones_;
  c.gaps = gaps_;
  c.lookups = lookups_;
  return c;
}

// ---- sync -------------------------------------------------------------------------------------------
Delta fetch_delta(DeltaSource& source, int source_index, const std::string& table, int64_t from_version,
                  int64_t max_rows, bool* need_full) {
  Delta d;
  d.source = source_index;
  d.table = table;
  d.from_version = from_version;
  d.full = from_version < 0;
  *need_full = false;
  wire::DeltaRequest q;
  q.set_table(table);
  q.set_from_version(from_version);
  q.set_max_rows(max_rows);
  for (bool first = true;; first = false) {
    wire::DeltaResponse r;
    const grpc::Status s = source.get_delta(q, &r);
    RATION_CHECK(s.ok(), "online parameter server: GetDelta of table '", table, "' from ", source.endpoint(),
                 " failed: ", s.error_message());
    if (r.need_full()) {
      *need_full = true;
      return d;
    }
    if (first) {
      d.options = table_options_from_spec(r.spec());
      d.epoch = r.epoch();
      d.to_version = r.to_version();
      q.set_to_version(r.to_version());
    }
    const int64_t dim = d.options.dim;
    RATION_CHECK(static_cast<int64_t>(r.values().size()) == r.ids_size() * dim * 4 && r.versions_size() == r.ids_size(),
                 "online parameter server: malformed GetDelta answer from ", source.endpoint());
    d.ids.insert(d.ids.end(), r.ids().begin(), r.ids().end());
    d.versions.insert(d.versions.end(), r.versions().begin(), r.versions().end());
    const size_t old = d.values.size();
    d.values.resize(old + static_cast<size_t>(r.ids_size() * dim));
    std::memcpy(d.values.data() + old, r.values().data(), r.values().size());
    d.tombstones.insert(d.tombstones.end(), r.tombstone_ids().begin(), r.tombstone_ids().end());
    d.tombstone_versions.insert(d.tombstone_versions.end(), r.tombstone_versions().begin(), r.tombstone_versions().end());
    if (r.done()) break;
    q.set_cursor_stripe(r.cursor_stripe());
    q.set_cursor_slot(r.cursor_slot());
  }
  return d;
}

SyncReport sync_source(OnlineStore& store, int source_index, DeltaSource& source, int64_t max_rows) {
  SyncReport rep;
  wire::ListTablesResponse tables;
  const grpc::Status s = source.list_tables(wire::ListTablesRequest(), &tables);
  RATION_CHECK(s.ok(), "online parameter server: ListTables from ", source.endpoint(), " failed: ", s.error_message());
  for (const wire::TableSpec& spec : tables.tables()) {
    const std::string& name = spec.name();
    int64_t from = store.version(source_index, name);
    bool need_full = false;
    Delta d = fetch_delta(source, source_index, name, from, max_rows, &need_full);
    ApplyResult result = ApplyResult::Gap;
    if (!need_full && from >= 0 && d.epoch != store.epoch(source_index, name)) need_full = true;
    if (!need_full) result = store.apply(d);
    if (from < 0 && result == ApplyResult::Applied) rep.full = true;  // a first copy is a full one
    if (need_full || result != ApplyResult::Applied) {
      rep.gap = rep.gap || result != ApplyResult::Applied;
      d = fetch_delta(source, source_index, name, -1, max_rows, &need_full);
      RATION_CHECK(!need_full, "online parameter server: ", source.endpoint(), " refused a full copy of '", name, "'");
      RATION_CHECK(store.apply(d) == ApplyResult::Applied, "online parameter server: full copy of '", name, "' from ",
                   source.endpoint(), " was not applied");
      rep.full = true;
    }
    rep.rows += static_cast<int64_t>(d.ids.size());
    rep.tombstones += static_cast<int64_t>(d.tombstones.size());
    rep.bytes += static_cast<int64_t>(d.values.size() * 4 + d.ids.size() * 16 + d.tombstones.size() * 16);
  }
  store.count_sync(rep.full);
  return rep;
}

}  // namespace ration::ps
