// paths.cpp — path length checks (see paths.h).
#include "ration/base/paths.h"

#include <algorithm>
#include <climits>

#include "ration/base/check.h"

namespace ration {

void check_path_length(const std::string& path, const std::string& what) {
  RATION_CHECK(path.size() < PATH_MAX, what, " '", path.substr(0, 60), "...': the path is ", path.size(),
               " bytes long; a path may be at most ", PATH_MAX - 1, " bytes");
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const size_t n = end - start;
    RATION_CHECK(n <= NAME_MAX, what, " '", path.substr(0, 60), "...': the name '", path.substr(start, 24), "...' is ", n,
                 " bytes long; a file or folder name may be at most ", NAME_MAX, " bytes");
    start = end + 1;
  }
}

}  // namespace ration
