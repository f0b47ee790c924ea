// check.h — the project's one error mechanism.
// Owns: ration::Error (user-facing failures), the RATION_CHECK / RATION_ASSERT macros, and how an error
//       is shown: users see the message and its hint; the source location (file:line and the failed
//       condition) is kept on the error and shown only in debug mode (RATION_DEBUG=1 in the environment).
// Does not own: exit codes or printing (cli/main.cpp).
// Rule: user errors throw ration::Error naming the file/flag, field and expected form, with a hint;
//       RATION_ASSERT marks our own bugs (always shown with their location: they are reported to us).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ration {

// True when RATION_DEBUG is set to something other than "" or "0": errors then carry their location.
bool debug_mode();

class Error : public std::runtime_error {
 public:
  // `location` is "file:line, failed: cond" (empty for errors built by hand).
  explicit Error(const std::string& message, const std::string& location = "");
  // The message and hint, without the source location.
  const std::string& message() const { return message_; }

 private:
  std::string message_;
  std::string location_;
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

// One line a user can read for any exception: ration::Error's message (location in debug mode), a
// libtorch error's first line (its C++ stack trace only in debug mode), or what() otherwise.
std::string describe_error(const std::exception& e);

}  // namespace ration

// User-facing check: throws ration::Error(msg); what() adds " [file:line, failed: cond]" in debug mode.
#define RATION_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::ration::detail::fail(__FILE__, __LINE__, #cond, ::ration::detail::str(__VA_ARGS__)); \
  } while (0)

// Internal invariant: a failure is a bug in ration, not in the user's input.
#define RATION_ASSERT(cond, ...)                                                             \
  do {                                                                                       \
    if (!(cond)) ::ration::detail::bug(__FILE__, __LINE__, #cond, ::ration::detail::str(__VA_ARGS__)); \
  } while (0)
