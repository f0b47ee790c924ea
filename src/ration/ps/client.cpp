// client.cpp — PsClient and the two shard channels (see client.h).
#include "ration/ps/client.h"
#include "ration/base/timing.h"

#include <absl/container/flat_hash_map.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "proto/ps.grpc.pb.h"
#include "ration/base/check.h"
#include "ration/base/net.h"
#include "ration/core/trace.h"
#include "ration/ps/partition.h"
#include "ration/ps/server.h"

namespace ration::ps {

std::vector<std::string> split_endpoints(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t a = item.find_first_not_of(" \t");
    const size_t b = item.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

// The embedded shard: the same ShardCore the server runs, called directly.
class LocalChannel final : public ShardChannel {
 public:
  explicit LocalChannel(ShardCore& core) : core_(core) {}
  std::string endpoint() const override { return "embedded shard " + core_.shard().to_string(); }
  grpc::Status declare_tables(const wire::DeclareTablesRequest& q, wire::DeclareTablesResponse* r) override {
    return core_.declare_tables(q, r);
  }
  grpc::Status pull(const wire::PullRequest& q, wire::PullResponse* r) override { return core_.pull(q, r); }
  grpc::Status push(const wire::PushRequest& q, wire::PushResponse* r) override { return core_.push(q, r); }
  grpc::Status stats(const wire::StatsRequest& q, wire::StatsResponse* r) override { return core_.stats(q, r); }
  grpc::Status snapshot(const wire::SnapshotRequest& q, wire::SnapshotResponse* r) override {
    return core_.snapshot(q, r);
  }
  grpc::Status restore(const wire::RestoreRequest& q, wire::RestoreResponse* r) override { return core_.restore(q, r); }
  grpc::Status health(const wire::HealthRequest& q, wire::HealthResponse* r) override { return core_.health(q, r); }

 private:
  ShardCore& core_;
};

std::string read_pem(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  RATION_CHECK(in.good(), key, " '", path, "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A remote shard over gRPC.
class GrpcChannel final : public ShardChannel {
 public:
  GrpcChannel(std::string endpoint, const ClientOptions& o) : endpoint_(std::move(endpoint)), options_(o) {
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
    args.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
    if (!o.tls_ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = read_pem(o.tls_ca, "ps.tls_ca");
      if (!o.tls_cert.empty()) {
        ssl.pem_cert_chain = read_pem(o.tls_cert, "ps.tls_cert");
        ssl.pem_private_key = read_pem(o.tls_key, "ps.tls_key");
      }
      creds = grpc::SslCredentials(ssl);
      if (!o.tls_target_name.empty()) args.SetSslTargetNameOverride(o.tls_target_name);
    }
    stub_ = wire::ParameterServer::NewStub(grpc::CreateCustomChannel(endpoint_, creds, args));
  }
  std::string endpoint() const override { return endpoint_; }
  grpc::Status declare_tables(const wire::DeclareTablesRequest& q, wire::DeclareTablesResponse* r) override {
    return call(&wire::ParameterServer::Stub::DeclareTables, q, r);
  }
  grpc::Status pull(const wire::PullRequest& q, wire::PullResponse* r) override {
    return call(&wire::ParameterServer::Stub::Pull, q, r);
  }
  grpc::Status push(const wire::PushRequest& q, wire::PushResponse* r) override {
    return call(&wire::ParameterServer::Stub::Push, q, r);
  }
  grpc::Status stats(const wire::StatsRequest& q, wire::StatsResponse* r) override {
    return call(&wire::ParameterServer::Stub::Stats, q, r);
  }
  grpc::Status snapshot(const wire::SnapshotRequest& q, wire::SnapshotResponse* r) override {
    return call(&wire::ParameterServer::Stub::Snapshot, q, r);
  }
  grpc::Status restore(const wire::RestoreRequest& q, wire::RestoreResponse* r) override {
    return call(&wire::ParameterServer::Stub::Restore, q, r);
  }
  grpc::Status health(const wire::HealthRequest& q, wire::HealthResponse* r) override {
    return call(&wire::ParameterServer::Stub::Health, q, r);
  }

 private:
  // Every RPC: a fresh context (deadline, token) for one call of the stub's method.
  template <typename Request, typename Response>
  grpc::Status call(grpc::Status (wire::ParameterServer::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& q, Response* r) {
    auto c = context();
    return check_incarnation(*c, ((*stub_).*method)(c.get(), q, r));
  }
  std::unique_ptr<grpc::ClientContext> context() const {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms));
    if (!options_.auth_token.empty()) c->AddMetadata("authorization", "Bearer " + options_.auth_token);
    const uint64_t known = incarnation_.load();
    if (known != 0) c->AddMetadata(kExpectIncarnationKey, incarnation_hex(known));
    return c;
  }
  // The first answer names the server's incarnation; a later one naming another means the server
  // restarted between the calls (it refuses calls expecting the old one itself, this catches the rest).
  grpc::Status check_incarnation(const grpc::ClientContext& c, grpc::Status s) {
    const auto& md = c.GetServerInitialMetadata();
    auto it = md.find(kIncarnationKey);
    if (it == md.end()) return s;
    const uint64_t now = std::strtoull(std::string(it->second.data(), it->second.size()).c_str(), nullptr, 16);
    uint64_t known = 0;
    // A refusal from the server itself (it names the snapshot it holds) says more than this check.
    if (!s.ok() || now == 0 || incarnation_.compare_exchange_strong(known, now) || known == now) return s;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, restarted_message(endpoint_, known, now, -1));
  }

  std::string endpoint_;
  ClientOptions options_;
  std::unique_ptr<wire::ParameterServer::Stub> stub_;
  std::atomic<uint64_t> incarnation_{0};  // 0: not known yet
};

bool retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    default: return "ERROR";
  }
}

}  // namespace

