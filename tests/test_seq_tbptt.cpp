// test_seq_tbptt.cpp — truncated backpropagation through time in `ration train` (train.tbptt = C;
// docs/METHODS.md, "Temporal-dependency buffers for sequence models", "Training with long sequences"):
//   * a tbptt run's parameters after k steps equal a hand-rolled reference (the LSTM unrolled with
//     ops::lstm_cell, state detached at every chunk boundary, SGD by hand) on the same batches;
//   * with C >= T a tbptt run is ordinary training, bit for bit (losses and parameters);
//   * a tbptt run resumed from a checkpoint continues exactly;
//   * the step runtime runs a piecewise step as one step for its hooks (one gradient_ready per parameter);
//   * errors: train.tbptt = 0 or negative, a type-3 layer (named), tbptt with a memory budget.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

#include "ration/base/check.h"
#include "ration/data/dataset.h"
#include "ration/models/lstm_lm.h"
#include "ration/ops/ops.h"
#include "ration/streaming/tbptt.h"
#include "ration/train/checkpoint.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"
#include "test_util.h"

namespace ration::testing {
namespace {
namespace fs = std::filesystem;

// T = 24 (not a multiple of 7), batch 3, plain SGD at a constant rate: the reference is easy to write.
std::string lstm_run(const std::string& ckpt_dir, const std::string& extra_train = "") {
  return "[model]\ntype='lstm_lm'\nvocab_size=256\nn_embd=6\nhidden_size=8\nn_layer=2\n"
         "[data]\nkind='text'\nseq_len=24\n"
         "[optim]\nname='sgd'\nlr=0.5\nmomentum=0.0\nschedule='constant'\n"
         "[train]\nbatch_size=3\nsteps=4\neval_every=100\neval_batches=1\nlog_every=100\nthreads=1\n"
         "checkpoint_every=2\ncheckpoint_dir='" +
         ckpt_dir + "'\n" + extra_train;
}

nlohmann::json train_run(const std::string& cfg, const std::vector<std::string>& overrides = {},
                         const std::string& resume = "") {
  train::TrainOptions o;
  o.config_path = cfg;
  o.overrides = overrides;
  o.json = true;
  o.resume = resume;
  return train::run_training(o);
}

std::map<std::string, at::Tensor> saved_weights(const fs::path& ckpt) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : train::load_checkpoint(ckpt.string()).weights) out[name] = t;
  return out;
}

// The reference: the same model and batches, the LSTM unrolled here step by step with ops::lstm_cell; at
// every chunk boundary (h, c) continue as data (detached); each chunk's mean loss times n / T is
// backpropagated on its own; then p -= lr * grad.
std::map<std::string, at::Tensor> hand_rolled(const std::string& cfg_path, int64_t chunk, int64_t steps, double lr) {
  train::Setup setup = train::build_setup(train::load_config(cfg_path, {}));
  auto& m = dynamic_cast<models::LSTMLM&>(*setup.model);
  m.train();
  data::Loader loader(setup.train_set, {setup.batch_size, /*shuffle=*/true, setup.seed, /*drop_last=*/true});
  const int64_t H = m.options.hidden_size, L = m.options.n_layer;
  for (int64_t step = 0; step < steps; ++step) {
    const data::Batch batch = loader.next();
    const at::Tensor tokens = batch.input.tensor(), targets = batch.target.tensor();
    const int64_t B = tokens.size(0), T = tokens.size(1);
    std::vector<at::Tensor> h(L, at::zeros({B, H})), c(L, at::zeros({B, H}));
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t n = std::min(chunk, T - s);
      Value x = m.embed->forward(Value(tokens.narrow(1, s, n).contiguous()));  // (B, n, E)
      const int64_t E = x.size(2);
      Values layer_in = ops::split(ops::reshape(x, {B, n * E}), E, 1);  // n x (B, E)
      for (int64_t l = 0; l < L; ++l) {
        Value hv(h[l]), cv(c[l]);
        Values outs;
        for (int64_t t = 0; t < n; ++t) {
          Values hc = ops::lstm_cell(layer_in[t], hv, cv, m.lstm->w_ih[l], m.lstm->w_hh[l], m.lstm->b_ih[l],
                                     m.lstm->b_hh[l]);
          hv = hc[0];
          cv = hc[1];
          outs.push_back(hv);
        }
        h[l] = hv.tensor().detach().clone();
        c[l] = cv.tensor().detach().clone();
        layer_in = outs;
      }
      Value logits = m.head->forward(ops::reshape(ops::cat(layer_in, 1), {B, n, H}));  // (B, n, V)
      Value loss = ops::cross_entropy(ops::reshape(logits, {B * n, -1}),
                                      Value(targets.narrow(1, s, n).reshape({-1})));
      ops::mul_scalar(loss, static_cast<double>(n) / static_cast<double>(T)).backward();
    }
    NoGradGuard no_grad;
    for (auto& p : m.parameters()) {
      p.tensor().sub_(p.grad() * lr);
    }
    m.zero_grad();
  }
  std::map<std::string, at::Tensor> out;
  for (auto& [name, p] : m.named_parameters()) out[name] = p.tensor().clone();
  return out;
}

