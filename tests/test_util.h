// test_util.h — helpers shared by the test files: a scratch directory and error-message assertions.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "ration/base/check.h"

namespace ration::testing {

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() / ("ration-test-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  // Writes `text` to DIR/name and returns the full path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
  // The same, readable by its owner only (a token file).
  std::string write_secret(const std::string& name, const std::string& text) const {
    const std::string p = write(name, text);
    std::filesystem::permissions(p, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::replace);
    return p;
  }
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The message of the ration::Error `fn` throws ("" if it throws none).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// `fn` must throw ration::Error whose message contains every needle.
inline void expect_error_containing(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  const std::string msg = error_of(fn);
  if (msg.empty()) {
    ADD_FAILURE() << "expected ration::Error";
    return;
  }
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg << "\n  lacks: " << n;
}

inline void expect_error_containing(const std::function<void()>& fn, const char* needle) {
  expect_error_containing(fn, std::vector<std::string>{needle});
}

}  // namespace ration::testing
