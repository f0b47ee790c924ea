// checkpoint.cpp — checkpoint files, atomic publication, pruning and validated loading (see checkpoint.h).
#include "ration/train/checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "ration/base/check.h"
#include "ration/train/archive_crc.h"

namespace ration::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kTrainerFile = "trainer.pt";
constexpr const char* kLatestFile = "latest";
constexpr const char* kLockFile = ".lock";
constexpr const char* kRunFile = "run";
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

std::vector<char> dict_bytes(const char* file, const NamedTensors& entries) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : entries) {
    RATION_CHECK(t.defined(), "checkpoint entry '", name, "' is an undefined tensor");
    RATION_CHECK(!dict.contains(name), "checkpoint entry '", name, "' appears twice in ", file);
    dict.insert(name, pickle_ready(t));
  }
  return torch::jit::pickle_save(c10::IValue(dict));
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  RATION_CHECK(in.good(), "cannot open checkpoint file '", path.string(), "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RATION_CHECK(!in.bad(), "error while reading checkpoint file '", path.string(), "'");
  return bytes;
}

// The other checkpoints of path's directory, for a hint ("ckpt-10, ckpt-20").
std::string siblings_hint(const fs::path& ckpt_dir) {
  std::string names;
  for (const auto& [step, p] : list_checkpoints(ckpt_dir.parent_path().string())) {
    if (fs::path(p).filename() == ckpt_dir.filename()) continue;
    names += (names.empty() ? "" : ", ") + fs::path(p).filename().string();
  }
  return names.empty() ? "" : " (others there: " + names + ")";
}