PsClient::PsClient(ClientOptions options) : options_(std::move(options)) {
  RATION_CHECK(options_.retries >= 1, "ps.retries must be >= 1; got ", options_.retries);
  RATION_CHECK(options_.max_ids_per_request >= 1, "ps.max_ids_per_request must be >= 1");
  if (options_.endpoints.empty()) {
    RATION_CHECK(options_.embedded_shards >= 1 && options_.embedded_shards <= 4096,
                 "ps.shards must be in [1, 4096]; got ", options_.embedded_shards);
    const uint32_t n = static_cast<uint32_t>(options_.embedded_shards);
    for (uint32_t i = 0; i < n; ++i) {
      std::string dir;
      if (!options_.snapshot_dir.empty())
        dir = (std::filesystem::path(options_.snapshot_dir) /
               ("shard-" + std::to_string(i) + "-of-" + std::to_string(n)))
                  .string();
      embedded_.push_back(std::make_unique<ShardCore>(ShardId{i, n}, dir));
      channels_.push_back(std::make_unique<LocalChannel>(*embedded_.back()));
    }
  } else {
    for (const auto& e : options_.endpoints) {
      // The token is a secret: it goes over TLS, or stays on this machine.
      std::string host;
      int port = 0;
      if (!options_.auth_token.empty() && options_.tls_ca.empty()) {
        split_host_port(e, "ps.endpoints", &host, &port);
        RATION_CHECK(is_loopback_host(host), "ps.endpoints: ", e, " is not a loopback address and TLS is off, so the ",
                     "token (ps.auth_token_file) would travel in clear; set ps.tls_ca (the CA that signed the ",
                     "servers' certificates) to connect with TLS");
      }
      channels_.push_back(std::make_unique<GrpcChannel>(e, options_));
    }
  }
}

PsClient::~PsClient() = default;

ShardCore& PsClient::embedded_shard(int i) {
  RATION_CHECK(embedded() && i >= 0 && i < num_shards(), "no embedded shard ", i);
  return *embedded_[static_cast<size_t>(i)];
}

template <typename Call>
void PsClient::call_shard(int shard, const char* rpc, Call call) {
  ShardChannel& ch = *channels_[static_cast<size_t>(shard)];
  grpc::Status s;
  int64_t backoff = options_.backoff_ms;
  for (int attempt = 1; attempt <= options_.retries; ++attempt) {
    s = call(ch);
    if (s.ok()) return;
    if (!retryable(s)) break;
    if (attempt < options_.retries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
      backoff *= 2;
    } else {
      RATION_CHECK(false, "parameter server shard ", shard, "/", num_shards(), " at ", ch.endpoint(), ": ", rpc,
                   " failed after ", options_.retries, " attempts: ", code_name(s.error_code()), ": ",
                   s.error_message(), " (is `ration ps serve` running there? ps.endpoints lists shard i at position i)");
    }
  }
  RATION_CHECK(false, "parameter server shard ", shard, "/", num_shards(), " at ", ch.endpoint(), ": ", rpc,
               " refused: ", code_name(s.error_code()), ": ", s.error_message());
}

