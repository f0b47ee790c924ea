// Whole-model training against libtorch, and the trainer's promises: exact resume, clear config
// errors, a complete report.
#include <gtest/gtest.h>

#include "test_util.h"
#include "batch_util.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/models/model.h"
#include "ration/optim/adamw.h"
#include "ration/config/config.h"
#include "ration/train/trainer.h"

namespace ration {
namespace {

namespace fs = std::filesystem;
using testing::expect_error_containing;

data::Batch synthetic_batch(const std::string& type, int64_t step) {
  const bool images = type == "mlp" || type == "cnn";
  return testing::random_batch(images, images ? 8 : 4, 16, static_cast<uint64_t>(1000 + step));
}

const char* tiny_model(const std::string& type) {
  if (type == "mlp") return "[model]\ntype='mlp'\nhidden=[32]\ndropout=0.2\n";
  if (type == "cnn") return "[model]\ntype='cnn'\nchannels=[4,8]\nfc_hidden=16\ndropout=0.2\n";
  if (type == "gpt") return "[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=16\nblock_size=16\ndropout=0.1\n";
  return "[model]\ntype='lstm_lm'\nn_embd=8\nhidden_size=16\nn_layer=2\n";
}

// Ten AdamW steps of the same model from the same initial weights on the same batches, differentiated
// by ration and by torch::autograd: the losses must agree step by step.
std::vector<double> train_ten_steps(const std::string& type, bool torch_autograd) {
  Config cfg = Config::from_string(tiny_model(type), type + ".toml");
  at::manual_seed(42);
  auto model = models::build_model(cfg);
  model->train();
  optim::AdamWOptions o;
  o.lr = 3e-3;
  optim::AdamW opt(model->named_parameters(), o);
  std::vector<double> losses;
  for (int64_t step = 0; step < 10; ++step) {
    const data::Batch b = synthetic_batch(type, step % 2);  // two batches, revisited: the loss must fall
    manual_seed(static_cast<uint64_t>(77 + step));
    if (torch_autograd) {
      OracleScope scope(model->parameters());
      Value loss = model->loss(b);
      losses.push_back(loss.item());
      loss.backward();
    } else {
      Value loss = model->loss(b);
      losses.push_back(loss.item());
      loss.backward();
    }
    opt.step();
    opt.zero_grad();
  }
  return losses;
}

class TenSteps : public ::testing::TestWithParam<std::string> {};

TEST_P(TenSteps, LossMatchesLibtorchAutograd) {
  const auto ours = train_ten_steps(GetParam(), false);
  const auto theirs = train_ten_steps(GetParam(), true);
  ASSERT_EQ(ours.size(), 10u);
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NEAR(ours[i], theirs[i], 1e-5 * std::max(1.0, std::abs(theirs[i]))) << "step " << i;
  }
  EXPECT_LT(ours.back(), ours.front()) << "ten steps did not reduce the loss";
}

INSTANTIATE_TEST_SUITE_P(Models, TenSteps, ::testing::Values("mlp", "cnn", "gpt", "lstm_lm"));

// ---- trainer -----------------------------------------------------------------------------------


std::string gpt_run_config(const std::string& ckpt_dir) {
  return std::string(tiny_model("gpt")) +
         "[data]\nkind='text'\n[optim]\nname='adamw'\nlr=0.003\nwarmup_steps=2\n[train]\nbatch_size=4\nsteps=6\n"
         "eval_every=3\neval_batches=2\nlog_every=100\nthreads=1\ncheckpoint_every=3\ncheckpoint_dir='" +
         ckpt_dir + "'\n";
}

TEST(Trainer, ResumeFromCheckpointContinuesExactly) {
  testing::TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string cfg = dir.write("gpt.toml", gpt_run_config((dir.path / "run").string()));
  train::TrainOptions straight;
  straight.config_path = cfg;
  straight.json = true;
  const auto full = train::run_training(straight);
  ASSERT_EQ(full["loss"].size(), 6u);
  ASSERT_TRUE(fs::exists(dir.path / "run" / "ckpt-3"));

  // A second run resumes from step 3 (as after a crash) into another directory.
  train::TrainOptions resumed = straight;
  resumed.resume = (dir.path / "run" / "ckpt-3").string();
  resumed.overrides = {"train.checkpoint_dir=" + (dir.path / "run2").string()};
  const auto rest = train::run_training(resumed);
  ASSERT_EQ(rest["first_step"].get<int64_t>(), 3);
  ASSERT_EQ(rest["loss"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rest["loss"][i].get<double>(), full["loss"][i + 3].get<double>()) << "step " << i + 3;
  }
}

TEST(Trainer, ReportHasLossEvalMemoryAndTime) {
  testing::TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string cfg = dir.write("gpt.toml", gpt_run_config(""));
  train::TrainOptions opt;
  opt.config_path = cfg;
  opt.json = true;
  opt.steps = 3;
  opt.report_path = (dir.path / "report.json").string();
  const auto r = train::run_training(opt);
  EXPECT_EQ(r["loss"].size(), 3u);
  EXPECT_FALSE(r["eval"].empty());
  EXPECT_GT(r["eval"].back()["loss"].get<double>(), 0);
  EXPECT_GT(r["memory"]["peak_bytes"].get<int64_t>(), 0);
  EXPECT_GT(r["memory"]["breakdown_at_peak"]["parameters"].get<int64_t>(), 0);
  EXPECT_GT(r["memory"]["breakdown_at_peak"]["saved_activations"].get<int64_t>(), 0);
  EXPECT_GT(r["time"]["step_ms_median"].get<double>(), 0);
  EXPECT_TRUE(fs::exists(opt.report_path));
  EXPECT_FALSE(fs::exists(opt.report_path + ".tmp"));
}


TEST(Trainer, BadConfigsNameFileKeyAndExpectedForm) {
  testing::TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string base = gpt_run_config("");
  train::TrainOptions opt;
  opt.json = true;
  opt.config_path = dir.write("typo.toml", base + "lerning_rate=3\n");
  expect_error_containing([&] { train::run_training(opt); }, {"typo.toml", "train.lerning_rate", "unknown key"});
  opt.config_path = dir.write("type.toml", std::string(tiny_model("gpt")) + "[train]\nbatch_size='big'\n");
  expect_error_containing([&] { train::run_training(opt); }, {"type.toml", "train.batch_size", "an integer"});
  opt.config_path = dir.write("choice.toml", base + "[optim]\nname='adam'\n");
  // (a duplicate [optim] table is a TOML error; both forms must be reported with the file)
  expect_error_containing([&] { train::run_training(opt); }, {"choice.toml"});
  opt.config_path = dir.write("choice2.toml", std::string(tiny_model("gpt")) + "[optim]\nname='adam'\n");
  expect_error_containing([&] { train::run_training(opt); }, {"choice2.toml", "optim.name", "\"adamw\", \"sgd\""});
  opt.config_path = dir.write("model.toml", "[model]\ntype='resnet'\n");
  expect_error_containing([&] { train::run_training(opt); }, {"resnet", "mlp", "gpt"});
  opt.config_path = (dir.path / "missing.toml").string();
  expect_error_containing([&] { train::run_training(opt); }, {"missing.toml"});
  opt.config_path = dir.write("ok.toml", base);
  opt.overrides = {"nodot=3"};
  expect_error_containing([&] { train::run_training(opt); }, {"nodot", "section.key=value"});
}

TEST(Config, BytesAndOverrides) {
  Config c = Config::from_string("[memory]\nbudget='1.5G'\n[train]\nsteps=3\n", "m.toml");
  c.set_override("train.steps=7");
  c.set_override("optim.lr=3e-4");
  EXPECT_EQ(c.get_bytes("memory.budget", 0), static_cast<int64_t>(1.5 * 1024 * 1024 * 1024));
  EXPECT_EQ(c.get_int("train.steps", 0), 7);
  EXPECT_DOUBLE_EQ(c.get_double("optim.lr", 0), 3e-4);
  EXPECT_NO_THROW(c.check_all_used());
  EXPECT_THROW(c.get_int("optim.lr", 0), Error);
}

}  // namespace
}  // namespace ration
