// Parameter server over gRPC on real loopback sockets: remote shards give exactly what embedded shards
// give; request validation (unknown table, wrong dim, too many ids) with clear errors; a server that is
// gone -> retries, then an error naming the endpoint; shard order checked; who may call (non-loopback
// needs a token or mutual TLS — server-only TLS is refused there —, missing/wrong token refused and
// counted, TLS without the right CA or client certificate cannot connect, the token never goes in clear);
// `ration ps serve` exits cleanly on SIGTERM and restores its snapshot on restart; a restarted server is
// noticed by its clients (incarnation); a snapshot directory serves one server and its snapshots know
// their shard; a trainer that checkpoints refuses a shard that cannot snapshot, at connect.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ration/base/check.h"
#include "ration/base/net.h"
#include "ration/ps/client.h"
#include "ration/ps/server.h"
#include "ration/ps/snapshot.h"
#include "test_ps_util.h"
#include "test_util.h"

namespace ration::ps {
namespace {
using ration::testing::error_of;
using ration::testing::TempDir;

TableOptions table(const std::string& name, int64_t dim) {
  TableOptions o;
  o.name = name;
  o.dim = dim;
  o.seed = 3;
  o.optimizer.kind = OptimizerKind::Adagrad;
  o.optimizer.lr = 0.1f;
  return o;
}

ServeOptions serve(uint32_t index, uint32_t count) {
  ServeOptions o;
  o.listen = "127.0.0.1:0";
  o.shard = {index, count};
  return o;
}

ClientOptions remote(std::vector<std::string> endpoints) {
  ClientOptions c;
  c.endpoints = std::move(endpoints);
  c.retries = 2;
  c.backoff_ms = 10;
  c.timeout_ms = 3000;
  return c;
}

std::string ep(const PsServer& s) { return "127.0.0.1:" + std::to_string(s.port()); }

// A few steps of pull + push with duplicate ids, identical for any client.
std::vector<float> exercise(PsClient& c) {
  c.declare_tables({table("user", 4), table("movie", 8)});
  std::vector<int64_t> ids = {5, 17, 5, 123456789012345LL, -3, 17, 99};
  std::vector<float> last;
  for (int step = 0; step < 3; ++step) {
    PulledRows p = c.pull("movie", ids.data(), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(p.unique_ids.size(), 5u);  // duplicates fetched once
    at::Tensor g = p.rows * 0.5 + 0.1;
    c.push("movie", p.unique_ids.data(), static_cast<int64_t>(p.unique_ids.size()), g.data_ptr<float>(), 8, step);
    last.assign(p.rows.data_ptr<float>(), p.rows.data_ptr<float>() + p.rows.numel());
  }
  return last;
}

TEST(PsServer, RemoteShardsMatchEmbeddedExactly) {
  PsServer s0(serve(0, 2)), s1(serve(1, 2));
  PsClient r(remote({ep(s0), ep(s1)}));
  r.check_health();
  ClientOptions e;
  e.embedded_shards = 2;
  PsClient emb(e);
  EXPECT_EQ(exercise(r), exercise(emb));
  // Both shards received ids (the stable hash spreads them) and stats add up.
  int64_t rows = 0;
  for (const auto& st : r.stats()) {
    EXPECT_GT(st.stats.rows(), 0);
    rows += st.stats.rows();
  }
  EXPECT_EQ(rows, 5);
}

TEST(PsServer, BadRequestsGetClearErrors) {
  ServeOptions o = serve(0, 1);
  o.limits.max_ids = 100;
  PsServer s(o);
  ClientOptions co = remote({ep(s)});
  PsClient c(co);
  c.declare_tables({table("user", 4)});
  std::vector<int64_t> ids = {1, 2, 3};
  const at::Tensor before = c.pull("user", ids.data(), 3).rows.clone();  // rows 1, 2, 3 exist now
  EXPECT_NE(error_of([&] { c.pull("nosuch", ids.data(), 3); }).find("unknown table 'nosuch' (declared: user)"),
            std::string::npos);
  std::vector<float> g(3 * 8, 0.f);
  std::vector<uint64_t> uids = {1, 2, 3};
  EXPECT_NE(error_of([&] { c.push("user", uids.data(), 3, g.data(), 8, 0); }).find("dims differ"), std::string::npos);
  std::vector<float> nan_grad(3 * 4, 0.5f);
  nan_grad[4 + 2] = std::nanf("");  // id 2, element 2
  const std::string nan_msg = error_of([&] { c.push("user", uids.data(), 3, nan_grad.data(), 4, 0); });
  EXPECT_NE(nan_msg.find("the gradient of id 2 holds nan (element 2); non-finite gradients are refused"), std::string::npos)
      << nan_msg;
  std::vector<int64_t> many(500);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int64_t>(i);
  const std::string too_many = error_of([&] { c.pull("user", many.data(), 500); });
  EXPECT_NE(too_many.find("exceeds the limit of 100 ids"), std::string::npos) << too_many;
  EXPECT_NE(too_many.find("(this server's --max-ids); set ps.max_ids_per_request <= 100 on the trainer"),
            std::string::npos)
      << too_many;
  // Nothing lost and nothing half-applied: the refused push changed no row, the refused pull created none.
  EXPECT_TRUE(at::equal(before, c.pull("user", ids.data(), 3).rows));
  EXPECT_EQ(c.stats().at(0).stats.rows(), 3);
  // A client that splits its requests below the limit gets through.
  co.max_ids_per_request = 64;
  PsClient split(co);
  EXPECT_EQ(split.pull("user", many.data(), 500).rows.size(0), 500);
  // Redeclaring a table with another dim is refused.
  EXPECT_NE(error_of([&] { c.declare_tables({table("user", 16)}); }).find("exists with dim 4"), std::string::npos);
}

TEST(PsServer, VanishedServerIsRetriedThenNamed) {
  std::string endpoint;
  {
    PsServer s(serve(0, 1));
    endpoint = ep(s);
  }  // gone
  PsClient c(remote({endpoint}));
  std::vector<int64_t> ids = {1};
  const std::string msg = error_of([&] { c.pull("user", ids.data(), 1); });
  EXPECT_NE(msg.find("at " + endpoint), std::string::npos) << msg;
  EXPECT_NE(msg.find("failed after 2 attempts"), std::string::npos) << msg;
}

TEST(PsServer, EndpointsOutOfShardOrderAreAnError) {
  PsServer s0(serve(0, 2)), s1(serve(1, 2));
  PsClient c(remote({ep(s1), ep(s0)}));
  EXPECT_NE(error_of([&] { c.check_health(); }).find("serves shard 1/2 but the client expects shard 0/2"),
            std::string::npos);
}

TEST(PsServer, NonLoopbackNeedsTokenOrTls) {
  ServeOptions o = serve(0, 1);
  o.listen = "0.0.0.0:0";
  EXPECT_NE(error_of([&] { PsServer s(o); }).find("is not a loopback address"), std::string::npos);
  TempDir dir("ps-token");
  o.auth_token_file = dir.write_secret("short", "abc\n");
  EXPECT_NE(error_of([&] { PsServer s(o); }).find("at least 16 characters"), std::string::npos);
}

// A token file others can read is refused, naming the file and its mode; the owner-only one is accepted.
TEST(PsServer, TokenFileReadableByOthersIsRefused) {
  TempDir dir("ps-token-mode");
  const std::string shared = dir.write("token", "s3cret-token-0123456789\n");  // 0644 under the usual umask
  std::filesystem::permissions(shared, std::filesystem::perms::group_read | std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  const std::string msg = error_of([&] { read_token_file(shared); });
  EXPECT_NE(msg.find("readable or writable by other users (mode 644)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chmod 600"), std::string::npos) << msg;
  EXPECT_EQ(read_token_file(dir.write_secret("mine", "s3cret-token-0123456789\n")), "s3cret-token-0123456789");
}

// Loopback is decided by parsing the address, not by its first characters.
TEST(PsServer, LoopbackIsAnAddressNotAPrefix) {
  for (const char* yes : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "::ffff:127.0.0.1"})
    EXPECT_TRUE(is_loopback_host(yes)) << yes;
  for (const char* no : {"127.evil.example", "127.0.0.1.evil.example", "0.0.0.0", "10.0.0.1", "::", "128.0.0.1",
                         "::ffff:10.0.0.1", "", "localhost.example"})
    EXPECT_FALSE(is_loopback_host(no)) << no;
  ServeOptions o = serve(0, 1);
  o.listen = "127.evil.example:0";
  EXPECT_NE(error_of([&] { PsServer s(o); }).find("is not a loopback address"), std::string::npos);
}

TEST(PsServer, MissingOrWrongTokenIsRefusedAndCounted) {
  TempDir dir("ps-auth");
  ServeOptions o = serve(0, 1);
  o.listen = "0.0.0.0:0";  // all interfaces: allowed because a token is required
  o.auth_token_file = dir.write_secret("token", "s3cret-token-0123456789\n");
  PsServer s(o);
  ClientOptions co = remote({ep(s)});
  {
    PsClient none(co);
    EXPECT_NE(error_of([&] { none.check_health(); }).find("UNAUTHENTICATED"), std::string::npos);
  }
  {
    co.auth_token = "s3cret-token-0123456780";
    PsClient wrong(co);
    EXPECT_NE(error_of([&] { wrong.declare_tables({table("user", 4)}); }).find("UNAUTHENTICATED"), std::string::npos);
  }
  co.auth_token = "s3cret-token-0123456789";
  PsClient right(co);
  right.check_health();
  right.declare_tables({table("user", 4)});
  EXPECT_EQ(right.stats()[0].stats.auth_failures(), 2);
  EXPECT_EQ(s.core().auth_failures(), 2);
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "abcd"));
}

TEST(PsServer, TlsClientNeedsTheRightCa) {
  TempDir dir("ps-tls");
  ration::testing::make_certificates(dir.path.string());
  ServeOptions o = serve(0, 1);
  o.tls_cert = (dir.path / "server.pem").string();
  o.tls_key = (dir.path / "server.key").string();
  PsServer s(o);
  ClientOptions co = remote({ep(s)});
  co.timeout_ms = 1500;
  {
    PsClient plain(co);  // no TLS at all
    EXPECT_NE(error_of([&] { plain.check_health(); }).find("failed after"), std::string::npos);
  }
  {
    co.tls_ca = (dir.path / "other-ca.pem").string();  // TLS, but trusting another CA
    PsClient other(co);
    EXPECT_NE(error_of([&] { other.check_health(); }).find("failed after"), std::string::npos);
  }
  co.tls_ca = (dir.path / "ca.pem").string();
  PsClient ok(co);
  ok.check_health();
  ok.declare_tables({table("user", 4)});
  std::vector<int64_t> ids = {1, 2};
  EXPECT_EQ(ok.pull("user", ids.data(), 2).rows.size(0), 2);
}

// Item 1 (issue 42): off loopback, clients must authenticate. Server-only TLS is refused (anyone who
// trusts the CA could push); mutual TLS admits only clients with a certificate the CA signed; a token
// over server TLS admits only clients sending it. Over real sockets with generated certificates.
TEST(PsServer, NonLoopbackServerOnlyTlsIsRefusedMutualTlsOrATokenAuthenticates) {
  TempDir dir("ps-mtls");
  ration::testing::make_certificates(dir.path.string());
  const auto pem = [&](const char* name) { return (dir.path / name).string(); };
  ServeOptions o = serve(0, 1);
  o.listen = "0.0.0.0:0";
  o.tls_cert = pem("server.pem");
  o.tls_key = pem("server.key");
  const std::string msg = error_of([&] { PsServer s(o); });
  EXPECT_NE(msg.find("do not authenticate clients"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--tls-ca"), std::string::npos) << msg;
  EXPECT_EQ(ration::testing::shell(ration::testing::ration_binary() + " ps serve --listen 0.0.0.0:0 --tls-cert " +
                                   pem("server.pem") + " --tls-key " + pem("server.key") +
                                   " 2>&1 | grep -q 'do not authenticate clients'"),
            0);
  {
    ServeOptions m = o;  // mutual TLS
    m.tls_ca = pem("ca.pem");
    PsServer s(m);
    ClientOptions co = remote({ep(s)});
    co.timeout_ms = 1500;
    co.tls_ca = pem("ca.pem");
    {
      PsClient no_cert(co);  // trusts the server, has no certificate of its own
      EXPECT_NE(error_of([&] { no_cert.check_health(); }).find("failed after"), std::string::npos);
    }
    {
      co.tls_cert = pem("rogue.pem");  // a certificate another CA signed
      co.tls_key = pem("rogue.key");
      PsClient rogue(co);
      EXPECT_NE(error_of([&] { rogue.check_health(); }).find("failed after"), std::string::npos);
    }
    co.tls_cert = pem("client.pem");
    co.tls_key = pem("client.key");
    PsClient ok(co);
    ok.check_health();
    ok.declare_tables({table("user", 4)});
    std::vector<int64_t> ids = {1, 2, 3};
    EXPECT_EQ(ok.pull("user", ids.data(), 3).rows.size(0), 3);
  }
  ServeOptions t = o;  // server TLS and a token
  t.auth_token_file = dir.write_secret("token", "s3cret-token-0123456789\n");
  PsServer s(t);
  ClientOptions co = remote({ep(s)});
  co.tls_ca = pem("ca.pem");
  {
    PsClient no_token(co);
    EXPECT_NE(error_of([&] { no_token.check_health(); }).find("UNAUTHENTICATED"), std::string::npos);
  }
  co.auth_token = "s3cret-token-0123456789";
  PsClient ok(co);
  ok.check_health();
  EXPECT_EQ(s.core().auth_failures(), 1);
}

// Item 3 (issue 42): the token goes only over TLS or to a loopback address.
TEST(PsServer, TokenIsNeverSentInClearOffLoopback) {
  ClientOptions co = remote({"10.0.0.1:7070"});
  co.auth_token = "s3cret-token-0123456789";
  const std::string msg = error_of([&] { PsClient c(co); });
  EXPECT_NE(msg.find("ps.endpoints: 10.0.0.1:7070 is not a loopback address and TLS is off"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ps.tls_ca"), std::string::npos) << msg;
  co.endpoints = {"127.0.0.1:7070"};
  PsClient loopback(co);  // allowed: the token stays on this machine
  co.endpoints = {"10.0.0.1:7070"};
  co.tls_ca = "ca.pem";
  EXPECT_NE(error_of([&] { PsClient c(co); }).find("ps.tls_ca 'ca.pem' cannot be read"), std::string::npos);
}

// Item 8 (issue 42): a server killed and restarted (here from an older snapshot, on the same port, inside
// the client's retry window) is noticed by the client on its next call, which fails naming the shard and
// the restart; the refused push changes nothing on the new server. A new client works with it.
TEST(PsServer, RestartedServerStopsItsClientsNamingTheShard) {
  TempDir dir("ps-restart");
  const std::string snap = (dir.path / "snap").string();
  ServeOptions o = serve(0, 1);
  o.snapshot_dir = snap;
  auto server = std::make_unique<PsServer>(o);
  const int port = server->port();
  const uint64_t first = server->core().incarnation();
  ClientOptions co = remote({ep(*server)});
  co.retries = 8;
  PsClient c(co);
  c.check_health();
  c.declare_tables({table("user", 4)});
  std::vector<uint64_t> ids = {1, 2, 3};
  std::vector<float> g(12, 0.5f);
  c.push("user", ids.data(), 3, g.data(), 4, 1);
  c.snapshot(1);
  c.push("user", ids.data(), 3, g.data(), 4, 2);  // lost with the server
  server.reset();
  o.listen = "127.0.0.1:" + std::to_string(port);
  server = std::make_unique<PsServer>(o);  // restores v1
  EXPECT_NE(server->core().incarnation(), first);
  std::vector<float> before(12);
  server->core().store().table("user").pull(ids.data(), 3, before.data());
  const std::string msg = error_of([&] { c.push("user", ids.data(), 3, g.data(), 4, 3); });
  EXPECT_NE(msg.find("parameter server shard 0/1 at 127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("FAILED_PRECONDITION: shard 0/1 restarted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the rows of snapshot v1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
  std::vector<float> after(12);
  server->core().store().table("user").pull(ids.data(), 3, after.data());
  EXPECT_EQ(before, after);  // the refused push was not applied
  EXPECT_NE(error_of([&] { c.check_health(); }).find("restarted"), std::string::npos);
  PsClient fresh(remote({ep(*server)}));
  fresh.check_health();
  fresh.push("user", ids.data(), 3, g.data(), 4, 3);
}

// Item 6 (issue 42): one server per snapshot directory (a lock naming the holder), and a snapshot records
// the shard and tables that wrote it: another shard's, or another model's, is refused on restore.
TEST(PsServer, SnapshotDirectoryIsLockedAndSnapshotsKnowTheirShard) {
  TempDir dir("ps-snapid");
  const std::string snap = (dir.path / "snap").string();
  ServeOptions a = serve(0, 2);
  a.snapshot_dir = snap;
  {
    PsServer first(a);
    ServeOptions b = serve(1, 2);
    b.snapshot_dir = snap;
    const std::string msg = error_of([&] { PsServer second(b); });
    EXPECT_NE(msg.find("--snapshot-dir '" + snap + "' is in use by another server (pid " + std::to_string(::getpid()) +
                       ", shard 0/2)"),
              std::string::npos)
        << msg;
    wire::DeclareTablesRequest q;
    *q.add_tables() = spec_from_table_options(table("user", 4));
    wire::DeclareTablesResponse r;
    ASSERT_TRUE(first.core().declare_tables(q, &r).ok());
    wire::SnapshotResponse sr;
    wire::SnapshotRequest sq;
    sq.set_version(5);
    ASSERT_TRUE(first.core().snapshot(sq, &sr).ok());
  }
  ServeOptions other = serve(1, 3);
  other.snapshot_dir = snap;
  const std::string msg = error_of([&] { PsServer s(other); });
  EXPECT_NE(msg.find("snapshot " + snap + "/v5 was written by shard 0/2, but this is shard 1/3"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("each shard needs its own snapshot directory"), std::string::npos) << msg;
  PsServer same(a);  // its own shard restores
  EXPECT_EQ(same.core().store().table_names(), std::vector<std::string>{"user"});
  wire::DeclareTablesRequest q;
  *q.add_tables() = spec_from_table_options(table("movie", 8));
  wire::DeclareTablesResponse r;
  ASSERT_TRUE(same.core().declare_tables(q, &r).ok());
  wire::RestoreRequest rq;
  rq.set_version(5);
  wire::RestoreResponse rr;
  const grpc::Status st = same.core().restore(rq, &rr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("has no table 'movie', which this shard's client declared"), std::string::npos)
      << st.error_message();
}

// Item 16 (issue 42): a shard that cannot snapshot is found when the trainer connects, not at its final
// checkpoint: Health says so, and a client that checkpoints refuses it naming the endpoint; a snapshot
// directory that is a file stops the server at start.
TEST(PsServer, CheckpointingClientRefusesAShardThatCannotSnapshotAtConnect) {
  PsServer s(serve(0, 1));
  ClientOptions co = remote({ep(s)});
  co.need_snapshots = true;
  PsClient c(co);
  const std::string msg = error_of([&] { c.check_health(); });
  EXPECT_NE(msg.find("parameter server shard 0/1 at " + ep(s) + " cannot snapshot (it was started without "
                     "--snapshot-dir)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("train.checkpoint_dir"), std::string::npos) << msg;
  co.need_snapshots = false;
  PsClient plain(co);
  plain.check_health();
  TempDir dir("ps-snapfile");
  ServeOptions f = serve(0, 1);
  f.snapshot_dir = dir.write("afile", "x");
  EXPECT_NE(error_of([&] { PsServer bad(f); }).find("--snapshot-dir '" + f.snapshot_dir + "' is a file; expected a directory"),
            std::string::npos);
  f.snapshot_dir = (dir.path / "fine").string();
  PsServer good(f);
  ClientOptions gc = remote({ep(good)});
  gc.need_snapshots = true;
  PsClient ok(gc);
  ok.check_health();
}

// The same through `ration train`: a ctr run with checkpoints against a server without --snapshot-dir
// fails before its first step, naming the server.
TEST(PsServer, TrainerWithCheckpointsFailsBeforeTheFirstStepOnAShardThatCannotSnapshot) {
  TempDir dir("ps-train-nosnap");
  ration::testing::ServerProcess p;
  p.start({"--listen", "127.0.0.1:0", "--shard", "0/1"});
  const std::string out = (dir.path / "out.txt").string();
  const int rc = ration::testing::shell(
      ration::testing::ration_binary() + " train " + std::string(RATION_SOURCE_DIR) + "/configs/ctr.toml --set ps.endpoints=" +
      p.endpoint() + " --set train.checkpoint_dir=" + (dir.path / "ckpt").string() + " --steps 3 > " + out + " 2>&1");
  const std::string text = ration::testing::read_file(out);
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("parameter server shard 0/1 at " + p.endpoint() + " cannot snapshot"), std::string::npos) << text;
  EXPECT_EQ(p.stop(SIGTERM), 0);  // the server saw no step's push: it still serves and stops cleanly
  std::error_code ec;
  int64_t checkpoints = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path / "ckpt", ec))
    checkpoints += e.path().filename().string().rfind("ckpt-", 0) == 0;
  EXPECT_EQ(checkpoints, 0);
}

TEST(PsServer, ServeProcessStopsOnSigtermAndRestoresItsSnapshot) {
  TempDir dir("ps-serve");
  const std::string snap = (dir.path / "snap").string();
  std::vector<float> before;
  {
    ration::testing::ServerProcess p;
    p.start({"--listen", "127.0.0.1:0", "--shard", "0/1", "--snapshot-dir", snap});
    PsClient c(remote({p.endpoint()}));
    before = exercise(c);
    c.snapshot(3);
    EXPECT_EQ(p.stop(SIGTERM), 0);
  }
  ration::testing::ServerProcess p;
  p.start({"--listen", "127.0.0.1:0", "--shard", "0/1", "--snapshot-dir", snap});
  PsClient c(remote({p.endpoint()}));
  EXPECT_EQ(c.stats()[0].stats.rows(), 5);
  EXPECT_EQ(c.stats()[0].stats.snapshot_version(), 3);
  c.restore(3);
  EXPECT_NE(error_of([&] { c.restore(4); }).find("v4 does not exist"), std::string::npos);
  // The CLI refuses a non-loopback address without credentials, with the reason.
  EXPECT_EQ(ration::testing::shell(ration::testing::ration_binary() +
                                   " ps serve --listen 0.0.0.0:0 2>&1 | grep -q 'not a loopback address'"),
            0);
}

}  // namespace
}  // namespace ration::ps
