// launch.cpp — ration_dist_launch: start n local ranks of a program, wait, fail if any rank fails.
//
//   ration_dist_launch -n N [--store tcp|file] [--timeout SECONDS] -- PROGRAM [ARGS...]
//
// Each rank gets RANK, WORLD_SIZE and either MASTER_ADDR=127.0.0.1 + MASTER_PORT=<a port the kernel just
// handed out as free> (tcp, the default) or RATION_STORE_FILE=<fresh temp dir>/store (file). Rank output
// goes to one log per rank, printed when all are done. Robustness rules:
//   * the first rank to fail (non-zero exit or signal) stops the others at once (SIGKILL, by pid): a
//     rank left waiting in a collective would otherwise sit until the collective timeout;
//   * past --timeout (default 60 s) every rank still running is killed and the launch fails;
//   * ranks die with the launcher (PR_SET_PDEATHSIG), so a killed launcher leaves no processes behind;
//   * tcp: if a rank reports the port in use (another process took it between our probe and the
//     store's bind), the whole launch is retried with a new port, up to 3 times.
// Exit status: 0 when every rank exited 0, 1 otherwise, 2 on a usage error.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Args {
  int n = 0;
  std::string store = "tcp";
  int timeout_s = 60;
  std::vector<std::string> command;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "ration_dist_launch: " << why
            << "\nusage: ration_dist_launch -n N [--store tcp|file] [--timeout SECONDS] -- PROGRAM [ARGS...]\n";
  std::exit(2);
}

int parse_positive(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 6 || !std::all_of(text.begin(), text.end(), ::isdigit) || std::stoi(text) < 1) {
    usage(flag + " needs a positive integer; got '" + text + "'");
  }
  return std::stoi(text);
}

Args parse(int argc, char** argv) {
  Args a;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "-n") {
      a.n = parse_positive("-n", value());
    } else if (arg == "--store") {
      a.store = value();
      if (a.store != "tcp" && a.store != "file") usage("--store is tcp or file; got '" + a.store + "'");
    } else if (arg == "--timeout") {
      a.timeout_s = parse_positive("--timeout", value());
    } else {
      usage("unknown argument '" + arg + "'");
    }
  }
  for (; i < argc; ++i) a.command.emplace_back(argv[i]);
  if (a.n < 1) usage("-n N is required");
  if (a.command.empty()) usage("no program after --");
  return a;
}

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back, close).
int probe_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;       // waitpid status once done
  bool killed = false;  // we stopped it
  fs::path log;
};

std::string describe(const Rank& r) {
  if (r.killed) return "killed by the launcher";
  if (WIFEXITED(r.status)) return "exit " + std::to_string(WEXITSTATUS(r.status));
  if (WIFSIGNALED(r.status)) return std::string("signal ") + strsignal(WTERMSIG(r.status));
  return "unknown status";
}

bool ok(const Rank& r) { return !r.killed && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0; }

pid_t spawn(const Args& a, int rank, const std::vector<std::pair<std::string, std::string>>& env, const fs::path& log) {
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // Child. Die with the launcher, even if it is SIGKILLed.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(a.n).c_str(), 1);
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& s : a.command) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "ration_dist_launch: cannot execute %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

enum class Outcome { Passed, Failed, PortTaken };

Outcome launch_once(const Args& a, const fs::path& dir, int attempt) {
  std::vector<std::pair<std::string, std::string>> env;
  std::string where;
  if (a.store == "tcp") {
    const int port = probe_free_port();
    if (port <= 0) {
      std::cerr << "ration_dist_launch: cannot find a free TCP port on 127.0.0.1\n";
      return Outcome::Failed;
    }
    env = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
    where = "tcp 127.0.0.1:" + std::to_string(port);
  } else {
    const fs::path store = dir / ("store." + std::to_string(attempt));
    env = {{"RATION_STORE_FILE", store.string()}};
    where = "file " + store.string();
  }
  std::cout << "ration_dist_launch: " << a.n << " ranks, " << where << ", timeout " << a.timeout_s << " s\n"
            << std::flush;

  std::vector<Rank> ranks(static_cast<size_t>(a.n));
  for (int r = 0; r < a.n; ++r) {
    Rank& rk = ranks[static_cast<size_t>(r)];
    rk.log = dir / ("rank" + std::to_string(r) + "." + std::to_string(attempt) + ".log");
    rk.pid = spawn(a, r, env, rk.log);
    rk.running = rk.pid > 0;
    if (rk.pid < 0) {
      std::cerr << "ration_dist_launch: fork failed: " << std::strerror(errno) << "\n";
      rk.killed = true;
    }
  }
  auto kill_running = [&](const char* why) {
    for (auto& rk : ranks) {
      if (rk.running) {
        ::kill(rk.pid, SIGKILL);
        rk.killed = true;
      }
    }
    if (why) std::cerr << "ration_dist_launch: " << why << "; stopping the remaining ranks\n";
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.timeout_s);
  bool failed = std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.pid < 0; });
  bool timed_out = false;
  if (failed) kill_running("a rank could not be started");
  while (std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; })) {
    bool progressed = false;
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& rk = ranks[i];
      if (!rk.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(rk.pid, &status, WNOHANG);
      if (got == rk.pid) {
        rk.running = false;
        rk.status = status;
        progressed = true;
        if (!rk.killed && !ok(rk) && !failed) {
          failed = true;
          const std::string why = "rank " + std::to_string(i) + " failed (" + describe(rk) + ")";
          kill_running(why.c_str());
        }
      }
    }
    if (!timed_out && std::chrono::steady_clock::now() > deadline) {
      timed_out = failed = true;
      kill_running(("timeout after " + std::to_string(a.timeout_s) + " s").c_str());
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  bool port_taken = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string text = slurp(ranks[i].log);
    std::cout << "---- rank " << i << " (" << describe(ranks[i]) << ") ----\n" << text;
    if (!text.empty() && text.back() != '\n') std::cout << '\n';
    const std::string l = lower(text);
    port_taken = port_taken || l.find("address already in use") != std::string::npos;
  }
  std::cout << std::flush;
  if (!failed) return Outcome::Passed;
  if (a.store == "tcp" && port_taken && !timed_out) return Outcome::PortTaken;
  return Outcome::Failed;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::string tmpl = (fs::temp_directory_path() / "ration-dist-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::cerr << "ration_dist_launch: cannot create a temp directory: " << std::strerror(errno) << "\n";
    return 1;
  }
  const fs::path dir = tmpl;
  Outcome outcome = Outcome::Failed;
  for (int attempt = 0; attempt < 3; ++attempt) {
    outcome = launch_once(a, dir, attempt);
    if (outcome != Outcome::PortTaken) break;
    std::cerr << "ration_dist_launch: the port was taken by another process; retrying with a new one\n";
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (outcome == Outcome::Passed) {
    std::cout << "ration_dist_launch: all " << a.n << " ranks passed\n";
    return 0;
  }
  std::cerr << "ration_dist_launch: FAILED\n";
  return 1;
}
