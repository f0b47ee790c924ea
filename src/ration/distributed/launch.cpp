// launch.cpp — `ration launch`: children, prefixed output, signals, first-failure rule (see launch.h).
#include "ration/distributed/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ration/base/check.h"

namespace ration::dist {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_pending_signal = 0;
void remember_signal(int sig) { g_pending_signal = sig; }

// A port the kernel reports free on `addr` right now (the store binds it moments later).
int free_port(const std::string& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  RATION_CHECK(fd >= 0, "ration launch: cannot open a socket to find a free port: ", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  RATION_CHECK(::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) == 1,
               "ration launch: --master-port 0 needs --master-addr to be an IPv4 address of this host; got '", addr,
               "'");
  socklen_t len = sizeof sa;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  ::close(fd);
  RATION_CHECK(ok, "ration launch: cannot bind ", addr, " to find a free port: ", std::strerror(errno));
  return ntohs(sa.sin_port);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + std::string(strsignal(sig)) + ")";
  }
  return "status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// One stream of one rank: bytes read so far, written out a whole line at a time with the prefix.
struct Stream {
  int fd = -1;
  FILE* to = nullptr;
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  Stream out, err;
  std::optional<int> status;  // set once reaped
};

void emit_lines(const Rank& r, Stream& s, bool flush_partial) {
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fprintf(s.to, "[rank %d] %.*s\n", r.rank, static_cast<int>(nl - start), s.pending.data() + start);
  }
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    std::fprintf(s.to, "[rank %d] %s\n", r.rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.to);
}

