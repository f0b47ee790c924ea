// server.cpp — the gRPC shard server (see server.h).
#include "ration/ps/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "proto/ps.grpc.pb.h"
#include "ration/base/check.h"
#include "ration/base/net.h"
#include "ration/ps/snapshot.h"

namespace ration::ps {

void split_host_port(const std::string& address, const std::string& where, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < address.size();
  if (ok) {
    *host = address.substr(0, colon);
    try {
      size_t used = 0;
      const int p = std::stoi(address.substr(colon + 1), &used);
      ok = used == address.size() - colon - 1 && p >= 0 && p <= 65535;
      *port = p;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  RATION_CHECK(ok, where, ": expected HOST:PORT (e.g. 127.0.0.1:7070); got '", address, "'");
}

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  RATION_CHECK(in.good(), "--auth-token-file '", path, "' cannot be read");
  // A secret others can read is no secret: refuse it, as ssh does a private key.
  struct stat st {};
  RATION_CHECK(::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) == 0, "--auth-token-file '", path,
               "' is readable or writable by other users (mode ", std::oct, (st.st_mode & 0777), std::dec,
               "); the token is a secret: chmod 600 '", path, "'");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) token.pop_back();
  RATION_CHECK(token.size() >= 16, "--auth-token-file '", path, "': the token must be at least 16 characters (got ",
               token.size(), ")");
  return token;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  RATION_CHECK(in.good(), flag, " '", path, "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string check_serve_security(const std::string& listen, const ServeSecurity& o) {
  std::string host;
  int port = 0;
  split_host_port(listen, "--listen", &host, &port);
  const bool tls = !o.tls_cert.empty() || !o.tls_key.empty();
  RATION_CHECK(o.tls_cert.empty() == o.tls_key.empty(), "--tls-cert and --tls-key must be given together");
  RATION_CHECK(o.tls_ca.empty() || tls, "--tls-ca (client certificate verification) needs --tls-cert and --tls-key");
  RATION_CHECK(is_loopback_host(host) || tls || !o.auth_token_file.empty(), "--listen ", listen,
               " is not a loopback address: refusing to serve embeddings to the network without client ",
               "authentication: --auth-token-file FILE, or --tls-cert/--tls-key with --tls-ca CA (mutual TLS) ",
               "(or listen on 127.0.0.1)");
  // Server-only TLS encrypts, but any client that trusts the CA could declare tables and push gradients.
  RATION_CHECK(is_loopback_host(host) || !o.tls_ca.empty() || !o.auth_token_file.empty(), "--listen ", listen,
               " is not a loopback address: --tls-cert/--tls-key alone encrypt the connection but do not ",
               "authenticate clients (anyone who trusts the CA could push gradients); add --auth-token-file FILE ",
               "(a shared token, sent over TLS) or --tls-ca CA (mutual TLS: clients need a certificate signed by it)");
  return o.auth_token_file.empty() ? std::string() : read_token_file(o.auth_token_file);
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const ServeSecurity& o) {
  if (o.tls_cert.empty() && o.tls_key.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(o.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_key_cert_pairs.push_back({read_file(o.tls_key, "--tls-key"), read_file(o.tls_cert, "--tls-cert")});
  if (!o.tls_ca.empty()) ssl.pem_root_certs = read_file(o.tls_ca, "--tls-ca");
  return grpc::SslServerCredentials(ssl);
}

std::string incarnation_hex(uint64_t incarnation) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(incarnation));
  return buf;
}

std::string restarted_message(const std::string& shard, uint64_t was, uint64_t now, int64_t snapshot_version) {
  return "shard " + shard + " restarted while this client trained against it (incarnation " + incarnation_hex(was) +
         " then, " + incarnation_hex(now) + " now; it holds " +
         (snapshot_version >= 0 ? "the rows of snapshot v" + std::to_string(snapshot_version)
                                : std::string("empty tables")) +
         "): the rows pushed since are lost, so training stops rather than go on with rolled-back embeddings; "
         "resume from the last checkpoint (ration train ... --resume), which restores every shard";
}

bool call_authorized(const grpc::ServerContext& c, const std::string& token) {
  if (token.empty()) return true;
  const auto& md = c.client_metadata();
  auto it = md.find("authorization");
  const std::string got = it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
  return constant_time_equal(got, "Bearer " + token);
}

namespace {

// Every RPC: authorise (when a token is configured), then hand the request to the shard.
class Service final : public wire::ParameterServer::Service {
 public:
  Service(ShardCore& core, std::string token) : core_(core), token_(std::move(token)) {}

