// Checkpoints: round trip of weights, optimiser state and metadata; atomic publication (crash leftovers
// ignored and cleaned); keep-last-K; validation errors; and that Python's torch.load reads the files.
#include <gtest/gtest.h>

#include "test_util.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "ration/base/check.h"
#include "ration/optim/adamw.h"
#include "ration/train/checkpoint.h"

namespace ration::train {
namespace {
namespace fs = std::filesystem;
using ration::testing::expect_error_containing;
using ration::testing::read_file;
using ration::testing::TempDir;




// A small "model": two parameters and a buffer.
struct Model {
  std::vector<std::pair<std::string, Value>> params;
  NamedTensors buffers;
  explicit Model(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    params.emplace_back("fc.weight", parameter(at::randn({3, 4}, gen), "fc.weight"));
    params.emplace_back("fc.bias", parameter(at::randn({3}, gen), "fc.bias"));
    buffers.emplace_back("bn.running_mean", at::randn({3}, gen));
  }
  NamedTensors weights() const {
    NamedTensors w;
    for (const auto& [name, v] : params) w.emplace_back(name, v.tensor());
    for (const auto& b : buffers) w.push_back(b);
    return w;
  }
};

// Save a checkpoint of `model` at `step` with a stepped AdamW state.
std::string save_model(const fs::path& dir, int64_t step, const Model& model, int keep_last = 3) {
  Metadata meta;
  meta.ints["epoch"] = step / 10;
  meta.doubles["best_val_loss"] = 1.0 / static_cast<double>(step + 1);
  return save_checkpoint(dir.string(), step, model.weights(), {{"optim.step", at::scalar_tensor(step, at::kLong)}},
                         meta, keep_last);
}

TEST(Checkpoint, RoundTrip) {
  TempDir dir("ckpt-roundtrip");
  Model model(1);
  optim::AdamW adam(model.params, {});
  for (auto& [name, v] : model.params) v.grad() = at::ones_like(v.tensor());
  adam.step();
  Metadata meta;
  meta.ints["epoch"] = 3;
  meta.ints["loader_index"] = -1;  // negative ints survive
  meta.doubles["best_val_loss"] = 0.125;
  const std::string path = save_checkpoint(dir.path.string(), 7, model.weights(), adam.export_state(), meta);
  EXPECT_EQ(fs::path(path), dir.path / "ckpt-7");
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-7" / "model.pt"));
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-7" / "trainer.pt"));
  EXPECT_EQ(read_file(dir.path / "latest"), "ckpt-7\n");

  for (const std::string& where : {dir.path.string(), path}) {  // the parent follows latest
    const Checkpoint ck = load_checkpoint(where);
    EXPECT_EQ(fs::path(ck.path), fs::path(path));
    EXPECT_EQ(ck.step, 7);
    const NamedTensors w = model.weights();
    ASSERT_EQ(ck.weights.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(ck.weights[i].first, w[i].first);  // saved order is kept
      EXPECT_TRUE(at::equal(ck.weights[i].second, w[i].second)) << w[i].first;
    }
    const NamedTensors state = adam.export_state();
    ASSERT_EQ(ck.optimizer.size(), state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_EQ(ck.optimizer[i].first, state[i].first);
      EXPECT_TRUE(at::equal(ck.optimizer[i].second, state[i].second)) << state[i].first;
    }
    EXPECT_EQ(ck.metadata.ints, meta.ints);
    EXPECT_EQ(ck.metadata.doubles, meta.doubles);
  }

  // Restore into a differently initialised model and optimiser.
  Model fresh(2);
  ASSERT_FALSE(at::equal(fresh.params[0].second.tensor(), model.params[0].second.tensor()));
  const Checkpoint ck = load_checkpoint(dir.path.string());
  restore_weights(ck, fresh.params, fresh.buffers);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(at::equal(fresh.params[i].second.tensor(), model.params[i].second.tensor()));
  }
  EXPECT_TRUE(at::equal(fresh.buffers[0].second, model.buffers[0].second));
  optim::AdamW resumed(fresh.params, {});
  resumed.import_state(ck.optimizer);
  EXPECT_EQ(resumed.step_count(), 1);
}

TEST(Checkpoint, ValidationErrorsNameTheProblem) {
  TempDir dir("ckpt-validate");
  Model model(1);
  const std::string path = save_model(dir.path, 5, model);

  Model wider(9);
  wider.params[1].second = parameter(at::zeros({4}), "fc.bias");
  const at::Tensor before = wider.params[0].second.tensor().clone();
  const Checkpoint ck = load_checkpoint(path);
  ASSERT_FALSE(at::equal(before, ck.weights[0].second));
  expect_error_containing([&] { restore_weights(ck, wider.params, wider.buffers); }, {"fc.bias", "[3]", "[4]"});
  EXPECT_TRUE(at::equal(before, wider.params[0].second.tensor())) << "nothing changes on a failed restore";
  expect_error_containing([&] { restore_weights(ck, model.params, {}); }, {"model lacks", "bn.running_mean"});
  NamedTensors extra_buffers = model.buffers;
  extra_buffers.emplace_back("bn.running_var", at::ones({3}));
  expect_error_containing([&] { restore_weights(ck, model.params, extra_buffers); }, {"lacks weights", "bn.running_var"});

  fs::remove(fs::path(path) / "trainer.pt");
  expect_error_containing([&] { load_checkpoint(path); }, {(fs::path(path) / "trainer.pt").string(), "missing"});
  std::ofstream(fs::path(path) / "model.pt", std::ios::binary) << "this is not a zip archive";
  expect_error_containing([&] { load_checkpoint(path); }, {(fs::path(path) / "model.pt").string()});

  std::ofstream(dir.path / "latest") << "ckpt-99\n";
  expect_error_containing([&] { load_checkpoint(dir.path.string()); }, {"ckpt-99", "does not exist"});
  TempDir empty("ckpt-empty");
  expect_error_containing([&] { load_checkpoint(empty.path.string()); }, {"no checkpoint"});
  EXPECT_FALSE(has_checkpoint(empty.path.string()));
  EXPECT_FALSE(has_checkpoint((empty.path / "nope").string()));
}

TEST(Checkpoint, CrashLeftoversAreIgnoredAndCleaned) {
  TempDir dir("ckpt-atomic");
  Model model(1);
  save_model(dir.path, 10, model);
  // A save of step 20 "crashed" half-way through writing its temp dir, and a latest update crashed too
  // (in a process that no longer runs: a child that has exited and been reaped).
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string tmp_ckpt = ".tmp-ckpt-20-" + std::to_string(dead) + "-0";
  const std::string tmp_latest = ".tmp-latest-20-" + std::to_string(dead) + "-1";
  fs::create_directories(dir.path / tmp_ckpt);
  std::ofstream(dir.path / tmp_ckpt / "model.pt") << "half written";
  std::ofstream(dir.path / tmp_latest) << "ckpt-20";
  EXPECT_TRUE(has_checkpoint(dir.path.string()));
  EXPECT_EQ(load_checkpoint(dir.path.string()).step, 10);
  EXPECT_EQ(list_checkpoints(dir.path.string()).size(), 1u);

  save_model(dir.path, 30, model);
  EXPECT_FALSE(fs::exists(dir.path / tmp_ckpt));
  EXPECT_FALSE(fs::exists(dir.path / tmp_latest));
  EXPECT_EQ(load_checkpoint(dir.path.string()).step, 30);

  // A crash between publishing ckpt-40 and updating latest: latest is gone, the newest complete dir wins.
  save_model(dir.path, 40, model);
  fs::remove(dir.path / "latest");
  EXPECT_EQ(load_checkpoint(dir.path.string()).step, 40);

  // Saving the same step again with the same weights replaces it; with other weights it is refused
  // (a step number never names two sets of weights) and the saved one stays.
  save_model(dir.path, 40, model);
  Model other(3);
  expect_error_containing([&] { save_model(dir.path, 40, other); }, "already holds different weights for step 40");
  const Checkpoint ck = load_checkpoint(dir.path.string());
  EXPECT_TRUE(at::equal(ck.weights[0].second, model.params[0].second.tensor()));
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
  }
}

