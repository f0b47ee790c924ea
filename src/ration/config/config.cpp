#include "ration/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <type_traits>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration {
namespace {

void flatten(const toml::table& table, const std::string& prefix, const std::string& origin,
             std::map<std::string, Config::Scalar>& values, std::map<std::string, std::vector<std::string>>& lists) {
  for (const auto& [k, node] : table) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* t = node.as_table()) {
      flatten(*t, key, origin, values, lists);
    } else if (const auto* a = node.as_array()) {
      std::vector<std::string> items;  // each number as written (an integer, or a float to full precision)
      for (const auto& item : *a) {
        if (const auto i = item.value_exact<int64_t>()) {
          items.push_back(std::to_string(*i));
          continue;
        }
        const auto d = item.value_exact<double>();
        RATION_CHECK(d.has_value(), origin, ": key '", key, "' must be an array of numbers, e.g. [256, 128]");
        std::ostringstream os;
        os << std::setprecision(17) << *d;
        items.push_back(os.str());
      }
      lists[key] = items;
    } else if (auto b = node.value_exact<bool>()) {
      values[key] = *b;
    } else if (auto i = node.value_exact<int64_t>()) {
      values[key] = *i;
    } else if (auto d = node.value_exact<double>()) {
      values[key] = *d;
    } else if (auto s = node.value_exact<std::string>()) {
      values[key] = *s;
    } else {
      RATION_CHECK(false, origin, ": key '", key, "' has an unsupported type (use a bool, integer, float, string or "
                   "array of integers)");
    }
  }
}

Config parse(const std::string& text, const std::string& origin) {
  Config cfg;
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    RATION_CHECK(false, origin, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
                 e.description());
  }
  std::map<std::string, Config::Scalar> values;
  std::map<std::string, std::vector<std::string>> lists;
  flatten(table, "", origin, values, lists);
  for (auto& [k, v] : values) cfg.set(k, v);
  for (auto& [k, v] : lists) cfg.set(k, [&] {
    std::ostringstream os;
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    return std::string("[") + os.str() + "]";
  }());
  return cfg;
}

std::string render(const Config::Scalar& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return x;
        else if constexpr (std::is_same_v<T, double>) {
          // A float keeps its decimal point ("128.0", not "128"), so a type error shows what was written.
          std::ostringstream os;
          os.precision(17);
          os << x;
          std::string out = os.str();
          if (out.find_first_of(".eEn") == std::string::npos) out += ".0";
          return out;
        } else {
          std::ostringstream os;
          os << x;
          return os.str();
        }
      },
      v);
}

}  // namespace

Config Config::from_file(const std::string& path) {
  std::ifstream in(path);
  RATION_CHECK(in.good(), "cannot open config file '", path, "' (expected a TOML file such as configs/cnn.toml)");
  std::stringstream ss;
  ss << in.rdbuf();
  Config cfg = parse(ss.str(), path);
  cfg.origin_ = path;
  RATION_CHECK(!cfg.values_.empty(), "config file '", path, "' is empty; hint: a config needs at least [model] with ",
               "type = \"mlp\", \"cnn\", \"gpt\" or \"lstm_lm\" (see configs/*.toml)");
  return cfg;
}

Config Config::from_string(const std::string& toml_text, const std::string& origin) {
  Config cfg = parse(toml_text, origin);
  cfg.origin_ = origin;
  return cfg;
}

void Config::set(const std::string& key, Scalar value) { values_[key] = std::move(value); }

void Config::set_override(const std::string& assignment) {
  const auto eq = assignment.find('=');
  RATION_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment,
               "': expected section.key=value, e.g. --set optim.lr=3e-4");
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  RATION_CHECK(key.find('.') != std::string::npos, "--set '", assignment,
               "': expected section.key=value (the key names its section), e.g. train.batch_size=64");
  if (text == "true" || text == "false") {
    values_[key] = (text == "true");
    return;
  }
  if (!text.empty() && text.front() == '[') {
    values_[key] = text;  // list, parsed by get_int_list
    return;
  }
  try {
    size_t pos = 0;
    const long long i = std::stoll(text, &pos);
    if (pos == text.size()) {
      values_[key] = static_cast<int64_t>(i);
      return;
    }
  } catch (const std::exception&) {
  }
  // A number strtod reads whole, tiny ones included (std::stod refuses a subnormal such as 1e-320, which
  // then read as a string); ranges are the keys' own checks.
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(d)) {
    values_[key] = d;
    return;
  }
  values_[key] = text;
}

bool Config::has(const std::string& key) const { return values_.count(key) != 0; }

