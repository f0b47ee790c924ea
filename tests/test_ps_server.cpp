// Parameter server over gRPC on real loopback sockets: remote shards give exactly what embedded shards
// give; request validation (unknown table, wrong dim, too many ids) with clear errors; a server that is
// gone -> retries, then an error naming the endpoint; shard order checked; who may call (non-loopback
// needs a token or TLS, missing/wrong token refused and counted, TLS without the right CA cannot
// connect); `ration ps serve` exits cleanly on SIGTERM and restores its snapshot on restart.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ration/base/check.h"
#include "ration/base/net.h"
#include "ration/ps/client.h"
#include "ration/ps/server.h"
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
