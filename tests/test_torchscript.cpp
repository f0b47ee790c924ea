// TorchScript import (docs/TORCHSCRIPT.md): PyTorch modules exported at test time by
// scripts/export_model.py with Debian's python3-torch (tests/torchscript/models.py, torchvision models
// when python3-torchvision is installed), trained in ration's autograd.
// Oracles: gradients against libtorch autograd running the same TorchScript module (the TorchScript
// interpreter), worst relative error <= 1e-5; under --memory-budget the planner's predicted peak against the
// measured one and gradients bitwise equal to unconstrained; a trained model's checkpoint scored by the
// original PyTorch module in PyTorch.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "test_util.h"

#include <torch/csrc/jit/serialization/import.h>

#include "ration/data/tensor_file.h"
#include "ration/models/torchscript.h"
#include "ration/plan/planner.h"
#include "ration/runtime/budget.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/checkpoint.h"
#include "ration/train/gradcheck.h"
#include "ration/train/setup.h"
#include "ration/train/trainer.h"

namespace ration {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

const char* kPython = "/usr/bin/python3";
const std::string kSource = RATION_SOURCE_DIR;

bool python_has(const std::string& module) {
  const std::string cmd = std::string(kPython) + " -c 'import " + module + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Skips the test (with the reason) when python3-torch, or torchvision for a torchvision model, is missing.
#define REQUIRE_PYTHON_TORCH(needs_torchvision)                                                            \
  do {                                                                                                     \
    if (!python_has("torch")) GTEST_SKIP() << "python3-torch is not installed: cannot export a module";    \
    if ((needs_torchvision) && !python_has("torchvision"))                                                 \
      GTEST_SKIP() << "python3-torchvision is not installed (scripts/install-deps.sh installs it)";       \
  } while (0)

// Runs scripts/export_model.py --out DIR ARGS; fails the test with its output when it fails.
void export_model(const fs::path& dir, const std::string& args) {
  const std::string log = (dir / "export.log").string();
  const std::string cmd = std::string(kPython) + " " + kSource + "/scripts/export_model.py --out " + dir.string() + " " +
                          args + " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << testing::read_file(log);
}

std::string model_file_args(const std::string& name) {
  return "--file " + kSource + "/tests/torchscript/models.py --name " + name;
}

train::Setup setup_of(const fs::path& dir, std::vector<std::string> overrides = {}) {
  return train::build_setup(train::load_config((dir / "config.toml").string(), overrides));
}

models::TorchScriptModel& imported(train::Setup& s) { return dynamic_cast<models::TorchScriptModel&>(*s.model); }

// TwoInputs: forward(tokens (B, 16) int64, features (B, 6) float); its data files hold "inputs": (tokens, features).
const std::string kTwoInputsArgs = model_file_args("TwoInputs") +
                                   " --input-shape 16 --input-dtype long --vocab 50 --input-shape 6 --input-dtype float";

struct GradCase {
  std::string name;
  std::string export_args;
  bool torchvision = false;
  int64_t batch = 4;
  std::string generic_op;  // an op that must run through the generic node ("" : none required)
  std::string native_op;   // an op that must run as ration's own ("" : none required)
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

std::vector<GradCase> grad_cases() {
  return {
      {"cnn", model_file_args("SmallCNN") + " --input-shape 1,16,16", false, 8, ""},
      {"bert", model_file_args("BertEncoder") + " --input-shape 16 --input-dtype long --vocab 50", false, 4, ""},
      {"unet", model_file_args("UNetSmall") + " --input-shape 1,16,16", false, 4, "aten::upsample_nearest2d"},
      {"lstm", model_file_args("LSTMClassifier") + " --input-shape 12,6", false, 4, "", "aten::lstm"},
      // both directions, time-major, no biases
      {"bilstm", model_file_args("LSTMClassifier") +
                     " --kwargs \"{'bidirectional': True, 'batch_first': False, 'bias': False}\" --input-shape 12,6",
       false, 4, "", "aten::lstm"},
      // dropout between the layers in training mode: ration's masks, which the oracle's forward reuses
      {"lstm_dropout", model_file_args("LSTMClassifier") + " --kwargs \"{'dropout': 0.25}\" --input-shape 12,6", false,
       4, "", "aten::lstm"},
      {"returns_loss", model_file_args("ReturnsLoss") + " --input-shape 16 --loss ''", false, 8, ""},
      {"resnet18", "--torchvision resnet18 --input-shape 3,32,32", true, 2, "aten::adaptive_avg_pool2d"},
      {"mobilenet_v2", "--torchvision mobilenet_v2 --input-shape 3,32,32", true, 2, ""},
      {"vgg11_bn", "--torchvision vgg11_bn --input-shape 3,32,32", true, 2, ""},
      {"two_inputs", kTwoInputsArgs, false, 8, ""},
  };
}

GradCase grad_case(const std::string& name) {
  for (const GradCase& c : grad_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no grad case " + name);
}

class TorchScriptGrad : public ::testing::TestWithParam<GradCase> {};

// One step differentiated by ration (native ops and generic nodes) against libtorch autograd running the
// TorchScript module itself, on the same batch and weights.
TEST_P(TorchScriptGrad, GradientsMatchLibtorchAutogradOnTheModule) {
  const GradCase& c = GetParam();
  REQUIRE_PYTHON_TORCH(c.torchvision);
  TempDir dir("ts-grad-" + c.name);
  export_model(dir.path, c.export_args + " --data 16,8");
  train::Setup setup = setup_of(dir.path);
  setup.model->train();
  const data::Batch batch = train::sample_batch(setup, c.batch, 7);
  train::StepRuntime runtime;
  const GradcheckResult r = gradcheck(runtime, *setup.model, batch, 7, 1e-5);
  for (const ParamGradError& e : r.params)
    EXPECT_LE(e.max_rel_error, 1e-5) << e.name << " max abs error " << e.max_abs_error;
  EXPECT_TRUE(r.passed) << "worst relative error " << r.worst_rel_error;
  EXPECT_NEAR(r.loss_ours, r.loss_torch, 1e-5 * std::max(1.0, std::abs(r.loss_torch)));
  std::printf("[ %s ] worst relative gradient error vs libtorch autograd: %.3g over %zu parameters\n", c.name.c_str(),
              r.worst_rel_error, r.params.size());
  // 0 against 0 would pass too: (nearly) every parameter must get a gradient. Not all: a training-mode
  // batch norm's input gradient sums to 0 over (N, H, W), so a bias whose output reaches only a 1x1
  // convolution into batch norm gets exactly 0 (mobilenet_v2's last projections), on both sides.
  const train::StepStats ours = engine_step(runtime, *setup.model, batch, 7);
  size_t nonzero = 0;
  for (const auto& [name, g] : ours.gradients) nonzero += g.abs().max().item<double>() > 0 ? 1 : 0;
  EXPECT_GE(static_cast<double>(nonzero), 0.9 * static_cast<double>(ours.gradients.size()))
      << nonzero << " of " << ours.gradients.size() << " parameters got a gradient";
  const auto& routes = imported(setup).runner().routes();
  int64_t native = 0;
  for (const auto& [kind, route] : routes) native += route.native;
  EXPECT_GT(native, 0) << "no op ran as ration's own";
  if (!c.generic_op.empty()) {
    ASSERT_TRUE(routes.count(c.generic_op) > 0) << c.generic_op << " did not run";
    EXPECT_GT(routes.at(c.generic_op).generic, 0) << c.generic_op << " should run through the generic node";
  }
  if (!c.native_op.empty()) {
    ASSERT_TRUE(routes.count(c.native_op) > 0) << c.native_op << " did not run";
    EXPECT_GT(routes.at(c.native_op).native, 0) << c.native_op << " should run as ration's own op";
    EXPECT_EQ(routes.at(c.native_op).generic, 0) << c.native_op << " ran through the generic node";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TorchScriptGrad, ::testing::ValuesIn(grad_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& i) { return i.param.name; });

void expect_same_gradients(const train::StepStats& a, const train::StepStats& b) {
  ASSERT_EQ(a.gradients.size(), b.gradients.size());
  for (size_t i = 0; i < a.gradients.size(); ++i)
    EXPECT_TRUE(at::equal(a.gradients[i].second, b.gradients[i].second)) << a.gradients[i].first << " differs";
}

class TorchScriptBudget : public ::testing::TestWithParam<GradCase> {};

// Three budgets strictly between the feasible minimum and the unconstrained peak: the measured peak fits
// the budget, the prediction equals the measurement (within 5%, as for the built-in models), and
// gradients are bitwise those of the unconstrained step — generic nodes included.
TEST_P(TorchScriptBudget, PredictedPeakIsMeasuredGradientsBitwiseEqual) {
  const GradCase& c = GetParam();
  REQUIRE_PYTHON_TORCH(c.torchvision);
  TempDir dir("ts-budget-" + c.name);
  export_model(dir.path, c.export_args + " --data 16,8");
  train::Setup setup = setup_of(dir.path);
  setup.model->train();
  const data::Batch batch = train::sample_batch(setup, c.batch, 3);
  const train::StepOptions step = train::StepOptions::collecting(11);
  train::StepRuntime runtime, plain_runtime;
  const memory::StepProfile& profile = runtime.profile(*setup.model, batch, 11);
  const train::StepStats plain = plain_runtime.measure_step(*setup.model, batch, step);
  const int64_t base = profile.baseline_bytes;
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const memory::Plan loose = memory::make_plan(profile, probe);
  const int64_t hi = loose.unconstrained_peak_bytes, lo = loose.minimum_peak_bytes;
  ASSERT_LT(lo, hi) << "planner found no saving at all";
  for (double f : {0.75, 0.5, 0.25}) {
    memory::PlanOptions o;
    o.budget_bytes = lo + static_cast<int64_t>(f * static_cast<double>(hi - lo));
    const memory::Plan& plan = runtime.plan(o);
    const train::StepStats m = runtime.measure_step(*setup.model, batch, step);
    SCOPED_TRACE("budget " + memory::format_bytes(o.budget_bytes) + ": " + plan.to_table());
    EXPECT_LE(m.peak_above_baseline(), o.budget_bytes - base) << "measured peak over budget";
    const int64_t predicted = plan.prediction.peak_bytes - base;
    EXPECT_LE(std::abs(static_cast<double>(predicted - m.peak_above_baseline())),
              0.05 * static_cast<double>(m.peak_above_baseline()))
        << "predicted " << predicted << " measured " << m.peak_above_baseline() << " (above baseline)";
    std::printf("[ %s ] budget %s (min %s, unconstrained %s): predicted %lld, measured %lld bytes above baseline\n",
                c.name.c_str(), memory::format_bytes(o.budget_bytes).c_str(), memory::format_bytes(lo).c_str(),
                memory::format_bytes(hi).c_str(), static_cast<long long>(predicted),
                static_cast<long long>(m.peak_above_baseline()));
    expect_same_gradients(m, plain);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TorchScriptBudget,
                         ::testing::Values(grad_case("cnn"), grad_case("bert"), grad_case("unet"),
                                           grad_case("two_inputs"), grad_case("lstm")),
                         [](const ::testing::TestParamInfo<GradCase>& i) { return i.param.name; });

// torchvision's ResNet-18: the floor's descents, largest values first, release the stem's two big maps and
// stall at the stem's own re-run in backward; the restarts keep the stem and release the blocks' values
// (what torch.utils.checkpoint per block does by hand), for a lower floor. A budget between the two floors
// is met: measured within it, predicted as measured (5%), gradients bitwise those of the plain step.
TEST(TorchScriptFloor, ResNetFloorRestartsKeepTheStemAndGoLower) {
  REQUIRE_PYTHON_TORCH(true);
  TempDir dir("ts-floor-resnet18");
  export_model(dir.path, "--torchvision resnet18 --input-shape 3,160,160 --data 8,8");
  train::Setup setup = setup_of(dir.path);
  setup.model->train();
  const data::Batch batch = train::sample_batch(setup, 4, 3);
  const train::StepOptions step = train::StepOptions::collecting(11);
  train::StepRuntime runtime, plain_runtime;
  const memory::StepProfile& profile = runtime.profile(*setup.model, batch, 11);
  const train::StepStats plain = plain_runtime.measure_step(*setup.model, batch, step);
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const int64_t floor = memory::make_plan(profile, probe).minimum_peak_bytes;
  probe.floor_restarts = false;
  const int64_t without = memory::make_plan(profile, probe).minimum_peak_bytes;
  std::printf("[ resnet18 160x160, batch 4 ] floor %lld B with restarts, %lld B without\n", static_cast<long long>(floor),
              static_cast<long long>(without));
  ASSERT_LT(floor, without) << "the restarts did not lower resnet18's floor";
  memory::PlanOptions o;
  o.budget_bytes = floor + (without - floor) / 2;
  const memory::Plan& plan = runtime.plan(o);
  const train::StepStats m = runtime.measure_step(*setup.model, batch, step);
  SCOPED_TRACE(plan.to_table());
  const int64_t base = profile.baseline_bytes, predicted = plan.prediction.peak_bytes - base;
  EXPECT_LE(m.peak_above_baseline(), o.budget_bytes - base) << "measured peak over budget";
  EXPECT_LE(std::abs(static_cast<double>(predicted - m.peak_above_baseline())), 0.05 * static_cast<double>(m.peak_above_baseline()))
      << "predicted " << predicted << " measured " << m.peak_above_baseline() << " (above baseline)";
  expect_same_gradients(m, plain);
}

// Offload (threshold mode, host tier, every saved value of at least 1 byte copied out and back): the
// gradients of an imported model with generic nodes (aten::upsample_nearest2d) are bitwise those of the plain step, and
// the profiled nodes carry the module paths of the PyTorch module (what traces and plans show).
TEST(TorchScriptRuntime, OffloadIsBitwiseAndNodesCarryModulePaths) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-offload");
  export_model(dir.path, model_file_args("UNetSmall") + " --input-shape 1,16,16 --data 16,8");
  train::Setup setup = setup_of(dir.path, {"offload.enabled=true", "offload.tier=host", "offload.min_bytes=1"});
  setup.model->train();
  const data::Batch batch = train::sample_batch(setup, 4, 3);
  const train::StepOptions step = train::StepOptions::collecting(11);
  train::StepRuntime offloading(train::read_memory_settings(setup.config)), plain;
  ASSERT_EQ(offloading.mode(), train::MemoryMode::Thresholds);
  const train::StepStats a = plain.measure_step(*setup.model, batch, step);
  const train::StepStats b = offloading.measure_step(*setup.model, batch, step);
  EXPECT_GT(b.offload.offloaded_values, 0) << "nothing was offloaded";
  expect_same_gradients(a, b);
  const memory::StepProfile& profile = plain.profile(*setup.model, batch, 11);
  bool conv_in_module = false, generic_upsample = false;
  for (const memory::ProfiledNode& n : profile.nodes) {
    conv_in_module = conv_in_module || (n.op == "conv2d" && n.scope == "down1.0");
    generic_upsample = generic_upsample || (n.op == "generic:aten::upsample_nearest2d" && n.scope == "up");
  }
  EXPECT_TRUE(conv_in_module) << "no conv2d node in scope down1.0";
  EXPECT_TRUE(generic_upsample) << "no generic upsample node in scope up";
}

// Batch-norm buffers after one training forward: what PyTorch's own module (the same file, loaded a
// second time and run by the TorchScript interpreter) holds — running statistics to a few ulps (ration
// folds the batch statistics in outside its op, norm.cpp), num_batches_tracked exactly.
TEST(TorchScriptRuntime, BatchNormBuffersUpdatedAsInPyTorch) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-buffers");
  export_model(dir.path, model_file_args("SmallCNN") + " --input-shape 1,16,16 --data 16,8");
  train::Setup setup = setup_of(dir.path);
  setup.model->train();
  const data::Batch batch = train::sample_batch(setup, 8, 5);
  setup.model->loss(batch).backward();
  torch::jit::Module reference = torch::jit::load((dir.path / "model.pt").string());
  reference.train(true);
  {
    at::NoGradGuard no_grad;
    reference.forward({batch.input.tensor()});
  }
  std::map<std::string, at::Tensor> theirs;
  for (const auto& b : reference.named_buffers()) theirs[b.name] = b.value;
  const auto ours = setup.model->named_buffers();
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& [name, t] : ours) {
    ASSERT_TRUE(theirs.count(name) > 0) << name << " is not a buffer of the PyTorch module";
    if (name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(t.item<int64_t>(), 1) << name;
      EXPECT_TRUE(at::equal(t, theirs[name])) << name;
    } else {
      EXPECT_TRUE(at::allclose(t, theirs[name], 1e-6, 1e-7)) << name << " differs from PyTorch's";
    }
  }
}

// ---- bad input: clear errors naming the file, the op or the key -------------------------------------------
TEST(TorchScriptErrors, NotTorchScriptNamesTheFile) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-not-script");
  export_model(dir.path, model_file_args("SmallCNN") + " --input-shape 1,16,16 --data 16,8");
  const std::string weights = (dir.path / "weights.pt").string();
  const std::string cmd = std::string(kPython) + " -c \"import torch; torch.save({'w': torch.zeros(2)}, '" + weights + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  testing::expect_error_containing([&] { setup_of(dir.path, {"model.path=" + weights}); },
                                   {weights, "is not a TorchScript module"});
}

TEST(TorchScriptErrors, TiedWeightsAreRefusedNamingBoth) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-tied");
  export_model(dir.path, model_file_args("TiedWeights") + " --input-shape 16 --data 16,8");
  testing::expect_error_containing([&] { setup_of(dir.path); }, {"a.weight", "b.weight", "tied"});
}

TEST(TorchScriptErrors, OpWithoutBackwardNamesTheOp) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-no-backward");
  export_model(dir.path, model_file_args("NoBackward") + " --input-shape 16 --data 16,8");
  train::Setup setup = setup_of(dir.path);
  const data::Batch batch = train::sample_batch(setup, 4, 1);
  train::StepRuntime runtime;
  testing::expect_error_containing([&] { engine_step(runtime, *setup.model, batch, 1); },
                                   {"aten::nextafter", "has no backward"});
}

