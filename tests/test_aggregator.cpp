// test_aggregator.cpp — the aggregator extension point (distributed/aggregator.h), shown with a toy
// aggregator written in this one file: the reducer calls it in the documented order, its bucket traffic
// and parameter traffic are counted, owns_gradient() gives each rank its own mean gradient, and
// finish() runs once at the end. Also: the factory's table names every combination and refuses the rest.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ration/base/check.h"
#include "ration/distributed/aggregator.h"
#include "ration/distributed/aggregator_factory.h"
#include "ration/distributed/reducer.h"
#include "ration/ops/ops.h"

namespace ration::dist {
namespace {

// A toy topology: every bucket is "sent" by scaling it by `scale` (a stand-in for a codec), the gradient
// is this rank's own when `own` is set, and after every optimiser step the parameters are nudged by
// +1 (a stand-in for a parameter exchange). Every call is logged.
class ToyAggregator : public Aggregator {
 public:
  ToyAggregator(std::vector<std::string>& log, float scale, bool own) : log_(log), scale_(scale), own_(own) {}
  std::string name() const override { return "toy"; }
  void init_buckets(const std::vector<BucketLayout>& layouts) override {
    log_.push_back("init " + std::to_string(layouts.size()));
  }
  void begin_window(const WindowContext& context) override { log_.push_back("window " + std::to_string(context.step)); }
  Traffic on_bucket(const World& world, int bucket, at::Tensor& flat) override {
    log_.push_back("bucket " + std::to_string(bucket));
    flat.mul_(scale_);
    return {flat.numel() * 4, 0};
  }
  bool owns_gradient() const override { return own_; }
  std::optional<Traffic> after_optimizer(const World& world, const std::vector<at::Tensor>& params, int64_t step,
                                         double window_weight) override {
    log_.push_back("after " + std::to_string(step));
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params) p.add_(1.0);
    return Traffic{100, 0};
  }
  std::optional<Traffic> finish(const World& world, const std::vector<at::Tensor>& params) override {
    log_.push_back("finish");
    return std::nullopt;
  }
  nlohmann::json report() override { return {{"toy", true}}; }

 private:
  std::vector<std::string>& log_;
  float scale_;
  bool own_;
};

struct Fixture {
  Value w = parameter(at::ones({2, 3}), "w"), b = parameter(at::zeros({2}), "b");
  at::Tensor x = at::arange(12, at::kFloat).view({4, 3}) / 10;
  at::Tensor y = at::tensor({0, 1, 1, 0}, at::kLong);
  Value loss() { return ops::cross_entropy(ops::linear(Value(x), w, b), Value(y)); }
  // The plain gradient of the same loss, for comparison.
  std::pair<at::Tensor, at::Tensor> plain() {
    loss().backward();
    auto g = std::make_pair(w.grad().clone(), b.grad().clone());
    w.impl()->grad = at::Tensor();
    b.impl()->grad = at::Tensor();
    return g;
  }
};

TEST(Aggregator, ToyPluginIsCalledInOrderAndItsTrafficCounted) {
  Fixture f;
  const auto [dw, db] = f.plain();
  std::vector<std::string> log;
  ReducerOptions ro;
  ro.first_bucket_bytes = 4;  // one parameter per bucket: "b" first (reverse order), then "w"
  Reducer reducer(World::init_single(), {{"w", f.w}, {"b", f.b}},
                  std::make_unique<ToyAggregator>(log, 3.f, /*own=*/false), ro);
  ASSERT_EQ(reducer.buckets().size(), 2u);
  reducer.set_window_context({7});
  reducer.prepare_backward(0.5);  // this rank's share: the bucket holds 0.5 * grad, the toy scales it by 3
  f.loss().backward();
  reducer.finalize();
  EXPECT_TRUE(at::allclose(f.w.grad(), dw * 1.5, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(f.b.grad(), db * 1.5, 1e-6, 1e-7));
  const at::Tensor w_before = f.w.tensor().clone();
  reducer.after_optimizer_step();
  reducer.after_optimizer_step();  // nothing due: not called twice
  EXPECT_TRUE(at::equal(f.w.tensor(), w_before + 1));
  reducer.finish();
  EXPECT_EQ(log, (std::vector<std::string>{"init 2", "window 7", "bucket 0", "bucket 1", "after 7", "finish"}));
  EXPECT_EQ(reducer.stats().traffic.payload_bytes, (2 + 6) * 4 + 100);
  EXPECT_EQ(reducer.stats().synchronizations, 1);
  EXPECT_EQ(reducer.aggregator().name(), "toy");
}

TEST(Aggregator, OwnedGradientIsThisRanksMean) {
  Fixture f;
  const auto [dw, db] = f.plain();
  std::vector<std::string> log;
  Reducer reducer(World::init_single(), {{"w", f.w}, {"b", f.b}}, std::make_unique<ToyAggregator>(log, 5.f, true), {});
  reducer.prepare_backward(0.25);  // divided back out: the rank's own mean gradient (after the toy's x5)
  f.loss().backward();
  reducer.finalize();
  EXPECT_TRUE(at::allclose(f.w.grad(), dw * 5, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(f.b.grad(), db * 5, 1e-6, 1e-7));
}

// Every row of the factory's table builds, under the name the report shows; other combinations are
// refused naming the keys and listing the rows.
TEST(Aggregator, FactoryBuildsEveryRowAndNamesTheRest) {
  auto settings = [](const std::string& dist) {
    Config cfg = Config::from_string("[dist]\n" + dist, "run.toml");
    return read_data_parallel_settings(cfg);
  };
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"", "allreduce"},
      {"compress = \"onebit\"\n", "allreduce"},
      {"aggregate = \"parameters\"\n", "allreduce"},
      {"topology = \"ps\"\n", "ps"},
      {"topology = \"ps\"\nbackup_workers = 1\n", "ps"},
      {"topology = \"ps\"\nsync = \"async\"\n", "ps"},
      {"topology = \"gossip\"\n", "gossip"},
  };
  for (const auto& [keys, name] : rows) {
    const auto aggregator = make_aggregator(settings(keys), nullptr, "run.toml");
    EXPECT_EQ(aggregator->name(), name) << keys;
  }
  EXPECT_TRUE(make_aggregator(settings("topology = \"ps\"\nsync = \"async\"\n"), nullptr, "run.toml")->central());
  EXPECT_FALSE(make_aggregator(settings("topology = \"ps\"\n"), nullptr, "run.toml")->central());
  try {
    (void)settings("topology = \"gossip\"\naggregate = \"parameters\"\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("run.toml: dist.topology = \"gossip\" and dist.aggregate = \"parameters\""), std::string::npos) << m;
    EXPECT_NE(m.find("the aggregators are: dist.topology = \"allreduce\""), std::string::npos) << m;
  }
  try {
    (void)settings("aggregate = \"parameters\"\ncompress = \"fp16\"\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.aggregate = \"parameters\" (model averaging) sends fp32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ration::dist
