// checkpoint.cpp — checkpoint files, atomic publication, pruning and validated loading (see checkpoint.h).
#include "ration/train/checkpoint.h"

#include <fcntl.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ration/core/check.h"

namespace ration::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kTrainerFile = "trainer.pt";
constexpr const char* kLatestFile = "latest";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kCkptPrefix = "ckpt-";
constexpr const char* kStepKey = "checkpoint.step";
constexpr const char* kMetaPrefix = "meta.";

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// "ckpt-<digits>" -> step, or -1.
int64_t step_of_name(const std::string& name) {
  if (!starts_with(name, kCkptPrefix)) return -1;
  const std::string digits = name.substr(std::string(kCkptPrefix).size());
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  RATION_CHECK(fd >= 0, "cannot open '", path.string(), "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  RATION_CHECK(rc == 0, "fsync of '", path.string(), "' failed: ", std::strerror(err));
}

void write_file_synced(const fs::path& path, const char* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  RATION_CHECK(fd >= 0, "cannot create '", path.string(), "': ", std::strerror(errno),
               "; hint: is the checkpoint directory writable?");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      RATION_CHECK(false, "writing '", path.string(), "' failed after ", done, " of ", size,
                   " bytes: ", std::strerror(err), "; hint: is the disk full?");
    }
    done += static_cast<size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  RATION_CHECK(rc == 0, "fsync of '", path.string(), "' failed: ", std::strerror(err));
}

// A tensor fit for pickling: detached, on the CPU, and owning exactly its own bytes (pickle writes
// whole storages, so a view would drag its base along).
at::Tensor pickle_ready(const at::Tensor& t) {
  at::Tensor out = t.detach().cpu();
  if (!out.is_contiguous() || out.storage_offset() != 0 ||
      out.storage().nbytes() != static_cast<size_t>(out.numel()) * out.element_size()) {
    out = out.clone(at::MemoryFormat::Contiguous);
  }
  return out;
}

void write_dict(const fs::path& path, const NamedTensors& entries) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : entries) {
    RATION_CHECK(t.defined(), "checkpoint entry '", name, "' is an undefined tensor");
    RATION_CHECK(!dict.contains(name), "checkpoint entry '", name, "' appears twice in ", path.filename().string());
    dict.insert(name, pickle_ready(t));
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  write_file_synced(path, bytes.data(), bytes.size());
}