TEST(TorchScriptErrors, ForwardNeedingAPythonObjectNamesTheArgument) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-needs-object");
  export_model(dir.path, model_file_args("NeedsPythonObject") + " --input-shape 16 --data 16,8");
  testing::expect_error_containing([&] { setup_of(dir.path); },
                                   {"model.pt", "forward argument 'options' is Dict[str, float]", "tensors only"});
}

TEST(TorchScriptErrors, WrongInputShapeNamesTheOpAndModule) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-shape");
  export_model(dir.path, model_file_args("SmallCNN") + " --input-shape 1,16,16 --data 16,8");
  train::Setup setup = setup_of(dir.path);
  data::Batch batch = train::sample_batch(setup, 4, 1);
  batch.input = Value(at::randn({4, 3, 16, 16}));  // three channels for a one-channel conv
  testing::expect_error_containing([&] { setup.model->loss(batch); }, {"aten::conv2d", "conv1", "[4, 3, 16, 16]"});
}

TEST(TorchScriptErrors, DataFileWithoutTargetNamesTheFileAndKey) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-no-target");
  const std::string file = (dir.path / "train.pt").string();
  const std::string cmd = std::string(kPython) + " -c \"import torch; torch.save({'inputs': torch.zeros(4, 2), 'labels': torch.zeros(4)}, '" + file + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  testing::expect_error_containing([&] { data::TensorFile f(file); }, {file, "no key \"target\"", "labels"});
}