const Config::Scalar* Config::find(const std::string& key) {
  used_.insert(key);
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

void Config::type_error(const std::string& key, const char* expected) const {
  const Scalar& v = values_.at(key);
  if (const auto* d = std::get_if<double>(&v); d && std::string(expected) == "an integer") {
    RATION_CHECK(false, origin_, ": key '", key, "' must be an integer, got the float ", render(v),
                 std::floor(*d) == *d ? "; hint: write it without a decimal point" : "");
  }
  if (const auto* s = std::get_if<std::string>(&v); s && std::string(expected) == "an integer" && !s->empty() &&
      s->find_first_not_of("+-0123456789") == std::string::npos) {
    RATION_CHECK(false, origin_, ": key '", key, "' must be an integer between -2^63 and 2^63-1, got '", *s,
                 "' (too large)");
  }
  RATION_CHECK(false, origin_, ": key '", key, "' must be ", expected, ", got '", render(v), "'");
}

int64_t Config::get_int(const std::string& key, int64_t def) {
  const Scalar* v = find(key);
  if (!v) {
    defaults_read_[key] = std::to_string(def);
    return def;
  }
  if (const auto* i = std::get_if<int64_t>(v)) return *i;
  type_error(key, "an integer");
}

double Config::get_double(const std::string& key, double def) {
  const Scalar* v = find(key);
  if (!v) {
    defaults_read_[key] = render(def);
    return def;
  }
  if (const auto* d = std::get_if<double>(v)) return *d;
  if (const auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  type_error(key, "a number");
}

bool Config::get_bool(const std::string& key, bool def) {
  const Scalar* v = find(key);
  if (!v) {
    defaults_read_[key] = def ? "true" : "false";
    return def;
  }
  if (const auto* b = std::get_if<bool>(v)) return *b;
  type_error(key, "true or false");
}

std::string Config::get_string(const std::string& key, const std::string& def) {
  const Scalar* v = find(key);
  if (!v) {
    defaults_read_[key] = def;
    return def;
  }
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  type_error(key, "a string");
}

std::string Config::get_choice(const std::string& key, const std::string& def, const std::vector<std::string>& choices) {
  const std::string s = get_string(key, def);
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  std::ostringstream os;
  for (size_t i = 0; i < choices.size(); ++i) os << (i ? ", " : "") << '"' << choices[i] << '"';
  RATION_CHECK(false, origin_, ": key '", key, "' must be one of ", os.str(), ", got \"", s, "\"");
}

// A list key: one number (a scalar), or "[a, b, ...]" (TOML arrays and --set overrides), each item read
// whole by `parse` (stoll / stod); anything else is a type error naming `expected`.
template <typename T, typename Parse>
std::vector<T> Config::get_list(const std::string& key, const std::vector<T>& def, const char* expected, Parse parse) {
  const Scalar* v = find(key);
  if (!v) return def;
  if (const auto* i = std::get_if<int64_t>(v)) return {static_cast<T>(*i)};
  if (const auto* d = std::get_if<double>(v); d && std::is_floating_point_v<T>) return {static_cast<T>(*d)};
  const auto* s = std::get_if<std::string>(v);
  if (s == nullptr || s->size() < 2 || s->front() != '[' || s->back() != ']') type_error(key, expected);
  std::vector<T> out;
  std::stringstream ss(s->substr(1, s->size() - 2));
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      out.push_back(parse(item, &pos));
      RATION_CHECK(item.find_first_not_of(" \t", pos) == std::string::npos, "trailing characters");
    } catch (const std::exception&) {
      type_error(key, expected);
    }
  }
  return out;
}

std::vector<int64_t> Config::get_int_list(const std::string& key, const std::vector<int64_t>& def) {
  return get_list<int64_t>(key, def, "an array of integers like [256, 128]",
                           [](const std::string& t, size_t* pos) { return static_cast<int64_t>(std::stoll(t, pos)); });
}

std::vector<double> Config::get_double_list(const std::string& key, const std::vector<double>& def) {
  return get_list<double>(key, def, "an array of numbers like [1, 0.5]",
                          [](const std::string& t, size_t* pos) { return std::stod(t, pos); });
}

int64_t Config::get_bytes(const std::string& key, int64_t def) {
  const Scalar* v = find(key);
  if (!v) return def;
  if (const auto* i = std::get_if<int64_t>(v)) return *i;
  if (const auto* s = std::get_if<std::string>(v)) return memory::parse_bytes(*s, origin_ + ": key '" + key + "'");
  // A bare number in exponent form (TOML reads 1e6 as a float): a whole number of bytes is a size.
  if (const auto* d = std::get_if<double>(v); d && std::isfinite(*d) && *d >= 0 && *d == std::floor(*d))
    return memory::parse_bytes(std::to_string(static_cast<long double>(*d)), origin_ + ": key '" + key + "'");
  type_error(key, "a size such as 512MiB or 2GiB");
}

void Config::check_all_used() const {
  std::vector<std::string> unknown;
  for (const auto& [k, v] : values_) {
    if (!used_.count(k)) unknown.push_back(k);
  }
  if (unknown.empty()) return;
  std::ostringstream os;
  for (size_t i = 0; i < unknown.size(); ++i) os << (i ? ", " : "") << "'" << unknown[i] << "'";
  RATION_CHECK(false, origin_, ": unknown key", unknown.size() > 1 ? "s " : " ", os.str(),
               " (not read by the selected model/data/optimiser; check spelling and section)");
}

std::map<std::string, std::string> Config::effective() const {
  std::map<std::string, std::string> out = defaults_read_;
  for (const auto& [k, v] : values_) out[k] = render(v);
  return out;
}

std::string Config::fingerprint(const std::vector<std::string>& ignored_prefixes) const {
  constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;
  uint64_t h = kFnvOffset;
  for (const auto& [k, v] : effective()) {
    const bool ignored = std::any_of(ignored_prefixes.begin(), ignored_prefixes.end(),
                                     [&](const std::string& p) { return k.rfind(p, 0) == 0; });
    if (ignored) continue;
    for (char ch : k + "=" + v + "\n") {
      h ^= static_cast<unsigned char>(ch);
      h *= kFnvPrime;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace ration
