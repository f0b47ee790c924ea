// validators.h — the command line's checks of numeric flags: each error names the expected form and
// what the number means ("--steps: expected an integer >= 1 (number of optimiser steps), got '0'"),
// instead of CLI11's range messages with 1.8e308 bounds, and nan / inf are refused.
// Owns: integer_at_least, integer_in, number_in. Does not own: the flags themselves (main.cpp, seq_commands.cpp,
//       train_views.cpp).
#pragma once
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace ration::cli {

// Reads `text` as a whole integer (nothing after it); false when it is not one.
inline bool read_integer(const std::string& text, long long& value) {
  size_t pos = 0;
  try {
    value = std::stoll(text, &pos);
  } catch (const std::exception&) {
    return false;
  }
  return pos == text.size();
}

// An integer flag of at least `min`.
inline CLI::Validator integer_at_least(int64_t min, const std::string& meaning) {
  return CLI::Validator(
      [min, meaning](std::string& text) -> std::string {
        long long value = 0;
        if (read_integer(text, value) && value >= min) return "";
        return "expected an integer >= " + std::to_string(min) + " (" + meaning + "), got '" + text + "'";
      },
      "INT>=" + std::to_string(min));
}

// An integer flag in [min, max].
inline CLI::Validator integer_in(int64_t min, int64_t max, const std::string& meaning) {
  return CLI::Validator(
      [min, max, meaning](std::string& text) -> std::string {
        long long value = 0;
        if (read_integer(text, value) && value >= min && value <= max) return "";
        return "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) + " (" + meaning +
               "), got '" + text + "'";
      },
      "INT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

// A finite number in (above, at_most]: `range` says it in words ("> 0 and <= 1048576").
inline CLI::Validator number_in(double above, double at_most, const std::string& range, const std::string& meaning) {
  return CLI::Validator(
      [above, at_most, range, meaning](std::string& text) -> std::string {
        const std::string expected = "expected a number " + range + " (" + meaning + "), got '" + text + "'";
        size_t pos = 0;
        double value = 0;
        try {
          value = std::stod(text, &pos);
        } catch (const std::exception&) {
          return expected;
        }
        if (pos != text.size() || !std::isfinite(value) || value <= above || value > at_most) return expected;
        return "";
      },
      "NUMBER " + range);
}

// The bound on a trace file, in MiB: more than 0, at most 1 TiB.
inline CLI::Validator trace_megabytes() { return number_in(0, 1 << 20, "> 0 and <= 1048576", "MiB of trace"); }

}  // namespace ration::cli