// A data file whose "inputs" count is not what forward takes: refused at set-up, naming the file, the key and
// the count forward expects.
TEST(TorchScriptErrors, InputsCountNotForwardsArityNamesFileKeyAndCount) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-arity");
  export_model(dir.path, kTwoInputsArgs + " --data 16,8");
  const std::string file = (dir.path / "one_input.pt").string();
  const std::string cmd = std::string(kPython) + " -c \"import torch; torch.save({'inputs': torch.zeros(4, 16, "
                          "dtype=torch.long), 'target': torch.zeros(4, dtype=torch.long)}, '" + file + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  testing::expect_error_containing([&] { setup_of(dir.path, {"data.train=" + file}); },
                                   {file, "\"inputs\" holds 1 tensor(s)", "takes 2 input(s)"});
}

TEST(TorchScriptErrors, InputsOfDifferentLengthsAreNamed) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-lengths");
  const std::string file = (dir.path / "d.pt").string();
  const std::string cmd = std::string(kPython) + " -c \"import torch; torch.save({'inputs': (torch.zeros(5, 2), "
                          "torch.zeros(4, 3)), 'target': torch.zeros(5)}, '" + file + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  testing::expect_error_containing([&] { data::TensorFile f(file); }, {file, "inputs[1]", "4 items", "inputs[0]", "5"});
}