NamedTensors read_dict(const fs::path& path) {
  RATION_CHECK(fs::is_regular_file(path), "checkpoint file '", path.string(),
               "' is missing; hint: the checkpoint is incomplete or the path is wrong");
  const std::vector<char> bytes = read_bytes(path);
  const std::string damage = zip_integrity_problem(bytes.data(), bytes.size());
  RATION_CHECK(damage.empty(), "checkpoint file '", path.string(), "' is damaged: ", damage,
               "; hint: its bytes changed on disk or in a copy; resume from an earlier checkpoint",
               siblings_hint(path.parent_path()));
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

// The pid in a temporary's name ".tmp-<kind>-<step>-<pid>-<n>", or -1.
int64_t pid_of_temp(const std::string& name) {
  const auto last = name.rfind('-');
  if (last == std::string::npos || last == 0) return -1;
  const auto before = name.rfind('-', last - 1);
  if (before == std::string::npos) return -1;
  const std::string digits = name.substr(before + 1, last - before - 1);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

bool process_alive(int64_t pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// Our own temporaries (the replaced checkpoint moved aside, a failed save) and those a crashed process
// left behind; never those of a process that still runs.
void remove_leftover_temps(const fs::path& dir) {
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!starts_with(name, kTmpPrefix)) continue;
    const int64_t pid = pid_of_temp(name);
    if (pid == ::getpid() || !process_alive(pid)) doomed.push_back(entry.path());
  }
  for (const auto& p : doomed) fs::remove_all(p);
}

// Removes a temporary directory unless released (the save succeeded and renamed it).
struct TempDirGuard {
  fs::path path;
  ~TempDirGuard() {
    if (path.empty()) return;
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- the directory lock -------------------------------------------------------------------------
struct HeldLock {
  int fd = -1;
  int count = 0;
};
std::mutex g_lock_mu;
std::map<std::string, HeldLock>& held_locks() {
  static auto* held = new std::map<std::string, HeldLock>();
  return *held;
}

std::string lock_key(const std::string& dir) {
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(dir), ec);
  return ec ? fs::absolute(dir).lexically_normal().string() : abs.string();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir) : key_(lock_key(dir)) {
  std::lock_guard<std::mutex> guard(g_lock_mu);
  HeldLock& held = held_locks()[key_];
  if (held.count > 0) {
    ++held.count;
    return;
  }
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::exists(root)) fs::create_directories(root, ec);
  if (!fs::is_directory(root)) {
    held_locks().erase(key_);
    RATION_CHECK(false, "checkpoint directory '", dir, "' ", fs::exists(root) ? "is a file, not a directory" :
                 "cannot be created (" + ec.message() + ")", "; hint: set train.checkpoint_dir to a directory ",
                 "you can write (or to \"\" to save no checkpoints)");
  }
  const fs::path lock_path = root / kLockFile;
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    held_locks().erase(key_);
    RATION_CHECK(false, "checkpoint directory '", dir, "' is not writable (cannot create ", lock_path.string(), ": ",
                 std::strerror(err), "); hint: set train.checkpoint_dir to a directory you can write");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = read_text(lock_path);
    holder = holder.substr(0, holder.find_first_of("\r\n"));
    ::close(fd);
    held_locks().erase(key_);
    RATION_CHECK(err != EWOULDBLOCK, "checkpoint directory '", dir, "' is in use by another ration run (pid ",
                 holder.empty() ? "unknown" : holder, "); hint: wait for it to finish, or set ",
                 "train.checkpoint_dir to another directory");
    RATION_CHECK(false, "cannot lock '", lock_path.string(), "': ", std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    held_locks().erase(key_);
    RATION_CHECK(false, "checkpoint directory '", dir, "' is not writable (writing ", lock_path.string(), ": ",
                 std::strerror(err), "); hint: is the disk full or read-only?");
  }
  held.fd = fd;
  held.count = 1;
}

CheckpointDirLock::~CheckpointDirLock() {
  std::lock_guard<std::mutex> guard(g_lock_mu);
  auto it = held_locks().find(key_);
  if (it == held_locks().end() || --it->second.count > 0) return;
  ::close(it->second.fd);  // releases the flock; the file stays (removing it would race a new locker)
  held_locks().erase(it);
}

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
                            const NamedTensors& optimizer_state, const Metadata& metadata, int keep_last,
                            const std::string& run_fingerprint) {
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
  const std::vector<char> model_bytes = dict_bytes(kModelFile, weights);
  const std::vector<char> trainer_bytes = dict_bytes(kTrainerFile, trainer);

  const CheckpointDirLock lock(dir);
  const fs::path root(dir);
  const fs::path final_dir = root / (kCkptPrefix + std::to_string(step));
  // A step number names one set of weights: replacing ckpt-<step> is allowed only with the same bytes.
  if (fs::exists(final_dir / kModelFile)) {
    RATION_CHECK(read_bytes(final_dir / kModelFile) == model_bytes, "'", final_dir.string(),
                 "' already holds different weights for step ", step, "; a step number is never reused for other ",
                 "weights; hint: continue that run with --resume ", dir, ", or set train.checkpoint_dir to another ",
                 "directory");
  }

  TempDirGuard tmp{root / (std::string(kTmpPrefix) + "ckpt-" + unique_suffix(step))};
  fs::create_directory(tmp.path);
  write_file_synced(tmp.path / kModelFile, model_bytes.data(), model_bytes.size());
  write_file_synced(tmp.path / kTrainerFile, trainer_bytes.data(), trainer_bytes.size());
  if (!run_fingerprint.empty()) {
    const std::string line = run_fingerprint + "\n";
    write_file_synced(tmp.path / kRunFile, line.data(), line.size());
  }
  fsync_path(tmp.path, /*directory=*/true);

  // The same step is replaced (same weights, checked above): move the old one aside first (rename needs
  // an absent target); it is one of our temporaries from here on.
  if (fs::exists(final_dir)) fs::rename(final_dir, root / (std::string(kTmpPrefix) + "old-" + unique_suffix(step)));
  fs::rename(tmp.path, final_dir);
  tmp.path.clear();
  fsync_path(root, /*directory=*/true);

  // latest only moves forward: a re-run that writes an earlier step again leaves a later latest alone.
  int64_t latest_step = -1;
  if (fs::exists(root / kLatestFile)) {
    const std::string name = trim(read_text(root / kLatestFile));
    if (fs::is_directory(root / name)) latest_step = step_of_name(name);
  }
  if (latest_step <= step) {
    TempDirGuard latest_tmp{root / (std::string(kTmpPrefix) + "latest-" + unique_suffix(step))};
    const std::string latest_text = final_dir.filename().string() + "\n";
    write_file_synced(latest_tmp.path, latest_text.data(), latest_text.size());
    fs::rename(latest_tmp.path, root / kLatestFile);
    latest_tmp.path.clear();
    fsync_path(root, /*directory=*/true);
  }

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

void check_run_may_write(const std::string& dir, int64_t first_step, const std::string& fingerprint) {
  for (const auto& [step, path] : list_checkpoints(dir)) {
    if (step <= first_step) continue;
    const fs::path run_file = fs::path(path) / kRunFile;
    const std::string theirs = fs::exists(run_file) ? trim(read_text(run_file)) : "";
    RATION_CHECK(theirs == fingerprint, "checkpoint directory '", dir, "' already holds ", fs::path(path).filename().string(),
                 " from a different run", theirs.empty() ? " (or one without a run fingerprint)" : "",
                 "; this run (from step ", first_step, ") would write the same step numbers with other weights; ",
                 "hint: continue the saved run with --resume ", dir, ", set train.checkpoint_dir to another ",
                 "directory, or remove the old checkpoints");
  }
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  RATION_CHECK(fs::is_directory(p), "checkpoint path '", path, "' is not a directory; hint: pass a ckpt-<step> ",
               "directory or the directory holding them");
  if (fs::exists(p / kModelFile) || fs::exists(p / kTrainerFile)) return p.string();
  if (fs::exists(p / kLatestFile)) {
    const std::string name = trim(read_text(p / kLatestFile));
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

void write_model_file(const std::string& path, const NamedTensors& weights) {
  const std::vector<char> bytes = dict_bytes(kModelFile, weights);
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const fs::path tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  write_file_synced(tmp, bytes.data(), bytes.size());
  fs::rename(tmp, target);
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
  if (fs::exists(dir / kRunFile)) ck.run_fingerprint = trim(read_text(dir / kRunFile));
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
