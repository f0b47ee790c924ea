// check.h — the project's one error mechanism.
// Owns: ration::Error (user-facing failures) and the RATION_CHECK / RATION_ASSERT macros.
// Rule: user errors throw ration::Error with file, line and a hint; RATION_ASSERT marks our own bugs.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ration {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void str_into(std::ostringstream&) {}
template <typename T, typename... Rest>
void str_into(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  str_into(os, rest...);
}
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  str_into(os, args...);
  return os.str();
}
[[noreturn]] void fail(const char* file, int line, const char* cond, const std::string& msg);
[[noreturn]] void bug(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace ration

// User-facing check: throws ration::Error("msg (file:line, failed: cond)").
#define RATION_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::ration::detail::fail(__FILE__, __LINE__, #cond, ::ration::detail::str(__VA_ARGS__)); \
  } while (0)

// Internal invariant: a failure is a bug in ration, not in the user's input.
#define RATION_ASSERT(cond, ...)                                                             \
  do {                                                                                       \
    if (!(cond)) ::ration::detail::bug(__FILE__, __LINE__, #cond, ::ration::detail::str(__VA_ARGS__)); \
  } while (0)