// ---- data files ------------------------------------------------------------------------------------------
TEST(TorchScriptData, TensorFileBatchesTheInputAndTheTarget) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-data");
  const std::string file = (dir.path / "d.pt").string();
  const std::string cmd = std::string(kPython) + " -c \"import torch; torch.save({'inputs': torch.arange(10.).view(5, 2), "
                          "'target': torch.arange(5) * 10}, '" + file + "')\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  data::TensorFile f(file);
  ASSERT_EQ(f.size(), 5);
  EXPECT_TRUE(f.class_target());
  const data::Batch b = f.get({3, 1});
  EXPECT_TRUE(at::equal(b.input.tensor(), at::tensor({6.f, 7.f, 2.f, 3.f}).view({2, 2})));
  EXPECT_TRUE(at::equal(b.target.tensor(), at::tensor({30, 10}, at::kLong)));
}

// "inputs": (a, b) or [a, b]: every input and the target take the same items, in the batch's order.
TEST(TorchScriptData, TensorFileBatchesSeveralInputsTogether) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-data-two");
  for (const char* wrap : {"tuple", "list"}) {
    const std::string file = (dir.path / (std::string(wrap) + ".pt")).string();
    const std::string cmd = std::string(kPython) + " -c \"import torch; torch.save({'inputs': " + wrap +
                            "([torch.arange(10.).view(5, 2), torch.arange(5) + 100, torch.arange(15.).view(5, 3, 1)]), "
                            "'target': torch.arange(5) * 10}, '" + file + "')\"";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    data::TensorFile f(file);
    ASSERT_EQ(f.num_inputs(), 3u) << wrap;
    const data::Batch b = f.get({3, 1});
    EXPECT_TRUE(at::equal(b.input.tensor(), at::tensor({6.f, 7.f, 2.f, 3.f}).view({2, 2}))) << wrap;
    ASSERT_EQ(b.extra_inputs.size(), 2u) << wrap;
    EXPECT_TRUE(at::equal(b.extra_inputs[0].tensor(), at::tensor({103, 101}, at::kLong))) << wrap;
    EXPECT_TRUE(at::equal(b.extra_inputs[1].tensor(), at::tensor({9.f, 10.f, 11.f, 3.f, 4.f, 5.f}).view({2, 3, 1})));
    EXPECT_TRUE(at::equal(b.target.tensor(), at::tensor({30, 10}, at::kLong))) << wrap;
  }
}

