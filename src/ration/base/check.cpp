// check.cpp — ration::Error and the check macros' failure paths (see check.h).
#include "ration/base/check.h"

#include <cstdlib>
#include <cstring>

namespace ration {
namespace {

std::string shown(const std::string& message, const std::string& location) {
  if (location.empty() || !debug_mode()) return message;
  return message + " [" + location + "]";
}

// The source path relative to the repository ("src/ration/…"), not the build machine's absolute path.
const char* short_path(const char* file) {
  const char* p = std::strstr(file, "src/ration/");
  return p ? p : file;
}

}  // namespace

bool debug_mode() {
  const char* v = std::getenv("RATION_DEBUG");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

Error::Error(const std::string& message, const std::string& location)
    : std::runtime_error(shown(message, location)), message_(message), location_(location) {}

std::string describe_error(const std::exception& e) {
  if (const auto* ours = dynamic_cast<const Error*>(&e)) return ours->what();
  std::string what = e.what();
  if (debug_mode()) return what;
  // libtorch (c10::Error) appends "Exception raised from … frame #0: …": keep the first line.
  const auto cut = what.find('\n');
  if (cut != std::string::npos) what = what.substr(0, cut) + " (RATION_DEBUG=1 shows the full trace)";
  return what;
}

namespace detail {

void fail(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(msg, str(short_path(file), ":", line, ", failed: ", cond));
}

void bug(const char* file, int line, const char* cond, const std::string& msg) {
  throw std::logic_error(str("internal error in ration (please report): ", msg, " [", short_path(file), ":", line,
                             ", failed: ", cond, "]"));
}

}  // namespace detail
}  // namespace ration
