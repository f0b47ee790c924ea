// server.h — `ration ps serve`: one shard (ShardCore) behind gRPC, with who-may-call rules.
// Owns: ServeOptions (and their validation: loopback by default; any other address needs clients to
//       authenticate — a token, or mutual TLS (--tls-ca); server-only TLS encrypts but lets anyone in),
//       the incarnation check (every response names the server's incarnation; a call that expects another
//       is refused, so a client notices a restarted server), the snapshot directory's lock, the gRPC service (authorisation of every call by a bearer token in call metadata,
//       compared in constant time, failures counted), TLS server credentials, graceful shutdown; the
//       who-may-call rules every ps server shares (ServeSecurity: check_serve_security,
//       server_credentials, call_authorized — the online server, serving/online_server.h, uses them too).
// Does not own: request validation or storage (ps/shard.h), the client (ps/client.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ration/ps/evict.h"
#include "ration/ps/shard.h"

namespace grpc {
class ServerContext;
class ServerCredentials;
}  // namespace grpc

namespace ration::ps {

// Who may call a served endpoint: a bearer token (file, first line) and/or TLS (certificate and key;
// with a CA, client certificates signed by it are required).
struct ServeSecurity {
  std::string auth_token_file, tls_cert, tls_key, tls_ca;
};
// Validates `listen` (HOST:PORT) against the rule: loopback by default; any other address needs clients
// to authenticate: a token (--auth-token-file) or client certificates (--tls-ca, mutual TLS). TLS with
// only a server certificate is refused there: it encrypts, but anyone who trusts the CA may call.
// Returns the token ("" when none). Errors name the flags.
std::string check_serve_security(const std::string& listen, const ServeSecurity& security);
// Insecure credentials, or TLS ones from the PEM files (errors name the flag).
std::shared_ptr<grpc::ServerCredentials> server_credentials(const ServeSecurity& security);
// True when `token` is empty or the call carries metadata "authorization: Bearer <token>" (constant time).
bool call_authorized(const grpc::ServerContext& context, const std::string& token);

// Call metadata of the incarnation check (proto/ps.proto, HealthResponse.incarnation): the server's
// incarnation on every response, and the one a client expects on its calls, both in hex.
inline constexpr const char* kIncarnationKey = "ration-ps-incarnation";
inline constexpr const char* kExpectIncarnationKey = "ration-ps-expect-incarnation";
std::string incarnation_hex(uint64_t incarnation);
// What a client is told when the server it talks to restarted (it expected `was`, the server is `now`).
std::string restarted_message(const std::string& shard, uint64_t was, uint64_t now, int64_t snapshot_version);

struct ServeOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  ShardId shard;
  std::string snapshot_dir;             // empty: no Snapshot/Restore (Health says so; a checkpointing trainer refuses it)
  std::string auth_token_file;          // file holding the shared token (first line)
  std::string tls_cert, tls_key;        // PEM files: serve TLS
  std::string tls_ca;                   // PEM: also require and verify client certificates
  ShardLimits limits;
  EvictOptions evict;                   // disabling (--evict ...); policy none: off
  ServeSecurity security() const { return {auth_token_file, tls_cert, tls_key, tls_ca}; }
};

// Splits "HOST:PORT" (or "[v6]:PORT"); errors name `where`.
void split_host_port(const std::string& address, const std::string& where, std::string* host, int* port);
// Reads a token file (first line, trimmed; at least 16 characters). Errors name the file.
std::string read_token_file(const std::string& path);
// Constant-time equality (time depends only on the lengths' maximum).
bool constant_time_equal(const std::string& a, const std::string& b);

class PsServer {
 public:
  // Validates options (errors name the flag), restores the latest snapshot if the directory has one,
  // binds and starts serving. Throws if the address cannot be bound.
  explicit PsServer(ServeOptions options);
  ~PsServer();
  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;

  int port() const;  // the bound port
  ShardCore& core();
  // Stops accepting calls, lets running calls finish (up to `grace_ms`), returns.
  void shutdown(int64_t grace_ms = 5000);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs a server until SIGTERM or SIGINT, then shuts it down gracefully. Prints "listening on HOST:PORT"
// (with the real port) to stdout once serving. Returns the process exit code.
int serve_until_signal(const ServeOptions& options);

}  // namespace ration::ps
