// online_server.cpp — the online parameter server (see online_server.h).
#include "ration/serving/online_server.h"

#include <absl/container/flat_hash_map.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "proto/ps.grpc.pb.h"
#include "ration/base/check.h"
#include "ration/models/ctr.h"
#include "ration/ps/server.h"
#include "ration/train/checkpoint.h"
#include "ration/train/trainer.h"

namespace ration::ps {

void OnlineOptions::validate() const {
  RATION_CHECK(sync_interval_s >= 0, "--sync-interval-s must be >= 0 seconds (0: on demand only); got ", sync_interval_s);
  RATION_CHECK(max_rows >= 1, "--delta-rows must be >= 1; got ", max_rows);
  RATION_CHECK(apply_delay_ms >= 0, "apply delay must be >= 0 ms");
  RATION_CHECK(model_config.empty() == checkpoint_dir.empty(),
               "--model-config and --checkpoint-dir go together (Predict needs both); got ",
               model_config.empty() ? "--checkpoint-dir only" : "--model-config only");
  if (!listen.empty()) check_serve_security(listen, security());
  // The token itself is read when the server starts; here only whether there is one matters.
  FollowSecurity f{auth_token_file.empty() ? std::string() : std::string("token"), follow_tls_ca, follow_tls_cert,
                   follow_tls_key, follow_tls_target_name};
  for (const std::string& ep : follow) check_follow_security(ep, f);
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

struct OnlineServer::Impl {
  OnlineOptions options;
  std::string token;
  std::vector<std::unique_ptr<DeltaSource>> sources;
  std::mutex sync_mu;  // one sync at a time
  std::atomic<double> last_sync_start{0};  // start of the last sync that completed
  std::atomic<bool> synced{false};
  std::atomic<int64_t> auth_failures{0};
  // Sync loop.
  std::thread loop;
  std::mutex loop_mu;
  std::condition_variable loop_cv;
  bool stopping = false;
  // Predict: the dense model.
  std::mutex model_mu;
  std::unique_ptr<models::Model> model;
  int64_t model_step = -1;
  // gRPC.
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

namespace {

class OnlineService final : public wire::OnlineParameterServer::Service {
 public:
  OnlineService(OnlineServer& s, std::string token) : s_(s), token_(std::move(token)) {}
  grpc::Status Lookup(grpc::ServerContext* c, const wire::LookupRequest* q, wire::LookupResponse* r) override {
    return ok(c) ? s_.lookup(*q, r) : denied();
  }
  grpc::Status Predict(grpc::ServerContext* c, const wire::PredictRequest* q, wire::PredictResponse* r) override {
    return ok(c) ? s_.predict(*q, r) : denied();
  }
  grpc::Status Sync(grpc::ServerContext* c, const wire::SyncRequest*, wire::SyncResponse* r) override {
    if (!ok(c)) return denied();
    try {
      s_.sync_now();
    } catch (const Error& e) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, e.what());
    }
    return s_.stats(r->mutable_stats());
  }
  grpc::Status Stats(grpc::ServerContext* c, const wire::StatsRequest*, wire::OnlineStatsResponse* r) override {
    return ok(c) ? s_.stats(r) : denied();
  }
  grpc::Status Health(grpc::ServerContext* c, const wire::HealthRequest*, wire::HealthResponse* r) override {
    if (!ok(c)) return denied();
    r->set_status("SERVING");
    return grpc::Status::OK;
  }

 private:
  bool ok(grpc::ServerContext* c) const {
    if (call_authorized(*c, token_)) return true;
    s_.count_auth_failure();
    return false;
  }
  static grpc::Status denied() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong authorization token (send metadata 'authorization: Bearer <token>')");
  }

  OnlineServer& s_;
  std::string token_;
};

}  // namespace

OnlineServer::OnlineServer(OnlineOptions options) : OnlineServer(options, {}) {}

OnlineServer::OnlineServer(OnlineOptions options, std::vector<std::unique_ptr<DeltaSource>> sources)
    : impl_(std::make_unique<Impl>()) {
  options.validate();
  impl_->options = options;
  if (!options.auth_token_file.empty()) impl_->token = read_token_file(options.auth_token_file);
  if (sources.empty()) {
    RATION_CHECK(!options.follow.empty(), "ps serve --online needs --follow ENDPOINTS (the training shards, in order)");
    const FollowSecurity follow{impl_->token, options.follow_tls_ca, options.follow_tls_cert, options.follow_tls_key,
                                options.follow_tls_target_name};
    for (const std::string& ep : options.follow) sources.push_back(remote_delta_source(ep, follow));
  }
  impl_->sources = std::move(sources);
  store_ = std::make_unique<OnlineStore>(static_cast<int>(impl_->sources.size()), options.state_dir);
  store_->set_apply_delay_ms(options.apply_delay_ms);
  if (!options.model_config.empty()) {
    // The trainer's own model, built from its config; only its dense parameters are used.
    train::Setup setup = train::build_setup(train::load_config(options.model_config, {}));
    RATION_CHECK(dynamic_cast<models::Ctr*>(setup.model.get()) != nullptr, "--model-config ", options.model_config,
                 ": Predict serves model.type = 'ctr'; got '", setup.model->family(), "'");
    impl_->model = std::move(setup.model);
    if (train::has_checkpoint(options.checkpoint_dir)) reload_model();
  }
  if (!options.listen.empty()) {
    impl_->service = std::make_unique<OnlineService>(*this, impl_->token);
    grpc::ServerBuilder b;
    b.AddListeningPort(options.listen, server_credentials(options.security()), &impl_->port);
    b.RegisterService(impl_->service.get());
    b.SetMaxReceiveMessageSize(256 << 20);
    b.SetMaxSendMessageSize(256 << 20);
    impl_->server = b.BuildAndStart();
    RATION_CHECK(impl_->server != nullptr && impl_->port > 0, "--listen ", options.listen, ": cannot bind");
  }
}