// Two inputs per item through the loader: shuffled batches keep every item's tokens, features and class
// together (a token of each item names its class, export_model.py), and a resumed loader hands out the
// same batches as one that never stopped.
TEST(TorchScriptData, SeveralInputsShuffleAndResumeTogether) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-data-resume");
  export_model(dir.path, kTwoInputsArgs + " --data 40,8");
  auto set = std::make_shared<data::TensorFile>((dir.path / "train.pt").string());
  const data::Batch all = set->get({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                    22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39});
  data::LoaderOptions o;
  o.batch_size = 6;
  o.seed = 3;
  data::Loader straight(set, o), resumed(set, o);
  for (int i = 0; i < 4; ++i) resumed.next();
  data::Loader second(set, o);
  second.set_position(resumed.position());
  for (int step = 0; step < 12; ++step) {
    const data::Batch a = straight.next();
    if (step < 4) continue;
    const data::Batch b = second.next();
    EXPECT_TRUE(at::equal(a.input.tensor(), b.input.tensor())) << "step " << step;
    ASSERT_EQ(b.extra_inputs.size(), 1u);
    EXPECT_TRUE(at::equal(a.extra_inputs[0].tensor(), b.extra_inputs[0].tensor())) << "step " << step;
    EXPECT_TRUE(at::equal(a.target.tensor(), b.target.tensor())) << "step " << step;
    // Each row is the same item in all three tensors: find it in the whole set by its tokens.
    for (int64_t r = 0; r < b.input.size(0); ++r) {
      const at::Tensor match = (all.input.tensor() == b.input.tensor()[r]).all(1).nonzero().flatten();
      ASSERT_EQ(match.numel(), 1);
      const int64_t item = match.item<int64_t>();
      EXPECT_TRUE(at::equal(all.extra_inputs[0].tensor()[item], b.extra_inputs[0].tensor()[r]));
      EXPECT_EQ(all.target.tensor()[item].item<int64_t>(), b.target.tensor()[r].item<int64_t>());
    }
  }
}

