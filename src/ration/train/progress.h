// progress.h — the progress line of long work: redrawn in place on a terminal, one line per
// `every` updates when stdout is a file or pipe, nothing in --json mode.
#pragma once
#include <cstdint>
#include <string>

namespace ration::train {

class Progress {
 public:
  Progress(bool quiet, int64_t every);
  // Show `line` for step `step` (redraws on a TTY; on a pipe prints when step % every == 0 or `force`).
  void update(int64_t step, const std::string& line, bool force = false);
  // A permanent line (evaluation results, checkpoint notices).
  void note(const std::string& line);
  void finish();

 private:
  bool quiet_;
  bool tty_;
  int64_t every_;
  bool dirty_ = false;
};

std::string format_duration(double seconds);

}  // namespace ration::train