OnlineServer::~OnlineServer() { shutdown(); }

void OnlineServer::shutdown() {
  stop_sync_loop();
  if (impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    impl_->server.reset();
  }
}

int OnlineServer::port() const { return impl_->port; }
void OnlineServer::count_auth_failure() { ++impl_->auth_failures; }
int64_t OnlineServer::auth_failures() const { return impl_->auth_failures.load(); }

SyncReport OnlineServer::sync_now() {
  std::lock_guard<std::mutex> lock(impl_->sync_mu);
  const double start = now_s();
  SyncReport total;
  for (size_t i = 0; i < impl_->sources.size(); ++i) {
    const SyncReport r = sync_source(*store_, static_cast<int>(i), *impl_->sources[i], impl_->options.max_rows);
    total.rows += r.rows;
    total.tombstones += r.tombstones;
    total.bytes += r.bytes;
    total.full = total.full || r.full;
    total.gap = total.gap || r.gap;
  }
  impl_->last_sync_start = start;
  impl_->synced = true;
  if (impl_->model) reload_model();
  return total;
}

void OnlineServer::start_sync_loop() {
  if (impl_->options.sync_interval_s <= 0 || impl_->loop.joinable()) return;
  impl_->stopping = false;
  impl_->loop = std::thread([this] {
    std::unique_lock<std::mutex> lock(impl_->loop_mu);
    while (!impl_->stopping) {
      lock.unlock();
      try {
        sync_now();
      } catch (const Error& e) {
        std::cerr << "online ps: sync failed: " << e.what() << "\n";
      }
      lock.lock();
      impl_->loop_cv.wait_for(lock, std::chrono::duration<double>(impl_->options.sync_interval_s),
                              [this] { return impl_->stopping; });
    }
  });
}

void OnlineServer::stop_sync_loop() {
  {
    std::lock_guard<std::mutex> lock(impl_->loop_mu);
    impl_->stopping = true;
  }
  impl_->loop_cv.notify_all();
  if (impl_->loop.joinable()) impl_->loop.join();
}

grpc::Status OnlineServer::lookup(const wire::LookupRequest& q, wire::LookupResponse* r) {
  const int64_t dim = store_->dim(q.table());
  if (dim < 0) return grpc::Status(grpc::StatusCode::NOT_FOUND, "Lookup: table '" + q.table() + "' is not mirrored (yet)");
  std::string* values = r->mutable_values();
  values->resize(static_cast<size_t>(q.ids_size() * dim) * 4);
  store_->lookup(q.table(), reinterpret_cast<const uint64_t*>(q.ids().data()), q.ids_size(),
                 reinterpret_cast<float*>(values->data()));
  r->set_dim(dim);
  return grpc::Status::OK;
}

int64_t OnlineServer::reload_model() {
  std::lock_guard<std::mutex> lock(impl_->model_mu);
  if (!impl_->model || !train::has_checkpoint(impl_->options.checkpoint_dir)) return impl_->model_step;
  const auto list = train::list_checkpoints(impl_->options.checkpoint_dir);
  if (!list.empty() && list.back().first == impl_->model_step) return impl_->model_step;
  const train::Checkpoint ck = train::load_checkpoint(impl_->options.checkpoint_dir);
  train::restore_weights(ck, impl_->model->named_parameters(), impl_->model->named_buffers());
  impl_->model_step = ck.step;
  return ck.step;
}