// Trained inside a budget halfway between the trainer's unconstrained peak and the feasible minimum (the
// probe's saving range, taken off the peak of a short unconstrained run): `ration train` with two inputs per
// item learns (evaluation above chance), stays within the budget, and predicts its measured peak.
TEST(TorchScriptRoundTrip, TwoInputsTrainUnderABudget) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-two-train");
  export_model(dir.path, kTwoInputsArgs + " --data 512,128");
  train::Setup setup = setup_of(dir.path);
  setup.model->train();
  train::StepRuntime runtime;
  const memory::StepProfile& profile = runtime.profile(*setup.model, train::sample_batch(setup, 32, 1), 1);
  memory::PlanOptions probe;
  probe.budget_bytes = int64_t{1} << 40;
  const memory::Plan loose = memory::make_plan(profile, probe);
  train::TrainOptions plain;
  plain.config_path = (dir.path / "config.toml").string();
  plain.overrides = {"train.steps=2", "train.log_every=1000", "train.checkpoint_dir="};
  plain.json = true;
  const int64_t peak = train::run_training(plain)["memory"]["peak_bytes"].get<int64_t>();
  const int64_t budget = peak - (loose.unconstrained_peak_bytes - loose.minimum_peak_bytes) / 2;
  train::TrainOptions o;
  o.config_path = (dir.path / "config.toml").string();
  o.overrides = {"train.epochs=4", "optim.lr=0.03", "train.log_every=1000", "train.checkpoint_dir=",
                 "memory.budget=" + std::to_string(budget)};
  o.json = true;
  const nlohmann::json report = train::run_training(o);
  ASSERT_FALSE(report["eval"].empty());
  const double accuracy = report["eval"].back()["accuracy"].get<double>();
  const nlohmann::json& mem = report["memory"];
  ASSERT_TRUE(mem.contains("predicted_peak_bytes")) << mem.dump();
  std::printf("[ two_inputs ] budget %s: test accuracy %.4f, predicted peak %lld, measured %lld bytes\n",
              memory::format_bytes(budget).c_str(), accuracy, mem["predicted_peak_bytes"].get<long long>(),
              mem["peak_bytes"].get<long long>());
  EXPECT_TRUE(mem["within_budget"].get<bool>()) << mem.dump();
  EXPECT_LE(std::abs(mem["prediction_error"].get<double>()), 0.05) << mem.dump();
  EXPECT_GT(accuracy, 0.5) << "the model did not learn the synthetic task (10 classes)";
}