void spawn(Rank& r, const LaunchOptions& o, int world_size, int port, const std::string& program,
           const std::string& store_file) {
  int out[2], err[2];
  RATION_CHECK(::pipe(out) == 0 && ::pipe(err) == 0, "ration launch: pipe failed: ", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  RATION_CHECK(pid >= 0, "ration launch: fork failed: ", std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the launcher
    if (::getppid() != parent) ::_exit(126);
    ::setpgid(0, 0);  // terminal signals reach the launcher only; it forwards them
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::close(err[0]);
    ::close(err[1]);
    const int local = r.rank - o.node_rank * o.nproc_per_node;
    ::setenv("RANK", std::to_string(r.rank).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
    ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
    ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    if (!store_file.empty()) ::setenv("RATION_STORE_FILE", store_file.c_str(), 1);
    ::setenv("RATION_PS_SERVERS", std::to_string(o.servers).c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    std::fprintf(stderr, "ration launch: cannot execute %s: %s\n", program.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  r.pid = pid;
  r.out = {out[0], stdout, {}};
  r.err = {err[0], stderr, {}};
}

// The launcher's private directory for the job's FileStore (one node); removed when the launch returns.
class RunDirectory {
 public:
  explicit RunDirectory(bool wanted) {
    if (!wanted) return;
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ration-launch-XXXXXX";
    RATION_CHECK(::mkdtemp(pattern.data()) != nullptr, "ration launch: cannot make a directory for the rendezvous ",
                 "store under ", pattern.substr(0, pattern.rfind('/')), " (set TMPDIR to a writable folder): ",
                 std::strerror(errno));
    dir_ = pattern;
  }
  ~RunDirectory() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  std::string store() const { return dir_.empty() ? std::string() : dir_ + "/store"; }

 private:
  std::string dir_;
};

void signal_running(std::vector<Rank>& ranks, int sig) {
  for (auto& r : ranks) {
    if (!r.status) ::kill(r.pid, sig);
  }
}

}  // namespace

int max_ranks_per_node() {
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const long by_memory = pages > 0 && page > 0 ? static_cast<long>((static_cast<double>(pages) * page) / (256.0 * 1024 * 1024)) : 4 * cores;
  return static_cast<int>(std::max(1L, std::min(4 * cores, by_memory)));
}

// Every flag against its rule (errors name the flag).
static void check_options(const LaunchOptions& o) {
  RATION_CHECK(o.nproc_per_node >= 1, "ration launch: -n must be an integer >= 1, got ", o.nproc_per_node);
  RATION_CHECK(o.servers >= 0, "ration launch: --servers must be an integer >= 0 (dedicated parameter servers), got ",
               o.servers);
  const int here = o.nproc_per_node + (o.node_rank == 0 ? o.servers : 0);
  RATION_CHECK(o.oversubscribe || here <= max_ranks_per_node(), "ration launch: -n ", o.nproc_per_node,
               o.servers > 0 && o.node_rank == 0 ? " and --servers " + std::to_string(o.servers) : std::string(),
               o.servers > 0 && o.node_rank == 0 ? " are more processes" : " is more ranks",
               " than this machine runs (at most ", max_ranks_per_node(),
               ": 4 per core, one per 256 MiB of memory); pass --oversubscribe to start them anyway");
  RATION_CHECK(o.nnodes >= 1, "ration launch: --nnodes must be an integer >= 1, got ", o.nnodes);
  RATION_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "ration launch: --node-rank must be in [0, --nnodes) = [0, ",
               o.nnodes, "), got ", o.node_rank);
  RATION_CHECK(o.master_port >= 0 && o.master_port <= 65535,
               "ration launch: --master-port must be a TCP port in [1, 65535] (or 0: pick a free one), got ",
               o.master_port);
  RATION_CHECK(o.master_port != 0 || o.nnodes == 1,
               "ration launch: --master-port 0 (pick a free port) works on one node only; with --nnodes ", o.nnodes,
               " every node must be given the same port");
  RATION_CHECK(!o.command.empty(), "ration launch: nothing to run; usage: ration launch -n N -- train CONFIG.toml ...");
  RATION_CHECK(o.grace_s >= 0, "ration launch: --grace must be >= 0 seconds, got ", o.grace_s);
}

int launch(const LaunchOptions& o) {
  check_options(o);
  std::string program = o.program;
  if (program.empty()) {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    RATION_CHECK(n > 0, "ration launch: cannot find this executable (/proc/self/exe): ", std::strerror(errno));
    program.assign(buf, static_cast<size_t>(n));
  }
  const int port = o.master_port == 0 ? free_port(o.master_addr) : o.master_port;
  // One node: the rendezvous goes through a file in a directory of the launcher's own (mode 0700), so no
  // store listens on the network (a TCPStore binds every interface, unauthenticated). Several nodes need
  // the TCPStore on the master (docs/DISTRIBUTED.md, "What is exposed").
  const RunDirectory run_dir(o.nnodes == 1);
  const int workers = o.nnodes * o.nproc_per_node;
  const int world_size = workers + o.servers;
  const int here = o.nproc_per_node + (o.node_rank == 0 ? o.servers : 0);  // this node's workers, then servers

  struct sigaction sa {};
  sa.sa_handler = remember_signal;
  ::sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  std::vector<Rank> ranks(static_cast<size_t>(here));
  int started = 0;
  for (; started < here && !g_pending_signal; ++started) {  // a signal stops the starting
    ranks[static_cast<size_t>(started)].rank = started < o.nproc_per_node
                                                   ? o.node_rank * o.nproc_per_node + started
                                                   : workers + (started - o.nproc_per_node);
    spawn(ranks[static_cast<size_t>(started)], o, world_size, port, program, run_dir.store());
  }
  ranks.resize(static_cast<size_t>(started));

  std::optional<size_t> first_failure;
  int forwarded = 0;
  Clock::time_point failure_at{}, term_at{};
  enum class Stopping { No, Grace, Terminated, Killed } stopping = Stopping::No;
  for (;;) {
    if (g_pending_signal) {
      forwarded = g_pending_signal;
      g_pending_signal = 0;
      signal_running(ranks, forwarded);
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;
    for (auto& r : ranks) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [r, s] = owners[i];
      char buf[65536];
      const ssize_t n = ::read(s->fd, buf, sizeof buf);
      if (n > 0) {
        s->pending.append(buf, static_cast<size_t>(n));
        emit_lines(*r, *s, false);
      } else if (n == 0 || errno != EINTR) {
        emit_lines(*r, *s, true);
        ::close(s->fd);
        s->fd = -1;
      }
    }
    bool running = false;
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      if (r.status) continue;
      int status = 0;
      const pid_t w = ::waitpid(r.pid, &status, WNOHANG);
      if (w == r.pid) {
        r.status = status;
        if (failed(status) && !first_failure) {
          first_failure = i;
          failure_at = Clock::now();
          if (ranks.size() > 1 && !forwarded) {
            std::fprintf(stderr, "ration launch: rank %d failed (%s); giving the other ranks %.0f s to stop\n",
                         r.rank, describe_status(status).c_str(), o.grace_s);
          }
          stopping = Stopping::Grace;
        }
      } else {
        running = true;
      }
    }
    bool streams_open = false;
    for (auto& r : ranks) streams_open = streams_open || r.out.fd >= 0 || r.err.fd >= 0;
    if (!running && !streams_open) break;
    if (!running && fds.empty()) break;
    const auto now = Clock::now();
    if (stopping == Stopping::Grace && now - failure_at > std::chrono::duration<double>(o.grace_s)) {
      signal_running(ranks, SIGTERM);
      stopping = Stopping::Terminated;
      term_at = now;
    } else if (stopping == Stopping::Terminated && now - term_at > std::chrono::seconds(5)) {
      signal_running(ranks, SIGKILL);
      stopping = Stopping::Killed;
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);

  if (first_failure) {
    const Rank& r = ranks[*first_failure];
    std::fprintf(stderr, "ration launch: rank %d failed (%s)%s\n", r.rank, describe_status(*r.status).c_str(),
                 forwarded ? (" after signal " + std::to_string(forwarded) + " was forwarded").c_str() : "");
    for (const auto& other : ranks) {
      if (&other != &r && failed(*other.status))
        std::fprintf(stderr, "ration launch: rank %d: %s\n", other.rank, describe_status(*other.status).c_str());
    }
    return 1;
  }
  return 0;
}

}  // namespace ration::dist
