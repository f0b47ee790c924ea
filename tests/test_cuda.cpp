// test_cuda.cpp — the GPU paths: built always, run where ration is built with -DRATION_CUDA=ON and a GPU is
// visible (scripts/gpu-check.sh), skipped elsewhere. Our engine against torch::autograd on CUDA tensors,
// offload through the GPU copy streams, the caching allocator's figures, an NCCL process group.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

#include "ration/distributed/world.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/train/gradcheck.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

namespace ration {
namespace {

bool have_gpu() {
#ifdef RATION_CUDA
  return at::hasCUDA();
#else
  return false;
#endif
}

#define RATION_REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "needs a build with -DRATION_CUDA=ON and a visible GPU"

struct GpuRun {
  train::Setup setup;
  data::Batch batch;
};

// A config of configs/ on train.device = "cuda", one training batch.
GpuRun gpu_run(const std::string& config) {
  GpuRun r;
  r.setup = train::build_setup(
      train::load_config(std::string(RATION_SOURCE_DIR) + "/configs/" + config, {"train.device=cuda"}));
  r.setup.model->train();
  r.batch = train::sample_batch(r.setup, r.setup.batch_size, r.setup.seed);
  return r;
}

TEST(Cuda, EngineGradientsMatchTorchAutogradOnTheGpu) {
  RATION_REQUIRE_GPU();
  std::vector<std::string> configs = {"gpt.toml", "lstm_lm.toml", "tcn_lm.toml"};  // text of base-files
  if (std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    configs.insert(configs.end(), {"cnn.toml", "mlp.toml"});  // Debian's dataset-fashion-mnist
  for (const std::string& config : configs) {
    GpuRun r = gpu_run(config);
    for (const auto& [name, p] : r.setup.model->named_parameters())
      ASSERT_TRUE(p.tensor().is_cuda()) << config << ": " << name << " is not on the GPU";
    train::StepRuntime plain;
    const GradcheckResult g = gradcheck(plain, *r.setup.model, r.batch, r.setup.seed + 1, 1e-4);
    EXPECT_TRUE(g.passed) << config << ": worst relative error " << g.worst_rel_error;
    EXPECT_FALSE(g.params.empty()) << config;
    EXPECT_NEAR(g.loss_ours, g.loss_torch, 1e-5 * std::max(1.0, std::abs(g.loss_torch))) << config;
    EXPECT_TRUE(std::isfinite(g.loss_ours)) << config;
  }
}

// Threshold offload with every value above 16 KiB sent out: the copies run on the engine's copy-out and
// copy-in streams, ordered against the compute stream by events. Gradients must equal the plain step's.
TEST(Cuda, OffloadThroughTheCopyStreamsGivesThePlainGradients) {
  RATION_REQUIRE_GPU();
  GpuRun r = gpu_run("gpt.toml");
  train::StepRuntime plain;
  const train::StepStats a = engine_step(plain, *r.setup.model, r.batch, r.setup.seed + 1);
  for (const char* tier : {"host", "disk"}) {
    train::MemorySettings settings;
    settings.offload.enabled = true;
    settings.offload.options.tier = tier;
    settings.offload.options.t1 = 0;
    settings.offload.options.min_bytes = 16 * 1024;
    train::StepRuntime offload(settings);
    ASSERT_EQ(offload.mode(), train::MemoryMode::Thresholds);
    const train::StepStats b = engine_step(offload, *r.setup.model, r.batch, r.setup.seed + 1);
    ASSERT_EQ(a.gradients.size(), b.gradients.size());
    for (size_t i = 0; i < a.gradients.size(); ++i) {
      ASSERT_TRUE(b.gradients[i].second.is_cuda()) << tier << ": " << b.gradients[i].first;
      EXPECT_TRUE(at::equal(a.gradients[i].second, b.gradients[i].second))
          << tier << ": " << a.gradients[i].first << " differs by "
          << (a.gradients[i].second - b.gradients[i].second).abs().max().item<double>();
    }
    const memory::OffloadStats s = offload.engine()->stats();
    EXPECT_GT(s.offloaded_values, 0) << tier;
    EXPECT_GT(s.read_bytes, 0) << tier;
    EXPECT_EQ(s.read_bytes, s.written_bytes) << tier << ": every value sent out came back";
    EXPECT_EQ(s.fallbacks, 0) << tier;
  }
}

// device_stats reads the CUDA caching allocator: an allocation shows in current and peak bytes, and
// freeing it returns current to where it was.
TEST(Cuda, DeviceStatsReadTheCachingAllocator) {
  RATION_REQUIRE_GPU();
  const at::Device gpu(at::kCUDA, 0);
  const memory::Stats before = memory::device_stats(gpu);
  constexpr int64_t kBytes = 64 << 20;
  at::Tensor t = at::empty({kBytes}, at::TensorOptions().dtype(at::kByte).device(gpu));
  const memory::Stats during = memory::device_stats(gpu);
  EXPECT_EQ(during.current_bytes - before.current_bytes, kBytes);
  EXPECT_GE(during.peak_bytes, during.current_bytes);
  t = at::Tensor();
  EXPECT_EQ(memory::device_stats(gpu).current_bytes, before.current_bytes);
}

// An NCCL process group of one rank (NCCL allows one rank per GPU): rendezvous through a FileStore,
// all-reduce and broadcast of CUDA tensors run through c10d's ProcessGroupNCCL.
TEST(Cuda, NcclProcessGroupRunsCollectives) {
  RATION_REQUIRE_GPU();
  testing::TempDir dir("nccl");
  dist::World world = dist::World::init_from({{"RANK", "0"},
                                              {"WORLD_SIZE", "1"},
                                              {"RATION_STORE_FILE", (dir.path / "store").string()},
                                              {"RATION_DIST_BACKEND", "nccl"}});
  ASSERT_TRUE(world.process_group());
  at::Tensor t = at::arange(1000, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  const at::Tensor expected = t.clone();
  world.all_reduce_sum(t);
  EXPECT_TRUE(at::equal(t, expected));
  world.broadcast(t, 0);
  EXPECT_TRUE(at::equal(t, expected));
}

}  // namespace
}  // namespace ration
