// signals.h — SIGINT/SIGTERM during training: stop after the current step, save, report, exit 130/143.
// Owns: installing and restoring the two handlers, the "stop requested" state and the second-signal rule
//       (a second signal ends the process at once with 128 + signal, which is safe for the checkpoint
//       directory because every save publishes by rename). Does not own: what the trainer does when asked
//       to stop (train/trainer.cpp), or exit codes of other commands (cli/main.cpp).
#pragma once

namespace ration::train {

// While one lives, SIGINT and SIGTERM ask the run to stop instead of killing it. Not nestable across
// threads; one per training run.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // The first signal received since the scope began (SIGINT or SIGTERM), or 0.
  static int requested();
  // "SIGINT" / "SIGTERM" / "signal N".
  static const char* name(int signal);
  // The process exit status for a run stopped by `signal`: 128 + signal (130 for SIGINT, 143 for SIGTERM).
  static int exit_status(int signal) { return 128 + signal; }
};

}  // namespace ration::train