TEST(SeqTbptt, TrainingEqualsHandRolledChunkedReference) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string cfg = dir.write("lstm.toml", lstm_run((dir.path / "run").string(), "tbptt=7\n"));
  train_run(cfg);
  const auto ours = saved_weights(dir.path / "run" / "ckpt-4");
  const auto ref = hand_rolled(cfg, 7, 4, 0.5);
  ASSERT_EQ(ours.size(), ref.size());
  for (auto& [name, t] : ref) {
    ASSERT_TRUE(ours.count(name)) << name;
    EXPECT_LE((ours.at(name) - t).abs().max().item<double>(), 1e-6) << name;
  }
  // The reference differs from full BPTT: the chunks did truncate.
  const auto full = hand_rolled(cfg, 24, 4, 0.5);
  double diff = 0;
  for (auto& [name, t] : ref) diff = std::max(diff, (full.at(name) - t).abs().max().item<double>());
  EXPECT_GT(diff, 1e-5);
}

TEST(SeqTbptt, ChunkAtLeastTheSequenceIsOrdinaryTrainingBitwise) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string plain = dir.write("plain.toml", lstm_run((dir.path / "plain").string()));
  const auto base = train_run(plain);
  const auto base_w = saved_weights(dir.path / "plain" / "ckpt-4");
  for (int64_t C : {24, 100}) {
    SCOPED_TRACE("tbptt " + std::to_string(C));
    const std::string run = "c" + std::to_string(C);
    const std::string cfg = dir.write(run + ".toml", lstm_run((dir.path / run).string(), "tbptt=" + std::to_string(C) + "\n"));
    const auto r = train_run(cfg);
    ASSERT_EQ(r["loss"].size(), base["loss"].size());
    for (size_t i = 0; i < r["loss"].size(); ++i) EXPECT_EQ(r["loss"][i].get<double>(), base["loss"][i].get<double>()) << i;
    const auto w = saved_weights(dir.path / run / "ckpt-4");
    for (auto& [name, t] : base_w) EXPECT_TRUE(at::equal(w.at(name), t)) << name;
  }
}

