// test_ps_util.h — helpers for the parameter-server tests: `ration ps serve` as a real child process
// (its port read from the line it prints), and certificates made with the openssl command.
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace ration::testing {

inline std::string ration_binary() { return std::string(RATION_BINARY_DIR) + "/ration"; }

// A `ration ps serve` child process.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }

  // Starts it with `args` after `ps serve`; waits for "listening on HOST:PORT". Fails the test on error.
  void start(const std::vector<std::string>& args) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<std::string> all = {ration_binary(), "ps", "serve"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    ::close(out[0]);
    const size_t colon = line.rfind(':');
    ASSERT_NE(line.find("listening on"), std::string::npos) << "server did not start: '" << line << "'";
    port = std::stoi(line.substr(colon + 1));
  }
  // Sends `sig` and waits; returns the exit status (or 128 + signal).
  int stop(int sig = SIGTERM) {
    if (pid <= 0) return -1;
    ::kill(pid, sig);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  ~ServerProcess() {
    if (pid > 0) stop(SIGKILL);
  }
};

// Runs a shell command; returns its exit status.
inline int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A CA and a server certificate for 127.0.0.1 / localhost signed by it, in `dir` (ca.pem, server.pem,
// server.key); a client certificate signed by the CA (client.pem, client.key); a second, unrelated CA
// (other-ca.pem) and a client certificate it signed (rogue.pem, rogue.key).
inline void make_certificates(const std::string& dir) {
  const std::string q = " >/dev/null 2>&1";
  ASSERT_EQ(shell("cd " + dir + " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
                  "-subj /CN=ration-test-ca" + q), 0);
  ASSERT_EQ(shell("cd " + dir + " && openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem "
                  "-days 2 -subj /CN=other-ca" + q), 0);
  ASSERT_EQ(shell("cd " + dir + " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
                  "-subj /CN=localhost" + q), 0);
  ASSERT_EQ(shell("cd " + dir + " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext && "
                  "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
                  "-extfile san.ext" + q), 0);
  for (const auto& [name, ca] : {std::pair<std::string, std::string>{"client", "ca"}, {"rogue", "other-ca"}}) {
    ASSERT_EQ(shell("cd " + dir + " && openssl req -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name +
                    ".csr -subj /CN=" + name + q), 0);
    ASSERT_EQ(shell("cd " + dir + " && printf 'extendedKeyUsage=clientAuth\\n' > " + name + ".ext && openssl x509 -req -in " +
                    name + ".csr -CA " + ca + ".pem -CAkey " + ca + ".key -CAcreateserial -out " + name +
                    ".pem -days 2 -extfile " + name + ".ext" + q), 0);
  }
}

}  // namespace ration::testing