grpc::Status OnlineServer::predict(const wire::PredictRequest& q, wire::PredictResponse* r) {
  std::lock_guard<std::mutex> lock(impl_->model_mu);
  auto* ctr = dynamic_cast<models::Ctr*>(impl_->model.get());
  if (ctr == nullptr || impl_->model_step < 0)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "Predict: no dense model (start with --model-config and --checkpoint-dir; a checkpoint must exist)");
  const int64_t b = q.rows(), nd = ctr->options.num_dense, d = ctr->options.embedding_dim;
  if (b < 1 || static_cast<int64_t>(q.dense().size()) != b * nd * 4 || q.fields_size() != ctr->options.num_fields)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "Predict: needs rows >= 1, dense of rows * " + std::to_string(nd) + " float32 and " +
                            std::to_string(ctr->options.num_fields) + " fields");
  NoGradGuard no_grad;
  const at::TensorOptions p = ctr->parameter_options();
  at::Tensor dense = at::empty({b, nd}, at::kFloat);
  std::memcpy(dense.data_ptr<float>(), q.dense().data(), q.dense().size());
  std::vector<models::FieldRows> fields;
  for (int64_t f = 0; f < q.fields_size(); ++f) {
    const wire::FieldBag& bag = q.fields(static_cast<int>(f));
    if (bag.offsets_size() != b)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Predict: field " + std::to_string(f) + " needs one offset per row");
    models::FieldRows fr;
    fr.table = ctr->table_name(f);
    // Unique ids in first-seen order, as the trainer's pull dedups them.
    absl::flat_hash_map<uint64_t, int64_t> pos;
    at::Tensor local = at::empty({bag.ids_size()}, at::kLong);
    for (int64_t i = 0; i < bag.ids_size(); ++i) {
      auto [it, fresh] = pos.try_emplace(bag.ids(static_cast<int>(i)), static_cast<int64_t>(fr.unique_ids.size()));
      if (fresh) fr.unique_ids.push_back(bag.ids(static_cast<int>(i)));
      local.data_ptr<int64_t>()[i] = it->second;
    }
    at::Tensor rows = at::zeros({static_cast<int64_t>(fr.unique_ids.size()), d}, at::kFloat);
    if (!fr.unique_ids.empty() &&
        !store_->lookup(fr.table, fr.unique_ids.data(), static_cast<int64_t>(fr.unique_ids.size()), rows.data_ptr<float>()))
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "Predict: table '" + fr.table + "' is not mirrored (yet)");
    at::Tensor offsets = at::empty({b}, at::kLong);
    for (int64_t i = 0; i < b; ++i) offsets.data_ptr<int64_t>()[i] = bag.offsets(static_cast<int>(i));
    fr.rows = Value(rows.to(p.dtype().toScalarType()));
    fr.local_index = Value(local);
    fr.offsets = Value(offsets);
    fields.push_back(std::move(fr));
  }
  const Value z = ctr->logits(Value(dense.to(p.dtype().toScalarType())), fields);
  const at::Tensor prob = at::sigmoid(z.tensor().view({-1})).to(at::kFloat).contiguous();
  for (int64_t i = 0; i < b; ++i) r->add_probabilities(prob.data_ptr<float>()[i]);
  r->set_checkpoint_step(impl_->model_step);
  return grpc::Status::OK;
}

grpc::Status OnlineServer::stats(wire::OnlineStatsResponse* r) {
  const std::vector<MirrorInfo> mirrors = store_->mirrors();
  int64_t behind = 0;
  for (size_t s = 0; s < impl_->sources.size(); ++s) {
    wire::ListTablesResponse lt;
    if (!impl_->sources[s]->list_tables(wire::ListTablesRequest(), &lt).ok()) continue;
    for (int i = 0; i < lt.tables_size(); ++i) {
      int64_t have = 0;
      for (const MirrorInfo& m : mirrors)
        if (m.source == static_cast<int>(s) && m.table == lt.tables(i).name()) have = m.version;
      behind += std::max<int64_t>(0, lt.versions(i) - have);
    }
  }
  for (const MirrorInfo& m : mirrors) {
    wire::OnlineTableStats* t = r->add_tables();
    t->set_name(m.table + "@" + std::to_string(m.source));
    t->set_rows(m.rows);
    t->set_disabled(m.disabled);
    t->set_version(m.version);
    t->set_source_version(m.source_version);
    t->set_bytes(m.bytes);
  }
  r->set_staleness_s(impl_->synced ? now_s() - impl_->last_sync_start.load() : -1);
  r->set_versions_behind(behind);
  r->set_auth_failures(impl_->auth_failures.load());
  const OnlineCounters c = store_->counters();
  r->set_syncs(c.syncs);
  r->set_full_resyncs(c.full_resyncs);
  r->set_delta_rows(c.delta_rows);
  r->set_tombstones(c.tombstones);
  r->set_lookups(c.lookups);
  {
    std::lock_guard<std::mutex> lock(impl_->model_mu);
    r->set_checkpoint_step(impl_->model_step);
  }
  return grpc::Status::OK;
}

namespace {
std::atomic<bool> g_online_stop{false};
void on_online_signal(int) { g_online_stop = true; }
}  // namespace

int serve_online_until_signal(const OnlineOptions& options) {
  OnlineServer server(options);
  std::signal(SIGTERM, on_online_signal);
  std::signal(SIGINT, on_online_signal);
  std::string host;
  int port = 0;
  split_host_port(options.listen, "--listen", &host, &port);
  std::cout << "listening on " << host << ":" << server.port() << std::endl;
  server.start_sync_loop();
  while (!g_online_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server.shutdown();
  return 0;
}

}  // namespace ration::ps
