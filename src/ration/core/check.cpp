#include "ration/core/check.h"

namespace ration::detail {

void fail(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(str(msg, " [", file, ":", line, ", failed: ", cond, "]"));
}

void bug(const char* file, int line, const char* cond, const std::string& msg) {
  throw std::logic_error(str("internal error in ration (please report): ", msg, " [", file, ":", line,
                             ", failed: ", cond, "]"));
}

}  // namespace ration::detail
