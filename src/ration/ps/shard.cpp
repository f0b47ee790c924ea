// shard.cpp — ShardCore: validation, the store, counters, snapshots (see shard.h).
#include "ration/ps/shard.h"

#include <cmath>
#include <cstring>
#include <random>

#include "ration/base/check.h"
#include "ration/ps/snapshot.h"

namespace ration::ps {

ShardId parse_shard(const std::string& text, const std::string& where) {
  const size_t slash = text.find('/');
  ShardId s;
  bool ok = slash != std::string::npos && slash > 0 && slash + 1 < text.size();
  if (ok) {
    try {
      size_t a = 0, b = 0;
      const long long i = std::stoll(text.substr(0, slash), &a);
      const long long n = std::stoll(text.substr(slash + 1), &b);
      ok = a == slash && b == text.size() - slash - 1 && n >= 1 && n <= 4096 && i >= 0 && i < n;
      s.index = static_cast<uint32_t>(i);
      s.count = static_cast<uint32_t>(n);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  RATION_CHECK(ok, where, ": expected I/N with 0 <= I < N <= 4096 (e.g. 0/2); got '", text, "'");
  return s;
}

TableOptions table_options_from_spec(const wire::TableSpec& spec) {
  TableOptions o;
  o.name = spec.name();
  o.dim = spec.dim();
  o.seed = spec.seed();
  o.init_scale = spec.init_scale();
  o.optimizer.kind = optimizer_kind_from_name(spec.optimizer(), "table '" + spec.name() + "'");
  o.optimizer.lr = spec.lr();
  o.optimizer.beta1 = spec.beta1();
  o.optimizer.beta2 = spec.beta2();
  o.optimizer.eps = spec.eps();
  o.optimizer.initial_accumulator = spec.initial_accumulator();
  o.optimizer.ftrl_alpha = spec.ftrl_alpha();
  o.optimizer.ftrl_beta = spec.ftrl_beta();
  o.optimizer.ftrl_l1 = spec.ftrl_l1();
  o.optimizer.ftrl_l2 = spec.ftrl_l2();
  return o;
}

wire::TableSpec spec_from_table_options(const TableOptions& o) {
  wire::TableSpec s;
  s.set_name(o.name);
  s.set_dim(o.dim);
  s.set_seed(o.seed);
  s.set_init_scale(o.init_scale);
  s.set_optimizer(optimizer_kind_name(o.optimizer.kind));
  s.set_lr(o.optimizer.lr);
  s.set_beta1(o.optimizer.beta1);
  s.set_beta2(o.optimizer.beta2);
  s.set_eps(o.optimizer.eps);
  s.set_initial_accumulator(o.optimizer.initial_accumulator);
  s.set_ftrl_alpha(o.optimizer.ftrl_alpha);
  s.set_ftrl_beta(o.optimizer.ftrl_beta);
  s.set_ftrl_l1(o.optimizer.ftrl_l1);
  s.set_ftrl_l2(o.optimizer.ftrl_l2);
  return s;
}

ShardCore::ShardCore(ShardId shard, std::string snapshot_dir, ShardLimits limits)
    : shard_(shard), snapshot_dir_(std::move(snapshot_dir)), limits_(limits) {
  std::random_device rd;
  while (incarnation_ == 0) incarnation_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  if (snapshot_dir_.empty()) snapshot_problem_ = "it was started without --snapshot-dir";
}

bool ShardCore::admit(Table& t, const uint64_t* ids, int64_t n, bool push, int64_t step) {
  int64_t absent = 0;
  const int64_t need = t.admission_bytes(ids, n, push, &absent);
  if (absent == 0 || evictor_->make_room(need, step)) return true;
  refused_rows_ += absent;
  return false;
}

void ShardCore::note_held(int64_t step) {
  const int64_t held = store_.stats().bytes;
  // admission_bytes is an upper bound, so this does not happen; should it, the cap is restored at once
  // (and the peak shows it).
  int64_t peak = peak_bytes_.load();
  while (held > peak && !peak_bytes_.compare_exchange_weak(peak, held)) {
  }
  if (held > evictor_->max_bytes()) evictor_->make_room(0, step);
}

void ShardCore::push_existing(Table& t, const wire::PushRequest& req, const float* grads) {
  const int64_t dim = t.dim();
  std::vector<uint64_t> ids;
  std::vector<float> kept;
  for (int i = 0; i < req.ids_size(); ++i) {
    if (!t.contains(req.ids(i))) continue;
    ids.push_back(req.ids(i));
    kept.insert(kept.end(), grads + i * dim, grads + (i + 1) * dim);
  }
  t.push(ids.data(), static_cast<int64_t>(ids.size()), kept.data(), req.step());
}

grpc::Status ShardCore::reject(grpc::StatusCode code, const std::string& message) {
  ++rejected_;
  return grpc::Status(code, "shard " + shard_.to_string() + ": " + message);
}

grpc::Status ShardCore::check_ids(const char* rpc, const std::string& table, int64_t n, Table** out) {
  *out = store_.find(table);
  if (*out == nullptr) {
    std::string known;
    for (const auto& name : store_.table_names()) known += (known.empty() ? "" : ", ") + name;
    return reject(grpc::StatusCode::NOT_FOUND, std::string(rpc) + ": unknown table '" + table + "' (declared: " +
                                                   (known.empty() ? std::string("none") : known) + ")");
  }
  if (n > limits_.max_ids)
    return reject(grpc::StatusCode::INVALID_ARGUMENT, std::string(rpc) + " of " + std::to_string(n) +
                                                          " ids to table '" + table + "' exceeds the limit of " +
                                                          std::to_string(limits_.max_ids) +
                                                          " ids per request (this server's --max-ids); set "
                                                          "ps.max_ids_per_request <= " +
                                                          std::to_string(limits_.max_ids) + " on the trainer");
  return grpc::Status::OK;
}

grpc::Status ShardCore::declare_tables(const wire::DeclareTablesRequest& req, wire::DeclareTablesResponse*) {
  for (const auto& spec : req.tables()) {
    if (spec.name().empty() || spec.dim() <= 0 || spec.dim() > 65536)
      return reject(grpc::StatusCode::INVALID_ARGUMENT, "DeclareTables: table '" + spec.name() +
                                                            "' needs a name and dim in [1, 65536]; got dim " +
                                                            std::to_string(spec.dim()));
    try {
      Table& t = store_.ensure_table(table_options_from_spec(spec));
      if (evictor_) evictor_->apply(t);
    } catch (const Error& e) {
      return reject(grpc::StatusCode::FAILED_PRECONDITION, std::string("DeclareTables: ") + e.what());
    }
  }
  return grpc::Status::OK;
}

grpc::Status ShardCore::pull(const wire::PullRequest& req, wire::PullResponse* resp) {
  std::shared_lock<std::shared_mutex> tables(tables_mu_);
  Table* t = nullptr;
  const int64_t n = req.ids_size();
  if (grpc::Status s = check_ids("Pull", req.table(), n, &t); !s.ok()) return s;
  const int64_t dim = t->dim();
  if (n * dim * 4 > limits_.max_message_bytes)
    return reject(grpc::StatusCode::INVALID_ARGUMENT, "Pull of " + std::to_string(n) + " rows of dim " +
                                                          std::to_string(dim) + " exceeds the message limit of " +
                                                          std::to_string(limits_.max_message_bytes) + " bytes");
  for (uint64_t id : req.ids())
    if (shard_of(id, shard_.count) != shard_.index)
      return reject(grpc::StatusCode::INVALID_ARGUMENT,
                    "Pull: id " + std::to_string(id) + " belongs to shard " +
                        std::to_string(shard_of(id, shard_.count)) + "/" + std::to_string(shard_.count) +
                        " (are the client's endpoints in shard order?)");
  std::string* values = resp->mutable_values();
  values->resize(static_cast<size_t>(n * dim) * sizeof(float));
  const uint64_t* ids = reinterpret_cast<const uint64_t*>(req.ids().data());
  MissingRow missing = req.read_only() ? MissingRow::ReadDefault : MissingRow::Create;
  std::unique_lock<std::mutex> admission(admission_mu_, std::defer_lock);
  if (missing == MissingRow::Create && evictor_ && evictor_->capped()) {
    // The byte cap holds at every moment: room is made before rows are created; rows that cannot fit
    // are not created (they read their initial value, as an evaluation pull does).
    admission.lock();
    if (!admit(*t, ids, n, false, last_step_.load())) missing = MissingRow::ReadDefault;
  }
  t->pull(ids, n, reinterpret_cast<float*>(values->data()), missing);
  if (admission.owns_lock()) note_held(last_step_.load());
  resp->set_dim(dim);
  ++pulls_;
  return grpc::Status::OK;
}

grpc::Status ShardCore::push(const wire::PushRequest& req, wire::PushResponse* resp) {
  std::shared_lock<std::shared_mutex> tables(tables_mu_);
  Table* t = nullptr;
  const int64_t n = req.ids_size();
  if (grpc::Status s = check_ids("Push", req.table(), n, &t); !s.ok()) return s;
  const int64_t dim = t->dim();
  if (static_cast<int64_t>(req.grads().size()) != n * dim * 4)
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "Push to table '" + req.table() + "': " + std::to_string(n) + " ids of dim " + std::to_string(dim) +
                      " need " + std::to_string(n * dim * 4) + " gradient bytes; got " +
                      std::to_string(req.grads().size()) + " (dims differ?)");
  for (uint64_t id : req.ids())
    if (shard_of(id, shard_.count) != shard_.index)
      return reject(grpc::StatusCode::INVALID_ARGUMENT, "Push: id " + std::to_string(id) + " belongs to shard " +
                                                            std::to_string(shard_of(id, shard_.count)) + "/" +
                                                            std::to_string(shard_.count));
  // grads() is a std::string: copy into aligned floats only if it is misaligned.
  const char* bytes = req.grads().data();
  std::vector<float> aligned;
  const float* grads = reinterpret_cast<const float*>(bytes);
  if (reinterpret_cast<uintptr_t>(bytes) % alignof(float) != 0) {
    aligned.resize(static_cast<size_t>(n * dim));
    std::memcpy(aligned.data(), bytes, aligned.size() * 4);
    grads = aligned.data();
  }
  // A non-finite gradient would poison the row's value and optimiser state for good: refuse the push
  // whole, naming the first id that carries one (the trainer's loss check names the step).
  for (int64_t k = 0; k < n * dim; ++k)
    if (!std::isfinite(grads[k]))
      return reject(grpc::StatusCode::INVALID_ARGUMENT,
                    "Push to table '" + req.table() + "': the gradient of id " + std::to_string(req.ids(static_cast<int>(k / dim))) +
                        " holds " + std::to_string(grads[k]) + " (element " + std::to_string(k % dim) +
                        "); non-finite gradients are refused and nothing of this push was applied");
  const uint64_t* ids = reinterpret_cast<const uint64_t*>(req.ids().data());
  int64_t seen = last_step_.load();
  while (req.step() > seen && !last_step_.compare_exchange_weak(seen, req.step())) {
  }
  if (evictor_ && evictor_->capped()) {
    std::lock_guard<std::mutex> admission(admission_mu_);
    if (admit(*t, ids, n, true, req.step()))
      t->push(ids, n, grads, req.step());
    else
      push_existing(*t, req, grads);
    note_held(req.step());
  } else {
    t->push(ids, n, grads, req.step());
  }
  resp->set_rows(n);
  ++pushes_;
  if (evictor_) evictor_->maybe_run(req.step());
  return grpc::Status::OK;
}

grpc::Status ShardCore::stats(const wire::StatsRequest&, wire::StatsResponse* resp) {
  const StoreStats s = store_.stats();
  resp->set_shard(shard_.index);
  resp->set_num_shards(shard_.count);
  resp->set_rows(s.rows);
  resp->set_bytes(s.bytes);
  for (const auto& [name, b] : s.tables) {
    wire::TableStats* t = resp->add_tables();
    t->set_name(name);
    t->set_rows(b.rows);
    t->set_value_bytes(b.value_bytes);
    t->set_state_bytes(b.state_bytes);
    t->set_index_bytes(b.index_bytes);
    t->set_arena_bytes(b.arena_bytes);
    t->set_meta_bytes(b.meta_bytes);
  }
  resp->set_pulls(pulls_);
  resp->set_pushes(pushes_);
  resp->set_auth_failures(auth_failures_);
  resp->set_rejected(rejected_);
  resp->set_snapshot_version(snapshot_version_);
  resp->set_incarnation(incarnation_);
  resp->set_peak_bytes(std::max(peak_bytes_.load(), s.bytes));
  resp->set_refused_rows(refused_rows_);
  return grpc::Status::OK;
}

grpc::Status ShardCore::snapshot(const wire::SnapshotRequest& req, wire::SnapshotResponse* resp) {
  if (snapshot_dir_.empty())
    return reject(grpc::StatusCode::FAILED_PRECONDITION, "Snapshot: this shard has no --snapshot-dir");
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::shared_lock<std::shared_mutex> tables(tables_mu_);
  try {
    const SnapshotInfo info = write_snapshot(store_, snapshot_dir_, req.version(), 3, shard_);
    resp->set_path(info.path);
    resp->set_rows(info.rows);
    snapshot_version_ = req.version();
  } catch (const Error& e) {
    return reject(grpc::StatusCode::INTERNAL, std::string("Snapshot: ") + e.what());
  }
  return grpc::Status::OK;
}

grpc::Status ShardCore::restore(const wire::RestoreRequest& req, wire::RestoreResponse* resp) {
  if (snapshot_dir_.empty())
    return reject(grpc::StatusCode::FAILED_PRECONDITION, "Restore: this shard has no --snapshot-dir");
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::unique_lock<std::shared_mutex> tables(tables_mu_);
  try {
    const SnapshotInfo info = read_snapshot(store_, snapshot_dir_, req.version(), shard_);
    if (evictor_) for (const std::string& name : store_.table_names()) evictor_->apply(store_.table(name));
    resp->set_rows(info.rows);
    snapshot_version_ = req.version();
    last_step_ = req.version();
  } catch (const Error& e) {
    return reject(grpc::StatusCode::FAILED_PRECONDITION, std::string("Restore: ") + e.what());
  }
  return grpc::Status::OK;
}

grpc::Status ShardCore::health(const wire::HealthRequest&, wire::HealthResponse* resp) {
  resp->set_status("SERVING");
  resp->set_shard(shard_.index);
  resp->set_num_shards(shard_.count);
  resp->set_incarnation(incarnation_);
  resp->set_can_snapshot(snapshot_problem_.empty());
  resp->set_snapshot_problem(snapshot_problem_);
  resp->set_snapshot_version(snapshot_version_);
  return grpc::Status::OK;
}

void ShardCore::restore_from(const std::string& dir, int64_t version) {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::unique_lock<std::shared_mutex> tables(tables_mu_);
  read_snapshot(store_, dir, version, shard_);
  if (evictor_) for (const std::string& name : store_.table_names()) evictor_->apply(store_.table(name));
  snapshot_version_ = version;
  last_step_ = version;  // snapshots are numbered by step: admission rounds score rows at the same step
}

int64_t ShardCore::restore_latest() {
  if (snapshot_dir_.empty()) return -1;
  const int64_t v = latest_snapshot_version(snapshot_dir_);
  if (v < 0) return -1;
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::unique_lock<std::shared_mutex> tables(tables_mu_);
  read_snapshot(store_, snapshot_dir_, v, shard_);
  if (evictor_) for (const std::string& name : store_.table_names()) evictor_->apply(store_.table(name));
  snapshot_version_ = v;
  last_step_ = v;
  return v;
}

}  // namespace ration::ps

// ---- deltas and eviction (docs/METHODS.md, "Online parameter server") --------------------------------------------
namespace ration::ps {

void ShardCore::set_eviction(const EvictOptions& options) {
  std::unique_lock<std::shared_mutex> tables(tables_mu_);
  evictor_ = options.active() ? std::make_unique<Evictor>(store_, options) : nullptr;
}

grpc::Status ShardCore::list_tables(const wire::ListTablesRequest&, wire::ListTablesResponse* resp) {
  std::shared_lock<std::shared_mutex> tables(tables_mu_);
  for (const std::string& name : store_.table_names()) {
    *resp->add_tables() = spec_from_table_options(store_.table(name).options());
    resp->add_versions(store_.table(name).version());
  }
  return grpc::Status::OK;
}

grpc::Status ShardCore::get_delta(const wire::DeltaRequest& req, wire::DeltaResponse* resp) {
  std::shared_lock<std::shared_mutex> tables(tables_mu_);
  Table* t = store_.find(req.table());
  if (t == nullptr) return reject(grpc::StatusCode::NOT_FOUND, "GetDelta: unknown table '" + req.table() + "'");
  if (req.from_version() < -1 || req.max_rows() < 0 || req.cursor_stripe() < 0 || req.cursor_slot() < 0)
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "GetDelta: from_version must be >= -1 and max_rows, cursor_stripe, cursor_slot >= 0");
  const int64_t dim = t->dim();
  const int64_t max_rows = std::min<int64_t>(req.max_rows() > 0 ? req.max_rows() : 65536,
                                             std::max<int64_t>(1, limits_.max_message_bytes / (dim * 4 + 32)));
  const bool full = req.from_version() < 0;
  // A table asked for deltas logs its row changes from now on, so the next deltas cost O(changed rows).
  t->enable_change_log();
  *resp->mutable_spec() = spec_from_table_options(t->options());
  resp->set_epoch(t->epoch());
  resp->set_from_version(req.from_version());
  resp->set_full(full);
  const int64_t to_version = req.to_version() > 0 ? req.to_version() : t->settled_version();
  resp->set_to_version(to_version);
  // Tombstones are checked first: a mirror the log no longer reaches is told so before any rows go.
  std::vector<std::pair<uint64_t, int64_t>> tombs;
  if (!full && !t->tombstones_since(req.from_version(), tombs)) {
    resp->set_need_full(true);
    resp->set_done(true);
    return grpc::Status::OK;
  }
  ExportCursor cursor;
  cursor.stripe = req.cursor_stripe();
  cursor.slot = req.cursor_slot();
  ExportedRows rows;
  t->export_changed(full ? -1 : req.from_version(), cursor, max_rows, rows, to_version);
  if (!cursor.done && cursor.stripe >= Table::kStripes) cursor.done = true;
  for (int64_t i = 0; i < rows.size(); ++i) {
    resp->add_ids(rows.ids[static_cast<size_t>(i)]);
    resp->add_versions(rows.infos[static_cast<size_t>(i)].version);
  }
  resp->set_values(std::string(reinterpret_cast<const char*>(rows.values.data()), rows.values.size() * sizeof(float)));
  resp->set_cursor_stripe(cursor.stripe);
  resp->set_cursor_slot(cursor.slot);
  resp->set_done(cursor.done);
  if (cursor.done) {
    if (full) {
      // A full copy carries every disabled id (they read zeros, not the initial value).
      for (uint64_t id : t->disabled_ids()) {
        resp->add_tombstone_ids(id);
        resp->add_tombstone_versions(0);
      }
    } else {
      for (const auto& [id, v] : tombs) {
        resp->add_tombstone_ids(id);
        resp->add_tombstone_versions(v);
      }
    }
  }
  return grpc::Status::OK;
}

}  // namespace ration::ps
