#include "ration/train/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ration::train {

Progress::Progress(bool quiet, int64_t every) : quiet_(quiet), tty_(isatty(STDOUT_FILENO) != 0), every_(every) {
  if (every_ <= 0) every_ = 1;
}

void Progress::update(int64_t step, const std::string& line, bool force) {
  if (quiet_) return;
  if (tty_) {
    std::printf("\r\033[K%s", line.c_str());
    std::fflush(stdout);
    dirty_ = true;
  } else if (force || step % every_ == 0) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void Progress::note(const std::string& line) {
  if (quiet_) return;
  if (tty_ && dirty_) std::printf("\r\033[K");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  dirty_ = false;
}

void Progress::finish() {
  if (quiet_ || !tty_ || !dirty_) return;
  std::printf("\n");
  std::fflush(stdout);
  dirty_ = false;
}

std::string format_duration(double seconds) {
  char buf[32];
  const long s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

}  // namespace ration::train
