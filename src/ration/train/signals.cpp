// signals.cpp — the interrupt handlers of a training run (see signals.h).
#include "ration/train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace ration::train {
namespace {

std::atomic<int> g_requested{0};
struct sigaction g_previous_int, g_previous_term;

void write_stderr(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Async-signal-safe: an atomic store, write(2) and _exit(2) only.
void on_signal(int signal) {
  int none = 0;
  if (g_requested.compare_exchange_strong(none, signal)) {
    write_stderr(signal == SIGINT ? "\nration: SIGINT: finishing this step, then saving a checkpoint and the report "
                                    "(press Ctrl-C again to stop at once)\n"
                                  : "\nration: SIGTERM: finishing this step, then saving a checkpoint and the "
                                    "report (a second signal stops at once)\n");
    return;
  }
  write_stderr("\nration: second signal: stopping now (the last published checkpoint stays valid)\n");
  ::_exit(128 + signal);
}

}  // namespace

InterruptScope::InterruptScope() {
  g_requested.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = &on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a write or read in progress continues rather than failing with EINTR
  ::sigaction(SIGINT, &sa, &g_previous_int);
  ::sigaction(SIGTERM, &sa, &g_previous_term);
}

InterruptScope::~InterruptScope() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
}

int InterruptScope::requested() { return g_requested.load(); }

const char* InterruptScope::name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal";
}

}  // namespace ration::train