NamedTensors read_dict(const fs::path& path) {
  RATION_CHECK(fs::is_regular_file(path), "checkpoint file '", path.string(),
               "' is missing; hint: the checkpoint is incomplete or the path is wrong");
  std::ifstream in(path, std::ios::binary);
  RATION_CHECK(in.good(), "cannot open checkpoint file '", path.string(), "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    RATION_CHECK(false, "checkpoint file '", path.string(), "' cannot be read (", what,
                 "); hint: it is corrupt or was not written by ration/torch.save");
  }
  RATION_CHECK(value.isGenericDict(), "checkpoint file '", path.string(), "' holds a ", value.tagKind(),
               ", expected a dictionary of name -> tensor");
  NamedTensors out;
  for (const auto& item : value.toGenericDict()) {
    RATION_CHECK(item.key().isString() && item.value().isTensor(), "checkpoint file '", path.string(),
                 "' has an entry that is not string -> tensor (", item.key().tagKind(), " -> ",
                 item.value().tagKind(), ")");
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

std::string unique_suffix(int64_t step) {
  static std::atomic<int> counter{0};
  return std::to_string(step) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// Entries a crashed save left behind (and the replaced checkpoint moved aside above).
void remove_leftover_temps(const fs::path& dir) {
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (starts_with(entry.path().filename().string(), kTmpPrefix)) doomed.push_back(entry.path());
  }
  for (const auto& p : doomed) fs::remove_all(p);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string save_checkpoint(const std::string& dir, int64_t step, const NamedTensors& weights,
                            const NamedTensors& optimizer_state, const Metadata& metadata, int keep_last) {
  RATION_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  RATION_CHECK(keep_last >= 1, "keep_last must be >= 1, got ", keep_last);
  NamedTensors trainer;
  trainer.emplace_back(kStepKey, at::scalar_tensor(step, at::kLong));
  for (const auto& [name, t] : optimizer_state) {
    RATION_CHECK(!starts_with(name, kMetaPrefix) && name != kStepKey, "optimiser state entry '", name,
                 "' collides with checkpoint metadata names ('", kMetaPrefix, "*', '", kStepKey, "')");
    trainer.emplace_back(name, t);
  }
  std::set<std::string> meta_names;
  for (const auto& [key, v] : metadata.ints) {
    meta_names.insert(key);
    trainer.emplace_back(kMetaPrefix + key, at::scalar_tensor(v, at::kLong));
  }
  for (const auto& [key, v] : metadata.doubles) {
    RATION_CHECK(meta_names.insert(key).second, "metadata key '", key, "' is both an int and a double");
    trainer.emplace_back(kMetaPrefix + key, at::scalar_tensor(v, at::kDouble));
  }

  const fs::path root(dir);
  fs::create_directories(root);
  const fs::path tmp = root / (std::string(kTmpPrefix) + "ckpt-" + unique_suffix(step));
  const fs::path final_dir = root / (kCkptPrefix + std::to_string(step));
  fs::create_directory(tmp);
  write_dict(tmp / kModelFile, weights);
  write_dict(tmp / kTrainerFile, trainer);
  fsync_path(tmp, /*directory=*/true);

  // A checkpoint of the same step is replaced: move it aside first (rename needs an absent target).
  fs::path old_aside;
  if (fs::exists(final_dir)) {
    old_aside = root / (std::string(kTmpPrefix) + "old-" + unique_suffix(step));
    fs::rename(final_dir, old_aside);
  }
  fs::rename(tmp, final_dir);
  fsync_path(root, /*directory=*/true);

  const fs::path latest_tmp = root / (std::string(kTmpPrefix) + "latest-" + unique_suffix(step));
  const std::string latest_text = final_dir.filename().string() + "\n";
  write_file_synced(latest_tmp, latest_text.data(), latest_text.size());
  fs::rename(latest_tmp, root / kLatestFile);
  fsync_path(root, /*directory=*/true);

  remove_leftover_temps(root);
  // Keep the new checkpoint and the keep_last - 1 highest-step others.
  std::vector<std::pair<int64_t, std::string>> others;
  for (auto& entry : list_checkpoints(dir)) {
    if (entry.first != step) others.push_back(std::move(entry));
  }
  const auto excess = static_cast<int64_t>(others.size()) - (keep_last - 1);
  for (int64_t i = 0; i < excess; ++i) fs::remove_all(others[static_cast<size_t>(i)].second);
  return final_dir.string();
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  RATION_CHECK(fs::is_directory(p), "checkpoint path '", path, "' is not a directory; hint: pass a ckpt-<step> ",
               "directory or the directory holding them");
  if (fs::exists(p / kModelFile) || fs::exists(p / kTrainerFile)) return p.string();
  if (fs::exists(p / kLatestFile)) {
    std::ifstream in(p / kLatestFile);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string name = trim(ss.str());
    RATION_CHECK(step_of_name(name) >= 0, "'", (p / kLatestFile).string(), "' names '", name,
                 "', expected ckpt-<step>");
    RATION_CHECK(fs::is_directory(p / name), "'", (p / kLatestFile).string(), "' names '", name,
                 "', which does not exist in ", path);
    return (p / name).string();
  }
  const auto all = list_checkpoints(path);
  RATION_CHECK(!all.empty(), "no checkpoint in '", path, "' (no ", kModelFile, ", no ", kLatestFile,
               ", no ckpt-<step> directory)");
  return all.back().second;
}

bool has_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return false;
  try {
    resolve_checkpoint(dir);
    return true;
  } catch (const Error&) {
    return false;
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint ck;
  ck.path = resolve_checkpoint(path);
  const fs::path dir(ck.path);
  ck.weights = read_dict(dir / kModelFile);
  bool have_step = false;
  for (auto& [name, t] : read_dict(dir / kTrainerFile)) {
    if (name == kStepKey) {
      RATION_CHECK(t.numel() == 1, "'", kStepKey, "' in ", (dir / kTrainerFile).string(), " is not a scalar");
      ck.step = t.item<int64_t>();
      have_step = true;
    } else if (starts_with(name, kMetaPrefix)) {
      RATION_CHECK(t.numel() == 1, "metadata '", name, "' in ", (dir / kTrainerFile).string(), " is not a scalar");
      const std::string key = name.substr(std::string(kMetaPrefix).size());
      if (at::isFloatingType(t.scalar_type())) ck.metadata.doubles[key] = t.item<double>();
      else ck.metadata.ints[key] = t.item<int64_t>();
    } else {
      ck.optimizer.emplace_back(name, t);
    }
  }
  RATION_CHECK(have_step, "checkpoint file '", (dir / kTrainerFile).string(), "' lacks '", kStepKey,
               "'; hint: it was not written by save_checkpoint");
  return ck;
}

void restore_weights(const Checkpoint& checkpoint, const std::vector<std::pair<std::string, Value>>& params,
                     const NamedTensors& buffers) {
  std::map<std::string, const at::Tensor*> saved;
  for (const auto& [name, t] : checkpoint.weights) saved[name] = &t;
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (const auto& [name, v] : params) targets.emplace_back(name, v.tensor());
  for (const auto& [name, t] : buffers) targets.emplace_back(name, t);

  std::vector<std::string> missing;
  std::set<std::string> wanted;
  for (const auto& [name, t] : targets) {
    wanted.insert(name);
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
      continue;
    }
    RATION_CHECK(it->second->sizes() == t.sizes(), "checkpoint ", checkpoint.path, ": weight '", name, "' has shape ",
                 it->second->sizes(), " but the model's has shape ", t.sizes(),
                 "; hint: the model configuration differs from the one that was saved");
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : checkpoint.weights) {
    if (!wanted.count(name)) unexpected.push_back(name);
  }
  auto join = [](const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size() && i < 5; ++i) s += (i ? ", " : "") + names[i];
    if (names.size() > 5) s += ", ... (" + std::to_string(names.size()) + " in all)";
    return s;
  };
  RATION_CHECK(missing.empty(), "checkpoint ", checkpoint.path, " lacks weights the model has: ", join(missing),
               "; hint: the model configuration differs from the one that was saved");
  RATION_CHECK(unexpected.empty(), "checkpoint ", checkpoint.path, " has weights the model lacks: ", join(unexpected),
               "; hint: the model configuration differs from the one that was saved");
  NoGradGuard ration_no_grad;
  at::NoGradGuard torch_no_grad;
  for (auto& [name, t] : targets) t.copy_(*saved.at(name));
}

}  // namespace ration::train
