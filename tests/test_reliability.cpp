// Reliability under hostile use: runs stopped by signals, two runs on one checkpoint directory, damaged
// and reused checkpoints, bad directories and full disks, and bad input of every kind. Kill tests run the
// real `ration` binary (build/ration) as a child process and signal it; full-disk tests use a small tmpfs
// (skipped, saying so, where mounting is not permitted). The probes are listed in docs/RELIABILITY.md.
#include <gtest/gtest.h>

#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ration/base/check.h"
#include "ration/base/paths.h"
#include "ration/offload/engine.h"
#include "ration/offload/tier.h"
#include "ration/train/checkpoint.h"
#include "ration/train/trainer.h"

namespace ration {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::error_of;
using testing::expect_error_containing;
using testing::read_file;
using testing::TempDir;

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

const std::string kRation = std::string(RATION_BINARY_DIR) + "/ration";

// A tiny byte-level GPT run: fast steps, many of them (a run is stopped, not finished, by the kill tests).
std::string tiny_gpt(const std::string& ckpt_dir, int64_t steps = 100000, const std::string& extra = "") {
  return "[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=16\nblock_size=16\n"
         "[data]\nkind='text'\n[optim]\nname='adamw'\nlr=0.003\nwarmup_steps=2\n"
         "[train]\nbatch_size=4\nthreads=1\nlog_every=1000\neval_batches=1\nsteps=" +
         std::to_string(steps) + "\ncheckpoint_dir='" + ckpt_dir + "'\n" + extra;
}

// ---- child processes ------------------------------------------------------------------------------
struct Child {
  pid_t pid = -1;
  std::string log;
};

// Starts build/ration with `args`, stdout and stderr to `log`.
Child spawn_ration(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {kRation};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return {pid, log};
}

// The child's exit status (128 + signal if a signal ended it), or -1 after `timeout_s` (then it is killed).
int wait_exit(pid_t pid, double timeout_s) {
  const auto t0 = Clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Finished {
  int status;
  std::string output;
};
Finished run_ration(const std::vector<std::string>& args, const fs::path& dir, double timeout_s = 120) {
  const Child c = spawn_ration(args, (dir / "run.log").string());
  const int status = wait_exit(c.pid, timeout_s);
  return {status, read_file(c.log)};
}

// Waits until the run holds its checkpoint directory's lock (it has passed setup and is about to step).
bool wait_for_lock(const fs::path& dir, pid_t pid, double timeout_s) {
  const auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < timeout_s) {
    if (fs::exists(dir / ".lock") && read_file(dir / ".lock").rfind(std::to_string(pid), 0) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool have_ration_binary() { return fs::exists(kRation); }

// A tmpfs of `size` mounted at `dir` for the test's lifetime (or nothing, where mount is not permitted).
struct SmallDisk {
  fs::path dir;
  bool mounted = false;
  SmallDisk(const fs::path& at, const std::string& size, bool read_only = false) : dir(at) {
    fs::create_directories(dir);
    const std::string opts = "size=" + size;
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, opts.c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

// Fills `dir`'s file system until at most `leave` bytes are free.
void fill_disk(const fs::path& dir, int64_t leave) {
  std::ofstream out(dir / "filler", std::ios::binary);
  const std::string block(4096, 'x');
  while (static_cast<int64_t>(fs::space(dir).available) > leave && out.good()) {
    out.write(block.data(), block.size());
    out.flush();
  }
}

std::vector<std::string> tmp_entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) out.push_back(e.path().filename().string());
  }
  return out;
}

train::NamedTensors weights_of(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {{"fc.weight", at::randn({64, 64}, gen)}, {"fc.bias", at::randn({64}, gen)}};
}

std::string save(const fs::path& dir, int64_t step, uint64_t seed, int keep = 5) {
  return train::save_checkpoint(dir.string(), step, weights_of(seed), {}, {}, keep);
}

// ---- 1. step numbers: resume with fewer steps, reuse for other weights, latest only forward -------
TEST(Reliability, ResumeWithFewerStepsIsRefusedAndKeepsCheckpoints) {
  TempDir dir(test_name());
  const fs::path ckpt = dir.path / "ckpt";
  train::TrainOptions opt;
  opt.config_path = dir.write("gpt.toml", tiny_gpt(ckpt.string(), 6, "checkpoint_every=3\nkeep_checkpoints=5\n"));
  opt.json = true;
  train::run_training(opt);
  ASSERT_TRUE(fs::exists(ckpt / "ckpt-3"));
  ASSERT_TRUE(fs::exists(ckpt / "ckpt-6"));
  const std::string ckpt3 = read_file(ckpt / "ckpt-3" / "model.pt");
  const std::string latest = read_file(ckpt / "latest");

  opt.resume = ckpt.string();
  opt.steps = 3;
  expect_error_containing([&] { train::run_training(opt); },
                          {"at step 6", "3 steps in all", "nothing to train", "--steps greater than 6"});
  EXPECT_EQ(read_file(ckpt / "ckpt-3" / "model.pt"), ckpt3) << "ckpt-3 was overwritten";
  EXPECT_EQ(read_file(ckpt / "latest"), latest) << "latest moved";
}

TEST(Reliability, StepNumberIsNeverReusedForOtherWeights) {
  TempDir dir(test_name());
  save(dir.path, 10, 1);
  const std::string before = read_file(dir.path / "ckpt-10" / "model.pt");
  expect_error_containing([&] { save(dir.path, 10, 2); },
                          {"ckpt-10", "already holds different weights for step 10", "--resume"});
  EXPECT_EQ(read_file(dir.path / "ckpt-10" / "model.pt"), before);
  EXPECT_TRUE(tmp_entries(dir.path).empty());
  EXPECT_NO_THROW(save(dir.path, 10, 1));  // the same weights again: a deterministic re-run
  EXPECT_EQ(read_file(dir.path / "ckpt-10" / "model.pt"), before);
}

TEST(Reliability, LatestOnlyMovesForward) {
  TempDir dir(test_name());
  save(dir.path, 20, 1);
  save(dir.path, 10, 2);
  EXPECT_EQ(read_file(dir.path / "latest"), "ckpt-20\n");
  EXPECT_EQ(train::load_checkpoint(dir.path.string()).step, 20);
  save(dir.path, 30, 3);
  EXPECT_EQ(read_file(dir.path / "latest"), "ckpt-30\n");
}

TEST(Reliability, AnotherRunsCheckpointsAreRefusedBeforeTheFirstStep) {
  TempDir dir(test_name());
  const fs::path ckpt = dir.path / "ckpt";
  train::TrainOptions opt;
  opt.config_path = dir.write("a.toml", tiny_gpt(ckpt.string(), 4, "checkpoint_every=2\n"));
  opt.json = true;
  const auto first = train::run_training(opt);
  const std::string ckpt2 = read_file(ckpt / "ckpt-2" / "model.pt");
  // The same run again (deterministic): allowed, and it writes the same bytes.
  const auto again = train::run_training(opt);
  EXPECT_EQ(again["loss"], first["loss"]);
  EXPECT_EQ(read_file(ckpt / "ckpt-2" / "model.pt"), ckpt2);
  // A different run (another learning rate) into the same directory: refused before training.
  opt.overrides = {"optim.lr=0.01"};
  opt.report_path = (dir.path / "b.json").string();
  expect_error_containing([&] { train::run_training(opt); }, {"already holds ckpt-", "different run", "--resume"});
  EXPECT_FALSE(fs::exists(opt.report_path)) << "it trained before refusing";
  EXPECT_EQ(read_file(ckpt / "ckpt-2" / "model.pt"), ckpt2);
  // Continuing the saved run is the way out, and a longer total is allowed (the schedule change is noted).
  opt.overrides = {};
  opt.resume = ckpt.string();
  opt.steps = 6;
  const auto resumed = train::run_training(opt);
  EXPECT_EQ(resumed["first_step"].get<int64_t>(), 4);
  ASSERT_EQ(resumed["notes"].size(), 1u);
  EXPECT_NE(resumed["notes"][0].get<std::string>().find("learning-rate schedule changes"), std::string::npos);
  EXPECT_NE(resumed["notes"][0].get<std::string>().find("planned for 4 steps, this one for 6"), std::string::npos);
}

// ---- 2. one writer per directory; clean-up of temporaries ----------------------------------------
TEST(Reliability, TwoRunsOnOneDirectoryTheSecondIsRefusedNamingThePid) {
  if (!have_ration_binary()) GTEST_SKIP() << kRation << " is not built";
  TempDir dir(test_name());
  const fs::path ckpt = dir.path / "ckpt";
  const std::string cfg = dir.write("gpt.toml", tiny_gpt(ckpt.string(), 100000, "checkpoint_every=5\n"));
  const Child first = spawn_ration({"train", cfg}, (dir.path / "first.log").string());
  ASSERT_TRUE(wait_for_lock(ckpt, first.pid, 60)) << read_file(first.log);
  // In this process and in a second real run: refused, naming the holder's pid.
  expect_error_containing([&] { train::CheckpointDirLock lock(ckpt.string()); },
                          {"in use by another ration run", "pid " + std::to_string(first.pid)});
  const Finished second = run_ration({"train", cfg, "--steps", "3"}, dir.path);
  EXPECT_EQ(second.status, 2) << second.output;
  EXPECT_NE(second.output.find("pid " + std::to_string(first.pid)), std::string::npos) << second.output;
  ::kill(first.pid, SIGKILL);
  wait_exit(first.pid, 30);
  // The holder is gone (even by SIGKILL): the lock is free again.
  EXPECT_NO_THROW(train::CheckpointDirLock lock(ckpt.string()));
}

TEST(Reliability, CleanUpRemovesOnlyItsOwnAndDeadProcessesTemporaries) {
  TempDir dir(test_name());
  save(dir.path, 10, 1);
  // A live process (a child that sleeps) and a dead one (a child that has exited and been reaped).
  const pid_t live = ::fork();
  if (live == 0) {
    ::sleep(60);
    ::_exit(0);
  }
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string live_tmp = ".tmp-ckpt-20-" + std::to_string(live) + "-0";
  const std::string dead_tmp = ".tmp-ckpt-20-" + std::to_string(dead) + "-0";
  fs::create_directories(dir.path / live_tmp);
  fs::create_directories(dir.path / dead_tmp);
  save(dir.path, 30, 3);
  EXPECT_TRUE(fs::exists(dir.path / live_tmp)) << "removed a running process's temporary";
  EXPECT_FALSE(fs::exists(dir.path / dead_tmp)) << "left a dead process's temporary";
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
}

// ---- 5. SIGINT / SIGTERM ---------------------------------------------------------------------------
void stop_by_signal_then_resume(int signal, int expected_status) {
  if (!have_ration_binary()) GTEST_SKIP() << kRation << " is not built";
  TempDir dir(test_name());
  const fs::path ckpt = dir.path / "ckpt";
  const fs::path report = dir.path / "report.json";
  // No periodic checkpoints: without the handler nothing at all would be saved.
  const std::string cfg = dir.write("gpt.toml", tiny_gpt(ckpt.string()));
  const Child child = spawn_ration({"train", cfg, "--report", report.string()}, (dir.path / "train.log").string());
  ASSERT_TRUE(wait_for_lock(ckpt, child.pid, 60)) << read_file(child.log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(child.pid, signal);
  const int status = wait_exit(child.pid, 60);
  const std::string log = read_file(child.log);
  ASSERT_EQ(status, expected_status) << log;
  ASSERT_TRUE(fs::exists(report)) << log;
  const auto r = nlohmann::json::parse(read_file(report));
  EXPECT_TRUE(r["interrupted"].get<bool>());
  EXPECT_EQ(r["exit_status"].get<int>(), expected_status);
  const int64_t done = r["last_step"].get<int64_t>();
  EXPECT_GT(done, 0);
  EXPECT_EQ(static_cast<int64_t>(r["loss"].size()), done);  // every step reported finished
  const train::Checkpoint ck = train::load_checkpoint(ckpt.string());
  EXPECT_EQ(ck.step, done);
  EXPECT_EQ(read_file(ckpt / "latest"), "ckpt-" + std::to_string(done) + "\n");
  // And it continues from there.
  const Finished resumed = run_ration({"train", cfg, "--resume", ckpt.string(), "--steps", std::to_string(done + 2),
                                       "--json"}, dir.path);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const auto rr = nlohmann::json::parse(resumed.output);
  EXPECT_EQ(rr["first_step"].get<int64_t>(), done);
  EXPECT_EQ(rr["loss"].size(), 2u);
}

// A run whose measured peak exceeded its budget finished (report and checkpoints written) but its plan did
// not hold: `ration train` exits 1, a failed check (README, "Exit codes"); before, it exited 0 with a warning.
TEST(Reliability, RunOverItsMemoryBudgetExitsOne) {
  using nlohmann::json;
  EXPECT_EQ(train::exit_status(json{{"memory", {{"budget_bytes", 100}, {"within_budget", false}}}}), 1);
  EXPECT_EQ(train::exit_status(json{{"memory", {{"budget_bytes", 100}, {"within_budget", true}}}}), 0);
  EXPECT_EQ(train::exit_status(json{{"memory", {{"peak_bytes", 100}}}}), 0);  // no budget
  EXPECT_EQ(train::exit_status(json{{"exit_status", 143}, {"memory", {{"within_budget", false}}}}), 143);
}

TEST(Reliability, SigintFinishesTheStepSavesReportsAndExits130) { stop_by_signal_then_resume(SIGINT, 130); }
TEST(Reliability, SigtermFinishesTheStepSavesReportsAndExits143) { stop_by_signal_then_resume(SIGTERM, 143); }

TEST(Reliability, SecondSignalStopsAtOnceAndLatestStaysValid) {
  if (!have_ration_binary()) GTEST_SKIP() << kRation << " is not built";
  TempDir dir(test_name());
  // A save every step, so the second signal lands in or near a save; three rounds at different moments.
  for (int round = 0; round < 3; ++round) {
    const fs::path ckpt = dir.path / ("ckpt" + std::to_string(round));
    const std::string cfg = dir.write("gpt" + std::to_string(round) + ".toml",
                                      tiny_gpt(ckpt.string(), 100000, "checkpoint_every=1\nkeep_checkpoints=2\n"));
    const Child child = spawn_ration({"train", cfg}, (dir.path / "train.log").string());
    ASSERT_TRUE(wait_for_lock(ckpt, child.pid, 60)) << read_file(child.log);
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 137 * round));
    ::kill(child.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
    ::kill(child.pid, SIGTERM);
    const auto t0 = Clock::now();
    const int status = wait_exit(child.pid, 30);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
    EXPECT_EQ(status, 143) << read_file(child.log);
    // Whatever latest names loads, with every CRC intact.
    if (fs::exists(ckpt / "latest")) {
      EXPECT_NO_THROW(train::load_checkpoint(ckpt.string())) << "round " << round;
    }
  }
}

// ---- 6. a bad checkpoint directory fails first; a full disk at the final save ---------------------
TEST(Reliability, BadCheckpointDirectoryFailsBeforeTheFirstStep) {
  TempDir dir(test_name());
  const std::string file = dir.write("not-a-dir", "x");
  train::TrainOptions opt;
  opt.json = true;
  // A million steps: if the directory were checked only at the end, this would not finish.
  opt.config_path = dir.write("a.toml", tiny_gpt(file, 1000000));
  const auto t0 = Clock::now();
  expect_error_containing([&] { train::run_training(opt); }, {"not-a-dir", "is a file, not a directory",
                                                             "train.checkpoint_dir"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 60.0);

  SmallDisk ro(dir.path / "ro", "1m", /*read_only=*/true);
  if (!ro.mounted) GTEST_SKIP() << "cannot mount a read-only tmpfs here (needs root): the read-only case is not run";
  opt.config_path = dir.write("b.toml", tiny_gpt((ro.dir / "ckpt").string(), 1000000));
  expect_error_containing([&] { train::run_training(opt); }, {"ro/ckpt", "train.checkpoint_dir"});
}

TEST(Reliability, FullDiskAtTheFinalSaveCleansUpAndStillWritesTheReport) {
  TempDir dir(test_name());
  SmallDisk disk(dir.path / "disk", "1m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const fs::path ckpt = disk.dir / "ckpt";
  fs::create_directories(ckpt);
  fill_disk(disk.dir, 8 * 1024);  // room for the lock file, not for a checkpoint
  train::TrainOptions opt;
  opt.json = true;
  opt.config_path = dir.write("a.toml", tiny_gpt(ckpt.string(), 2));
  opt.report_path = (dir.path / "report.json").string();
  expect_error_containing([&] { train::run_training(opt); },
                          {"final checkpoint was not saved", "No space left on device", "report was written"});
  EXPECT_TRUE(tmp_entries(ckpt).empty()) << "temporaries left on the full disk";
  ASSERT_TRUE(fs::exists(opt.report_path));
  const auto r = nlohmann::json::parse(read_file(opt.report_path));
  EXPECT_NE(r["checkpoint_error"].get<std::string>().find("No space left"), std::string::npos);
  EXPECT_EQ(r["loss"].size(), 2u);
}

// A periodic checkpoint on a full disk ends the run (exit 2), and the report is still written: the steps
// trained, the losses, and the error (docs/RELIABILITY.md, item 10). Before, the run ended without one.
TEST(Reliability, FullDiskAtAPeriodicCheckpointStillWritesTheReport) {
  TempDir dir(test_name());
  SmallDisk disk(dir.path / "disk", "1m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const fs::path ckpt = disk.dir / "ckpt";
  fs::create_directories(ckpt);
  fill_disk(disk.dir, 8 * 1024);  // room for the lock file, not for a checkpoint
  train::TrainOptions opt;
  opt.json = true;
  opt.config_path = dir.write("a.toml", tiny_gpt(ckpt.string(), 4, "checkpoint_every=2\n"));
  opt.report_path = (dir.path / "report.json").string();
  expect_error_containing([&] { train::run_training(opt); }, {"No space left on device"});
  ASSERT_TRUE(fs::exists(opt.report_path)) << "no report after the failed periodic checkpoint";
  const auto r = nlohmann::json::parse(read_file(opt.report_path));
  EXPECT_NE(r["error"].get<std::string>().find("No space left"), std::string::npos) << r["error"];
  EXPECT_EQ(r["loss"].size(), 2u);  // steps 1 and 2 trained; the checkpoint after step 2 failed
  EXPECT_EQ(r["failed_in_step"].get<int64_t>(), 2);
  EXPECT_TRUE(tmp_entries(ckpt).empty()) << "temporaries left on the full disk";
}

// ---- 7. integrity on load -------------------------------------------------------------------------
TEST(Reliability, CorruptTensorBytesFailTheirCrcOnLoad) {
  TempDir dir(test_name());
  save(dir.path, 10, 1);
  save(dir.path, 20, 2);
  const fs::path model = dir.path / "ckpt-20" / "model.pt";
  std::string bytes = read_file(model);
  // Flip one bit inside fc.weight's stored bytes (found by content), as a bad disk or copy would.
  const at::Tensor w = weights_of(2)[0].second.contiguous();
  const std::string raw(static_cast<const char*>(w.data_ptr()), static_cast<size_t>(w.nbytes()));
  const size_t at = bytes.find(raw);
  ASSERT_NE(at, std::string::npos);
  bytes[at + raw.size() / 2] ^= 0x10;
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  expect_error_containing([&] { train::load_checkpoint(dir.path.string()); },
                          {"ckpt-20/model.pt", "damaged", "fails its CRC-32 check", "ckpt-10"});
  // A truncated file too.
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  expect_error_containing([&] { train::load_checkpoint(dir.path.string()); }, {"ckpt-20/model.pt", "damaged"});
}

// ---- 3, 4. a small or full offload tier ------------------------------------------------------------
// configs/gpt.toml trained for a few steps in this process; returns the report.
nlohmann::json train_gpt(const std::vector<std::string>& overrides, int64_t steps) {
  train::TrainOptions opt;
  opt.config_path = std::string(RATION_SOURCE_DIR) + "/configs/gpt.toml";
  opt.json = true;
  opt.steps = steps;
  opt.overrides = overrides;
  opt.overrides.push_back("train.checkpoint_dir=");
  opt.overrides.push_back("train.eval_batches=1");
  return train::run_training(opt);
}

TEST(Reliability, TierCapacityIsMeasuredAndBoundsThePlan) {
  memory::OffloadOptions o;
  o.min_bytes = 16 << 10;
  memory::HostTier roomy(0), small(3 << 20), tiny(100 << 10);
  EXPECT_EQ(roomy.free_bytes(), memory::Tier::kUnboundedTier);
  EXPECT_EQ(small.free_bytes(), 3 << 20);
  const memory::OffloadCosts c_small = memory::measure_offload_costs(small, o, 16 << 20);
  EXPECT_GT(c_small.capacity_bytes, 2 << 20);
  EXPECT_LE(c_small.capacity_bytes, 3 << 20);
  EXPECT_EQ(small.used_bytes(), 0) << "measuring leaves nothing in the tier";
  // Too small to measure (under four 64 KiB probes): nothing is offloaded to it, and that is no error.
  EXPECT_EQ(memory::measure_offload_costs(tiny, o, 16 << 20).capacity_bytes, 0);
}

TEST(Reliability, SmallTierUnderABudgetPlansWithinItInsteadOfAborting) {
  if (!have_ration_binary()) GTEST_SKIP() << kRation << " is not built";
  TempDir dir(test_name());
  SmallDisk disk(dir.path / "tier", "1m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here (needs root)";
  const std::string gpt = std::string(RATION_SOURCE_DIR) + "/configs/gpt.toml";
  const std::vector<std::string> flags = {"--memory-budget", "60MiB", "--offload", "--offload-dir", disk.dir.string()};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  };
  const Finished plan = run_ration(with({"plan", gpt, "--json"}), dir.path, 300);
  ASSERT_EQ(plan.status, 0) << plan.output;
  const auto p = nlohmann::json::parse(plan.output.substr(plan.output.find('{')));
  EXPECT_LE(p["offloaded_bytes"].get<int64_t>(), 1 << 20) << "planned more offload than the tier holds";
  const Finished gc = run_ration(with({"gradcheck", gpt}), dir.path, 300);
  EXPECT_EQ(gc.status, 0) << gc.output;
  EXPECT_EQ(gc.output.find("No space left"), std::string::npos) << gc.output;
  const auto r = train_gpt({"memory.budget=60MiB", "offload.enabled=true", "offload.dir=" + disk.dir.string()}, 2);
  EXPECT_TRUE(r["memory"]["within_budget"].get<bool>()) << r["memory"].dump();
  EXPECT_EQ(r["offload"]["totals"]["fallbacks"].get<int64_t>(), 0);
}

TEST(Reliability, FullTierUnderABudgetNeverBreaksTheBudget) {
  TempDir dir(test_name());
  SmallDisk disk(dir.path / "tier", "20m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a 20 MiB tmpfs here (needs root)";
  const auto r = train_gpt({"memory.budget=42MiB", "offload.enabled=true", "offload.dir=" + disk.dir.string()}, 3);
  const int64_t peak = r["memory"]["peak_bytes"].get<int64_t>();
  EXPECT_LE(peak, int64_t{42} << 20) << r["memory"].dump();
  EXPECT_TRUE(r["memory"]["within_budget"].get<bool>());
  EXPECT_LE(r["plan"]["offloaded_bytes"].get<int64_t>(), int64_t{20} << 20);
}

TEST(Reliability, ThresholdOffloadIntoAFullTierNeverPeaksAboveNotOffloading) {
  TempDir dir(test_name());
  SmallDisk disk(dir.path / "tier", "2m");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a 2 MiB tmpfs here (needs root)";
  const int64_t plain = train_gpt({}, 2)["memory"]["peak_bytes"].get<int64_t>();
  const auto r = train_gpt({"offload.enabled=true", "offload.dir=" + disk.dir.string()}, 2);
  EXPECT_GT(r["offload"]["totals"]["fallbacks"].get<int64_t>(), 0) << "the tier did not fill: the probe tests nothing";
  EXPECT_LE(r["memory"]["peak_bytes"].get<int64_t>(), plain) << r["offload"].dump();
}

// ---- 9. bad input of every kind -------------------------------------------------------------------
TEST(Reliability, BadConfigsFailClearlyBeforeTraining) {
  TempDir dir(test_name());
  train::TrainOptions opt;
  opt.json = true;
  auto fails = [&](const std::string& name, const std::string& toml, const std::vector<std::string>& needles) {
    opt.config_path = dir.write(name, toml);
    const std::string msg = error_of([&] { train::run_training(opt); });
    EXPECT_FALSE(msg.empty()) << name << " was accepted";
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << name << ": " << msg << "\n  lacks: " << n;
    EXPECT_EQ(msg.find("failed: "), std::string::npos) << "source location shown to a user: " << msg;
    EXPECT_EQ(msg.find("src/ration"), std::string::npos) << "source path shown to a user: " << msg;
  };
  const std::string gpt = "[model]\ntype='gpt'\nn_layer=1\nn_head=2\nn_embd=16\nblock_size=16\n[data]\nkind='text'\n";
  fails("empty.toml", "", {"empty.toml", "is empty", "[model]"});
  fails("nomodel.toml", "[train]\nsteps=3\n", {"nomodel.toml", "model.type", "[model]"});
  fails("dir.toml", gpt + "files='" + dir.path.string() + "'\n", {"is a directory", "data.files"});
  fails("vocab.toml", "[model]\ntype='gpt'\nn_layer=1\nn_head=2\nn_embd=16\nblock_size=16\nvocab_size=100\n"
                      "[data]\nkind='text'\n", {"vocab.toml", "model.vocab_size = 100", "byte values up to"});
  fails("float.toml", "[model]\ntype='gpt'\nn_embd=128.0\n", {"model.n_embd", "the float 128.0", "without a decimal"});
  fails("ckpt_every.toml", gpt + "[train]\ncheckpoint_every=-1\n", {"train.checkpoint_every", ">= 0", "-1"});
  fails("eval_every.toml", gpt + "[train]\neval_every=-5\n", {"train.eval_every", ">= 0", "-5"});
  fails("budget.toml", gpt + "[memory]\nbudget='99999999999999999999'\n", {"memory.budget", "larger than any machine"});
  // Sizes are checked against the machine before allocating: fast, and naming the config.
  const auto t0 = Clock::now();
  fails("huge.toml", "[model]\ntype='gpt'\nn_layer=1\nn_head=2\nn_embd=100000\nblock_size=16\n[data]\nkind='text'\n",
        {"huge.toml", "building the gpt model", "this machine's", "model.n_embd"});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
}

TEST(Reliability, CommandLineValuesAreCheckedAndErrorsHideSourceLocations) {
  if (!have_ration_binary()) GTEST_SKIP() << kRation << " is not built";
  TempDir dir(test_name());
  const std::string cfg = dir.write("gpt.toml", tiny_gpt("", 3));
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"train", cfg, "--steps", "0"}, "expected an integer >= 1 (number of optimiser steps), got '0'"},
      {{"train", cfg, "--keep-groups", "-1"}, "expected an integer >= 0"},
      {{"train", cfg, "--offload-prefetch", "-3"}, "expected an integer >= 0"},
      {{"plan", cfg, "--memory-budget", "99999999999999999999"}, "larger than any machine"},
      {{"train", cfg, "--set", "train.eval_every=-5"}, "train.eval_every must be >= 0"},
  };
  for (const auto& c : cases) {
    const Finished f = run_ration(c.args, dir.path);
    EXPECT_NE(f.status, 0) << c.needle;
    EXPECT_NE(f.output.find(c.needle), std::string::npos) << f.output;
    EXPECT_EQ(f.output.find("failed: "), std::string::npos) << f.output;
    EXPECT_EQ(f.output.find("1797"), std::string::npos) << f.output;
  }
  // Developers see the location with RATION_DEBUG=1.
  ::setenv("RATION_DEBUG", "1", 1);
  const Finished debug = run_ration({"train", cfg, "--set", "train.eval_every=-5"}, dir.path);
  ::unsetenv("RATION_DEBUG");
  EXPECT_NE(debug.output.find("src/ration/train/"), std::string::npos) << debug.output;
  EXPECT_NE(debug.output.find("failed: "), std::string::npos) << debug.output;
}

}  // namespace
}  // namespace ration

namespace ration {
namespace {

// A file or folder name over 255 bytes is named with the flag or key that gave it, before the
// filesystem's raw "File name too long".
TEST(Reliability, OverlongPathComponentIsNamedWithItsFlagOrKey) {
  TempDir dir(test_name());
  const std::string long_name(300, 'a');
  train::TrainOptions opt;
  opt.config_path = dir.write("gpt.toml", tiny_gpt((dir.path / long_name).string(), 1, ""));
  opt.json = true;
  expect_error_containing([&] { train::run_training(opt); },
                          {"gpt.toml: train.checkpoint_dir", "is 300 bytes long", "may be at most 255 bytes"});
  opt.config_path = dir.write("gpt2.toml", tiny_gpt((dir.path / "ckpt").string(), 1, ""));
  opt.report_path = (dir.path / long_name / "r.json").string();
  expect_error_containing([&] { train::run_training(opt); },
                          {"--report", "is 300 bytes long", "may be at most 255 bytes"});
  expect_error_containing([&] { check_path_length(std::string(5000, 'b'), "--trace"); },
                          {"--trace", "the path is 5000 bytes long"});
  check_path_length("/tmp/" + std::string(255, 'c') + "/x", "ok");  // 255 is allowed
}

}  // namespace
}  // namespace ration