TEST(SeqTbptt, ResumeFromACheckpointContinuesExactly) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string cfg = dir.write("lstm.toml", lstm_run((dir.path / "run").string(), "tbptt=5\n"));
  const auto full = train_run(cfg);
  ASSERT_TRUE(fs::exists(dir.path / "run" / "ckpt-2"));
  const auto rest = train_run(cfg, {"train.checkpoint_dir=" + (dir.path / "run2").string()},
                              (dir.path / "run" / "ckpt-2").string());
  ASSERT_EQ(rest["first_step"].get<int64_t>(), 2);
  ASSERT_EQ(rest["loss"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(rest["loss"][i].get<double>(), full["loss"][i + 2].get<double>()) << i;
  const auto a = saved_weights(dir.path / "run" / "ckpt-4"), b = saved_weights(dir.path / "run2" / "ckpt-4");
  for (auto& [name, t] : a) EXPECT_TRUE(at::equal(b.at(name), t)) << name;
}

// Hooks see one step: gradient_ready once per parameter, with the gradient of every chunk summed.
struct CountingHook : train::StepHook {
  std::map<std::string, int> ready;
  std::map<std::string, at::Tensor> grads;
  int forwards = 0;
  void after_forward(int64_t, const Value&) override { ++forwards; }
  void gradient_ready(const std::string& name, ValueImpl& p) override {
    ++ready[name];
    grads[name] = p.grad.clone();
  }
};

TEST(SeqTbptt, PiecewiseStepIsOneStepForHooks) {
  Config cfg = Config::from_string("[model]\ntype='lstm_lm'\nvocab_size=11\nn_embd=6\nhidden_size=8\nn_layer=2\n", "t");
  auto model = models::build_model(cfg);
  model->train();
  at::manual_seed(3);
  data::Batch batch;
  batch.input = Value(at::randint(0, 11, {2, 30}, at::kLong));
  batch.target = Value(at::randint(0, 11, {2, 30}, at::kLong));
  batch.items = 2;
  seq::ChunkedLoss chunks(*model, 8);  // 4 chunks
  train::StepRuntime runtime;
  CountingHook hook;
  runtime.add_hook(&hook);
  train::StepOptions o = train::StepOptions::collecting(1);
  o.pieces = &chunks;
  const train::StepStats st = runtime.measure_step(*model, batch, o);
  EXPECT_EQ(hook.forwards, 1);
  ASSERT_EQ(hook.ready.size(), model->named_parameters().size());
  for (auto& [name, n] : hook.ready) EXPECT_EQ(n, 1) << name;
  // What the hook saw is the step's whole gradient, the same as seq::truncated_bptt's.
  seq::StreamExecutor ex(*model, 8, 2);
  const double loss = seq::truncated_bptt(ex, batch.input.tensor(), batch.target.tensor());
  EXPECT_NEAR(st.loss, loss, 1e-12);
  for (auto& [name, p] : model->named_parameters()) EXPECT_TRUE(at::equal(p.grad(), hook.grads.at(name))) << name;
}

TEST(SeqTbptt, BadConfigsAreClearErrors) {
  TempDir dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  const std::string cfg = dir.write("lstm.toml", lstm_run(""));
  expect_error_containing([&] { train_run(cfg, {"train.tbptt=0"}); }, {"lstm.toml", "train.tbptt", ">= 1", "got 0"});
  expect_error_containing([&] { train_run(cfg, {"train.tbptt=-4"}); }, {"train.tbptt", ">= 1", "got -4"});
  expect_error_containing([&] { train_run(cfg, {"train.tbptt=8", "memory.budget=100MB"}); },
                          {"train.tbptt", "memory budget"});
  const std::string gpt = dir.write(
      "gpt.toml",
      "[model]\ntype='gpt'\nn_layer=2\nn_head=2\nn_embd=8\nblock_size=16\n[data]\nkind='text'\n"
      "[train]\nbatch_size=2\nsteps=1\ntbptt=4\nthreads=1\n");
  expect_error_containing([&] { train_run(gpt); },
                          {"gpt.toml", "train.tbptt", "blocks.0.attn", "whole sequence", "model.attention_window"});
  // A windowed gpt is type 2: it trains with tbptt.
  const auto r = train_run(gpt, {"model.attention_window=3", "train.eval_batches=1"});
  EXPECT_EQ(r["loss"].size(), 1u);
}

}  // namespace
}  // namespace ration::testing