template <typename Fn>
void PsClient::for_each_shard(const std::vector<int>& shards, Fn fn) {
  if (shards.size() <= 1 || embedded()) {
    // In-process shards run on this thread: the calls are memory-bound and the trainer already uses the
    // cores; remote shards are waited for in parallel.
    for (int s : shards) fn(s);
    return;
  }
  std::vector<std::future<void>> futures;
  for (size_t i = 1; i < shards.size(); ++i) futures.push_back(std::async(std::launch::async, fn, shards[i]));
  std::exception_ptr first;
  try {
    fn(shards[0]);
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& f : futures) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void PsClient::check_health() {
  std::vector<int> all(channels_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  for_each_shard(all, [&](int s) {
    wire::HealthResponse r;
    call_shard(s, "Health", [&](ShardChannel& ch) { return ch.health({}, &r); });
    RATION_CHECK(r.shard() == static_cast<uint32_t>(s) && r.num_shards() == static_cast<uint32_t>(num_shards()),
                 "ps.endpoints[", s, "] = ", channels_[static_cast<size_t>(s)]->endpoint(), " serves shard ", r.shard(),
                 "/", r.num_shards(), " but the client expects shard ", s, "/", num_shards(),
                 " (list the endpoints in shard order, one per shard)");
    RATION_CHECK(!options_.need_snapshots || r.can_snapshot(), "parameter server shard ", s, "/", num_shards(), " at ",
                 channels_[static_cast<size_t>(s)]->endpoint(), " cannot snapshot (",
                 r.snapshot_problem().empty() ? std::string("it did not say why") : r.snapshot_problem(),
                 "), but train.checkpoint_dir is set and every checkpoint snapshots every shard: restart it with ",
                 "--snapshot-dir DIR (a directory of its own), or train without train.checkpoint_dir");
  });
}

void PsClient::declare_tables(const std::vector<TableOptions>& tables) {
  wire::DeclareTablesRequest q;
  for (const auto& t : tables) *q.add_tables() = spec_from_table_options(t);
  std::vector<int> all(channels_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  for_each_shard(all, [&](int s) {
    wire::DeclareTablesResponse r;
    call_shard(s, "DeclareTables", [&](ShardChannel& ch) { return ch.declare_tables(q, &r); });
  });
}

PulledRows PsClient::pull(const std::string& table, const int64_t* ids, int64_t n, MissingRow missing) {
  TraceRegion span("ps", "ps", [&] { return "pull " + table + " (" + std::to_string(n) + " ids)"; });
  const auto t0 = Clock::now();
  PulledRows out;
  // Deduplicate: first-seen order.
  absl::flat_hash_map<uint64_t, int64_t> local;
  local.reserve(static_cast<size_t>(n));
  out.local_index = at::empty({n}, at::kLong);
  int64_t* li = out.local_index.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t id = static_cast<uint64_t>(ids[i]);
    auto [it, inserted] = local.try_emplace(id, static_cast<int64_t>(out.unique_ids.size()));
    if (inserted) out.unique_ids.push_back(id);
    li[i] = it->second;
  }
  const int64_t u = static_cast<int64_t>(out.unique_ids.size());
  // Partition unique ids by shard.
  const uint32_t shards = static_cast<uint32_t>(num_shards());
  std::vector<std::vector<int64_t>> positions(shards);
  for (int64_t k = 0; k < u; ++k) positions[shard_of(out.unique_ids[static_cast<size_t>(k)], shards)].push_back(k);
  std::vector<int> busy;
  for (uint32_t s = 0; s < shards; ++s)
    if (!positions[s].empty()) busy.push_back(static_cast<int>(s));
  std::vector<int64_t> dims(shards, -1);
  std::vector<std::vector<float>> got(shards);
  for_each_shard(busy, [&](int s) {
    const auto& pos = positions[static_cast<size_t>(s)];
    auto& buf = got[static_cast<size_t>(s)];
    for (size_t b = 0; b < pos.size(); b += static_cast<size_t>(options_.max_ids_per_request)) {
      const size_t e = std::min(pos.size(), b + static_cast<size_t>(options_.max_ids_per_request));
      wire::PullRequest q;
      q.set_table(table);
      q.set_read_only(missing == MissingRow::ReadDefault);
      q.mutable_ids()->Reserve(static_cast<int>(e - b));
      for (size_t k = b; k < e; ++k) q.add_ids(out.unique_ids[static_cast<size_t>(pos[k])]);
      wire::PullResponse r;
      call_shard(s, "Pull", [&](ShardChannel& ch) { return ch.pull(q, &r); });
      RATION_CHECK(static_cast<int64_t>(r.values().size()) == static_cast<int64_t>(e - b) * r.dim() * 4,
                   "parameter server shard ", s, " at ", channels_[static_cast<size_t>(s)]->endpoint(),
                   ": Pull answered ", r.values().size(), " bytes for ", e - b, " rows of dim ", r.dim());
      dims[static_cast<size_t>(s)] = r.dim();
      const size_t old = buf.size();
      buf.resize(old + r.values().size() / 4);
      std::memcpy(buf.data() + old, r.values().data(), r.values().size());
    }
  });
  int64_t dim = -1;
  for (int s : busy) dim = dims[static_cast<size_t>(s)];
  if (dim < 0) {  // nothing pulled: ask the table's dim from any shard's stats-free path (a zero-id pull)
    wire::PullRequest q;
    q.set_table(table);
    wire::PullResponse r;
    call_shard(0, "Pull", [&](ShardChannel& ch) { return ch.pull(q, &r); });
    dim = r.dim();
  }
  out.rows = at::empty({u, dim}, at::kFloat);
  float* rows = out.rows.data_ptr<float>();
  for (int s : busy) {
    const auto& pos = positions[static_cast<size_t>(s)];
    const float* src = got[static_cast<size_t>(s)].data();
    for (size_t k = 0; k < pos.size(); ++k)
      std::memcpy(rows + pos[k] * dim, src + static_cast<int64_t>(k) * dim, static_cast<size_t>(dim) * 4);
  }
  const std::lock_guard<std::mutex> lock(times_mutex_);
  times_.pull_ms += ms_since(t0);
  times_.pulls += 1;
  times_.rows_pulled += u;
  return out;
}

void PsClient::push(const std::string& table, const uint64_t* ids, int64_t n, const float* grads, int64_t dim,
                    int64_t step) {
  TraceRegion span("ps", "ps", [&] { return "push " + table + " (" + std::to_string(n) + " rows)"; });
  const auto t0 = Clock::now();
  const uint32_t shards = static_cast<uint32_t>(num_shards());
  std::vector<std::vector<int64_t>> positions(shards);
  for (int64_t k = 0; k < n; ++k) positions[shard_of(ids[k], shards)].push_back(k);
  std::vector<int> busy;
  for (uint32_t s = 0; s < shards; ++s)
    if (!positions[s].empty()) busy.push_back(static_cast<int>(s));
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for_each_shard(busy, [&](int s) {
    const auto& pos = positions[static_cast<size_t>(s)];
    for (size_t b = 0; b < pos.size(); b += static_cast<size_t>(options_.max_ids_per_request)) {
      const size_t e = std::min(pos.size(), b + static_cast<size_t>(options_.max_ids_per_request));
      wire::PushRequest q;
      q.set_table(table);
      q.set_step(step);
      q.mutable_ids()->Reserve(static_cast<int>(e - b));
      std::string* g = q.mutable_grads();
      g->resize((e - b) * row_bytes);
      for (size_t k = b; k < e; ++k) {
        q.add_ids(ids[pos[k]]);
        std::memcpy(g->data() + (k - b) * row_bytes, grads + pos[k] * dim, row_bytes);
      }
      wire::PushResponse r;
      call_shard(s, "Push", [&](ShardChannel& ch) { return ch.push(q, &r); });
    }
  });
  const std::lock_guard<std::mutex> lock(times_mutex_);
  times_.push_ms += ms_since(t0);
  times_.pushes += 1;
  times_.rows_pushed += n;
}

ClientTimes PsClient::times() const {
  const std::lock_guard<std::mutex> lock(times_mutex_);
  return times_;
}

std::vector<ShardStats> PsClient::stats() {
  std::vector<ShardStats> out(channels_.size());
  std::vector<int> all(channels_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  for_each_shard(all, [&](int s) {
    out[static_cast<size_t>(s)].endpoint = channels_[static_cast<size_t>(s)]->endpoint();
    call_shard(s, "Stats", [&](ShardChannel& ch) { return ch.stats({}, &out[static_cast<size_t>(s)].stats); });
  });
  return out;
}

void PsClient::snapshot(int64_t version) {
  std::vector<int> all(channels_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  wire::SnapshotRequest q;
  q.set_version(version);
  for_each_shard(all, [&](int s) {
    wire::SnapshotResponse r;
    call_shard(s, "Snapshot", [&](ShardChannel& ch) { return ch.snapshot(q, &r); });
  });
}

void PsClient::restore(int64_t version, const std::string& embedded_dir) {
  if (embedded() && !embedded_dir.empty()) {
    for (int s = 0; s < num_shards(); ++s) {
      const std::string dir = (std::filesystem::path(embedded_dir) /
                               ("shard-" + std::to_string(s) + "-of-" + std::to_string(num_shards())))
                                  .string();
      embedded_[static_cast<size_t>(s)]->restore_from(dir, version);
    }
    return;
  }
  std::vector<int> all(channels_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  wire::RestoreRequest q;
  q.set_version(version);
  for_each_shard(all, [&](int s) {
    wire::RestoreResponse r;
    call_shard(s, "Restore", [&](ShardChannel& ch) { return ch.restore(q, &r); });
  });
}

}  // namespace ration::ps
