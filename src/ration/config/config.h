// config.h — typed, validated access to a TOML run configuration.
// Owns: parsing CONFIG.toml plus `--set section.key=value` overrides into a flat "section.key" table,
//       typed getters with defaults, and the unknown-key check. Every error names the file, the key and
//       the expected form. Sections: [model] [data] [optim] [train] [memory] [offload] (see configs/*.toml).
// Does not own: what any key means — each layer reads its own keys (models/ the [model] keys, train/ the
//       rest). It sits below models/ so that models are built from a Config without depending on train/.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace ration {

class Config {
 public:
  using Scalar = std::variant<bool, int64_t, double, std::string>;

  Config() = default;
  static Config from_file(const std::string& path);
  static Config from_string(const std::string& toml_text, const std::string& origin = "<string>");
  // "section.key=value"; value parsed as bool/int/float if it looks like one, else string.
  void set_override(const std::string& assignment);
  void set(const std::string& key, Scalar value);

  bool has(const std::string& key) const;
  // Getters mark the key used. The default is returned (and recorded) when the key is absent.
  int64_t get_int(const std::string& key, int64_t def);
  double get_double(const std::string& key, double def);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def);
  // Must be one of `choices`.
  std::string get_choice(const std::string& key, const std::string& def, const std::vector<std::string>& choices);
  std::vector<int64_t> get_int_list(const std::string& key, const std::vector<int64_t>& def);
  std::vector<double> get_double_list(const std::string& key, const std::vector<double>& def);
  int64_t get_bytes(const std::string& key, int64_t def);  // "512MiB", "2GiB", 123

  // Throws naming every key that no getter asked for (typos are errors, not ignored).
  void check_all_used() const;
  const std::string& origin() const { return origin_; }
  // Effective configuration (explicit keys plus defaults that were read), for reports.
  std::map<std::string, std::string> effective() const;
  // A 16-hex-digit hash (FNV-1a 64) of the effective configuration, leaving out keys that start with one
  // of `ignored_prefixes`: equal for two runs that differ only in those keys.
  std::string fingerprint(const std::vector<std::string>& ignored_prefixes) const;

 private:
  const Scalar* find(const std::string& key);
  [[noreturn]] void type_error(const std::string& key, const char* expected) const;
  template <typename T, typename Parse>
  std::vector<T> get_list(const std::string& key, const std::vector<T>& def, const char* expected, Parse parse);
  std::string origin_ = "<none>";
  std::map<std::string, Scalar> values_;
  std::map<std::string, std::vector<int64_t>> lists_;
  std::set<std::string> used_;
  std::map<std::string, std::string> defaults_read_;
};

}  // namespace ration