// ---- a trained model goes back to PyTorch -----------------------------------------------------------------
// Trains the cnn-sized model with ration, then loads the checkpoint's model.pt into the original PyTorch
// module (load_state_dict) and scores the test file in PyTorch: the same accuracy as ration's evaluation.
TEST(TorchScriptRoundTrip, TrainedCheckpointScoresTheSameAccuracyInPyTorch) {
  REQUIRE_PYTHON_TORCH(false);
  TempDir dir("ts-roundtrip");
  export_model(dir.path, model_file_args("SmallCNN") + " --input-shape 1,16,16 --data 512,256");
  train::TrainOptions o;
  o.config_path = (dir.path / "config.toml").string();
  o.overrides = {"train.checkpoint_dir=" + (dir.path / "run").string(), "train.epochs=2", "optim.lr=0.003",
                 "train.log_every=1000"};
  o.json = true;
  const nlohmann::json report = train::run_training(o);
  ASSERT_FALSE(report["eval"].empty());
  const double ours = report["eval"].back()["accuracy"].get<double>();
  EXPECT_GT(ours, 0.5) << "the model did not learn the synthetic task (10 classes)";
  const std::string ckpt = train::resolve_checkpoint((dir.path / "run").string());
  const std::string out = (dir.path / "pytorch_accuracy.txt").string();
  const std::string script =
      "import sys, torch; sys.path.insert(0, '" + kSource + "/tests/torchscript'); import models; "
      "m = models.SmallCNN(); m.load_state_dict(torch.load('" + ckpt + "/model.pt')); m.eval(); "
      "d = torch.load('" + (dir.path / "test.pt").string() + "'); "
      "acc = (m(d['inputs']).argmax(1) == d['target']).float().mean().item(); open('" + out + "', 'w').write(repr(acc))";
  ASSERT_EQ(std::system((std::string(kPython) + " -c \"" + script + "\"").c_str()), 0);
  const double theirs = std::stod(testing::read_file(out));
  std::printf("[ roundtrip ] test accuracy: ration %.4f, PyTorch on the checkpoint %.4f\n", ours, theirs);
  EXPECT_NEAR(ours, theirs, 1.0 / 256 + 1e-9) << "at most one of 256 test items may flip on rounding";
}

}  // namespace
}  // namespace ration