TEST(Checkpoint, KeepsLastK) {
  TempDir dir("ckpt-keep");
  Model model(1);
  for (int64_t step : {100, 200, 300, 400, 500}) save_model(dir.path, step, model, /*keep_last=*/2);
  std::vector<int64_t> steps;
  for (const auto& [step, path] : list_checkpoints(dir.path.string())) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{400, 500}));
  EXPECT_EQ(read_file(dir.path / "latest"), "ckpt-500\n");
  // Resumed from an earlier step: the new checkpoint is kept even though its step is lower, and latest
  // stays on the later step (latest only moves forward).
  save_model(dir.path, 450, model, /*keep_last=*/2);
  steps.clear();
  for (const auto& [step, path] : list_checkpoints(dir.path.string())) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{450, 500}));
  EXPECT_EQ(load_checkpoint(dir.path.string()).step, 500);
}

// Runs a command; returns its exit status and fills `out` with its stdout.
int run_command(const std::string& cmd, std::string& out) {
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  return ::pclose(pipe);
}

TEST(Checkpoint, PythonTorchLoadReadsIt) {
  std::string ignored;
  if (!fs::exists("/usr/bin/python3") || run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null", ignored) != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  }
  TempDir dir("ckpt-python");
  Model model(1);
  const std::string path = save_model(dir.path, 12, model);
  const std::string script =
      "import torch\n"
      "d = torch.load('" + path + "/model.pt')\n"
      "t = torch.load('" + path + "/trainer.pt')\n"
      "print(type(d).__name__, list(d)[:3])\n"
      "print('%.12f' % d['fc.weight'].double().sum().item(), tuple(d['fc.weight'].shape), d['fc.weight'].dtype)\n"
      "print(int(t['checkpoint.step']), int(t['meta.epoch']), float(t['meta.best_val_loss']))\n";
  const fs::path script_path = dir.path / "check.py";
  std::ofstream(script_path) << script;
  std::string out;
  ASSERT_EQ(run_command("/usr/bin/python3 " + script_path.string() + " 2>&1", out), 0) << out;
  char expected_sum[64];
  std::snprintf(expected_sum, sizeof expected_sum, "%.12f",
                model.params[0].second.tensor().to(at::kDouble).sum().item<double>());
  EXPECT_NE(out.find("dict ['fc.weight', 'fc.bias', 'bn.running_mean']"), std::string::npos) << out;
  EXPECT_NE(out.find(std::string(expected_sum) + " (3, 4) torch.float32"), std::string::npos) << out;
  EXPECT_NE(out.find("12 1 0.07692307692307693"), std::string::npos) << out;
}

}  // namespace
}  // namespace ration::train
