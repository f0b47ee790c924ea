// checkpoint_shards.cpp — see checkpoint_shards.h.
#include "ration/train/checkpoint_shards.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "ration/base/check.h"
#include "ration/distributed/tensor_parallel_block.h"

namespace ration::train {
namespace fs = std::filesystem;
namespace {
constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "ration-shards-1";
}  // namespace

std::string shard_dir_name(int stage, int tensor_rank) {
  return "shard-s" + std::to_string(stage) + "-t" + std::to_string(tensor_rank);
}

bool has_shard_manifest(const std::string& dir) { return fs::exists(fs::path(dir) / kManifest); }

void write_shard_manifest(const std::string& dir, const ShardManifest& m) {
  nlohmann::json shards = nlohmann::json::array();
  for (int s = 0; s < m.pipeline; ++s)
    for (int t = 0; t < m.tensor; ++t) shards.push_back({{"dir", shard_dir_name(s, t)}, {"stage", s}, {"tensor_rank", t}});
  const nlohmann::json j = {{"format", kFormat}, {"model", m.model},          {"tensor", m.tensor},
                            {"pipeline", m.pipeline}, {"shards", shards}, {"split_dims", m.split_dims},
                            {"tied", m.tied},    {"first_unit", m.first_unit}, {"split_parts", m.split_parts}};
  fs::create_directories(dir);
  const fs::path target = fs::path(dir) / kManifest;
  const fs::path tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    out.flush();
    RATION_CHECK(out.good(), "cannot write '", tmp.string(), "'; hint: is the checkpoint directory writable, the disk full?");
  }
  fs::rename(tmp, target);
}

ShardManifest read_shard_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / kManifest;
  std::ifstream in(path);
  RATION_CHECK(in.good(), "cannot open '", path.string(), "': not the checkpoint directory of a split model ",
               "(parallel.tensor or parallel.pipeline > 1)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    RATION_CHECK(false, "'", path.string(), "' is not JSON: ", e.what());
  }
  RATION_CHECK(j.value("format", "") == kFormat, "'", path.string(), "': field \"format\" must be \"", kFormat, "\"");
  ShardManifest m;
  try {
    m.model = j.at("model").get<std::string>();
    m.tensor = j.at("tensor").get<int>();
    m.pipeline = j.at("pipeline").get<int>();
    m.split_dims = j.at("split_dims").get<std::map<std::string, int64_t>>();
    m.tied = j.at("tied").get<std::vector<std::string>>();
    m.first_unit = j.at("first_unit").get<std::vector<int64_t>>();
    if (j.contains("split_parts")) m.split_parts = j.at("split_parts").get<std::map<std::string, int64_t>>();
  } catch (const std::exception& e) {
    RATION_CHECK(false, "'", path.string(), "': ", e.what(), " (expected fields model, tensor, pipeline, split_dims, tied, first_unit)");
  }
  RATION_CHECK(m.tensor >= 1 && m.pipeline >= 1, "'", path.string(), "': tensor and pipeline must be >= 1");
  return m;
}

NamedTensors merge_checkpoint_shards(const std::string& dir, std::optional<int64_t> step) {
  const ShardManifest m = read_shard_manifest(dir);
  if (!step) {  // the newest step every shard has
    std::optional<int64_t> common;
    for (int s = 0; s < m.pipeline; ++s)
      for (int t = 0; t < m.tensor; ++t) {
        const auto list = list_checkpoints((fs::path(dir) / shard_dir_name(s, t)).string());
        RATION_CHECK(!list.empty(), "shard ", shard_dir_name(s, t), " of '", dir, "' has no checkpoint");
        common = common ? std::min(*common, list.back().first) : list.back().first;
      }
    step = common;
  }
  NamedTensors merged;
  std::map<std::string, std::vector<at::Tensor>> pieces;  // split weights: one piece per tensor rank
  std::vector<std::string> order;
  for (int s = 0; s < m.pipeline; ++s)
    for (int t = 0; t < m.tensor; ++t) {
      const fs::path ckpt = fs::path(dir) / shard_dir_name(s, t) / ("ckpt-" + std::to_string(*step));
      RATION_CHECK(fs::exists(ckpt), "shard ", shard_dir_name(s, t), " of '", dir, "' has no checkpoint of step ", *step);
      for (auto& [name, tensor] : load_checkpoint(ckpt.string()).weights) {
        if (m.split_dims.count(name)) {
          auto& p = pieces[name];
          if (p.empty()) order.push_back(name);
          if (static_cast<int>(p.size()) == t) p.push_back(tensor);
          continue;
        }
        if (std::none_of(order.begin(), order.end(), [&](const std::string& n) { return n == name; })) {
          order.push_back(name);
          merged.emplace_back(name, tensor);
        }
      }
    }
  NamedTensors out;
  for (const auto& name : order) {
    if (auto it = pieces.find(name); it != pieces.end()) {
      RATION_CHECK(static_cast<int>(it->second.size()) == m.tensor, "weight '", name, "' has ", it->second.size(),
                   " tensor shards in '", dir, "', expected ", m.tensor);
      const auto parts = m.split_parts.find(name);
      out.emplace_back(name, dist::merge_tensor_shards(it->second, m.split_dims.at(name),
                                                       parts == m.split_parts.end() ? 1 : parts->second));
    } else {
      for (auto& [n, t] : merged)
        if (n == name) out.emplace_back(n, t);
    }
  }
  return out;
}

}  // namespace ration::train