  grpc::Status DeclareTables(grpc::ServerContext* c, const wire::DeclareTablesRequest* q,
                             wire::DeclareTablesResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.declare_tables(*q, r);
  }
  grpc::Status Pull(grpc::ServerContext* c, const wire::PullRequest* q, wire::PullResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.pull(*q, r);
  }
  grpc::Status Push(grpc::ServerContext* c, const wire::PushRequest* q, wire::PushResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.push(*q, r);
  }
  grpc::Status Stats(grpc::ServerContext* c, const wire::StatsRequest* q, wire::StatsResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.stats(*q, r);
  }
  grpc::Status Snapshot(grpc::ServerContext* c, const wire::SnapshotRequest* q, wire::SnapshotResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.snapshot(*q, r);
  }
  grpc::Status Restore(grpc::ServerContext* c, const wire::RestoreRequest* q, wire::RestoreResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.restore(*q, r);
  }
  grpc::Status Health(grpc::ServerContext* c, const wire::HealthRequest* q, wire::HealthResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.health(*q, r);
  }
  grpc::Status GetDelta(grpc::ServerContext* c, const wire::DeltaRequest* q, wire::DeltaResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.get_delta(*q, r);
  }
  grpc::Status ListTables(grpc::ServerContext* c, const wire::ListTablesRequest* q, wire::ListTablesResponse* r) override {
    if (grpc::Status g = gate(c); !g.ok()) return g;
    return core_.list_tables(*q, r);
  }

 private:
  // Every call: the answer names this incarnation; a call that expects another is refused (the client
  // began with a server that has since restarted), before anything is applied.
  grpc::Status gate(grpc::ServerContext* c) {
    c->AddInitialMetadata(kIncarnationKey, incarnation_hex(core_.incarnation()));
    if (!call_authorized(*c, token_)) {
      core_.count_auth_failure();
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing or wrong authorization token (send metadata 'authorization: Bearer <token>')");
    }
    const auto& md = c->client_metadata();
    auto it = md.find(kExpectIncarnationKey);
    if (it == md.end()) return grpc::Status::OK;
    const std::string expect(it->second.data(), it->second.size());
    if (expect == incarnation_hex(core_.incarnation())) return grpc::Status::OK;
    wire::StatsResponse st;
    core_.stats({}, &st);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        restarted_message(core_.shard().to_string(), std::strtoull(expect.c_str(), nullptr, 16),
                                          core_.incarnation(), st.snapshot_version()));
  }

  ShardCore& core_;
  std::string token_;
};

}  // namespace

struct PsServer::Impl {
  ServeOptions options;
  std::unique_ptr<SnapshotDirLock> snapshot_lock;  // held while serving: one server per directory
  std::unique_ptr<ShardCore> core;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

PsServer::PsServer(ServeOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const ServeOptions& o = m.options;
  const std::string token = check_serve_security(o.listen, o.security());

  // The snapshot directory is made, checked writable and locked now, not at the trainer's first checkpoint.
  if (!o.snapshot_dir.empty()) m.snapshot_lock = std::make_unique<SnapshotDirLock>(o.snapshot_dir, o.shard, "--snapshot-dir");
  m.core = std::make_unique<ShardCore>(o.shard, o.snapshot_dir, o.limits);
  if (o.snapshot_dir.empty())
    std::fprintf(stderr, "ps shard %s: no --snapshot-dir: this shard cannot snapshot, so a trainer that writes "
                         "checkpoints (train.checkpoint_dir) refuses it at start\n", o.shard.to_string().c_str());
  const int64_t restored = m.core->restore_latest();
  if (restored >= 0) std::fprintf(stderr, "ps shard %s: restored snapshot v%lld from %s\n",
                                  o.shard.to_string().c_str(), static_cast<long long>(restored), o.snapshot_dir.c_str());
  o.evict.validate("ps serve");
  m.core->set_eviction(o.evict);
  m.service = std::make_unique<Service>(*m.core, token);

  const std::shared_ptr<grpc::ServerCredentials> creds = server_credentials(o.security());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, creds, &m.port);
  builder.RegisterService(m.service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.limits.max_message_bytes));
  m.server = builder.BuildAndStart();
  RATION_CHECK(m.server != nullptr && m.port > 0, "--listen ", o.listen,
               ": cannot bind (address in use, or not an address of this machine?)");
}

PsServer::~PsServer() {
  if (impl_ && impl_->server) shutdown(0);
}

int PsServer::port() const { return impl_->port; }
ShardCore& PsServer::core() { return *impl_->core; }

void PsServer::shutdown(int64_t grace_ms) {
  if (!impl_->server) return;
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  impl_->server->Wait();
  impl_->server.reset();
}

int serve_until_signal(const ServeOptions& options) {
  // Block the signals in every thread (gRPC's included), then wait for them synchronously here.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  PsServer server(options);
  std::string host;
  int port = 0;
  split_host_port(options.listen, "--listen", &host, &port);
  std::printf("ps shard %s listening on %s:%d\n", options.shard.to_string().c_str(), host.c_str(), server.port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "ps shard %s: %s, shutting down\n", options.shard.to_string().c_str(),
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  server.shutdown(5000);
  return 0;
}

}  // namespace ration::ps
