// StepRuntime, the one owner of a training step: hooks fire in order and once, each node gets one
// position per step, the memory mode follows the settings, a trainer-style step with an optimiser is the
// hand-written step, and bad [memory]/[offload] combinations are errors naming the keys.
#include <gtest/gtest.h>

#include <map>

#include "gpt_fixture.h"
#include "test_util.h"

#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/models/model.h"
#include "ration/optim/clip.h"
#include "ration/optim/sgd.h"
#include "ration/runtime/budget.h"
#include "ration/config/config.h"
#include "ration/runtime/step_runtime.h"

namespace ration {
namespace {

using testing::small_gpt;
using testing::token_batch;

// Records every hook call as one line.
class Recorder : public train::StepHook {
 public:
  void before_forward(int64_t step, data::Batch&) override { log.push_back("before_forward " + std::to_string(step)); }
  void after_forward(int64_t step, const Value& loss) override {
    log.push_back("after_forward " + std::to_string(step));
    loss_seen = loss.item();
  }
  void gradient_ready(const std::string& name, ValueImpl& param) override {
    ++ready[name];
    grad_defined_when_ready = grad_defined_when_ready && param.grad.defined();
  }
  void after_backward(int64_t step) override { log.push_back("after_backward " + std::to_string(step)); }
  void before_optimizer(int64_t step) override { log.push_back("before_optimizer " + std::to_string(step)); }
  void after_step(int64_t step, const train::StepStats& st) override {
    log.push_back("after_step " + std::to_string(step));
    loss_after = st.loss;
  }
  std::vector<std::string> log;
  std::map<std::string, int> ready;
  bool grad_defined_when_ready = true;
  double loss_seen = 0, loss_after = 0;
};

TEST(StepRuntime, HooksFireInOrderAndEveryGradientOnce) {
  auto model = small_gpt();
  const data::Batch batch = token_batch();
  optim::SGD sgd(model->named_parameters(), {});
  train::StepRuntime runtime;
  Recorder first, second;
  runtime.add_hook(&first);
  runtime.add_hook(&second);
  train::StepOptions o;
  o.seed = 7;
  o.optimizer = &sgd;
  const train::StepStats st = runtime.measure_step(*model, batch, o);
  const std::vector<std::string> expected = {"before_forward 0", "after_forward 0", "after_backward 0",
                                             "before_optimizer 0", "after_step 0"};
  EXPECT_EQ(first.log, expected);
  EXPECT_EQ(second.log, expected);
  const auto params = model->named_parameters();
  ASSERT_EQ(first.ready.size(), params.size()) << "a parameter's gradient-ready hook did not fire";
  for (const auto& [name, p] : params) EXPECT_EQ(first.ready[name], 1) << name;
  EXPECT_TRUE(first.grad_defined_when_ready);
  EXPECT_EQ(first.loss_seen, st.loss);
  EXPECT_EQ(first.loss_after, st.loss);

  // Without an optimiser there is no before_optimizer; the step number goes on by itself.
  first.log.clear();
  first.ready.clear();
  runtime.run_step(*model, batch, train::StepOptions::collecting(7));
  EXPECT_EQ(first.log, (std::vector<std::string>{"before_forward 1", "after_forward 1", "after_backward 1",
                                                 "after_step 1"}));
  for (const auto& [name, p] : params) EXPECT_EQ(first.ready[name], 1) << name;

  // Gradient hooks attached to the parameters stay silent outside the runtime's steps.
  first.ready.clear();
  {
    manual_seed(7);
    Value loss = model->loss(batch);
    loss.backward();
  }
  model->zero_grad();
  EXPECT_TRUE(first.ready.empty()) << "hook fired for a backward the runtime did not run";
}

TEST(StepRuntime, AStepWithTheOptimiserIsTheHandWrittenStep) {
  auto a = small_gpt(), b = small_gpt();
  const data::Batch batch = token_batch();
  optim::SGD sa(a->named_parameters(), {}), sb(b->named_parameters(), {});
  train::StepRuntime runtime;
  for (int step = 0; step < 2; ++step) {
    train::StepOptions o;
    o.seed = 100 + static_cast<uint64_t>(step);
    o.optimizer = &sa;
    o.clip_grad_norm = 0.5;
    const train::StepStats st = runtime.measure_step(*a, batch, o);
    manual_seed(100 + static_cast<uint64_t>(step));
    Value loss = b->loss(batch);
    EXPECT_EQ(st.loss, loss.item());
    loss.backward();
    const double norm = optim::clip_grad_norm(sb.params(), 0.5);
    EXPECT_EQ(st.grad_norm, norm);
    sb.step();
    sb.zero_grad();
  }
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i].second.tensor(), pb[i].second.tensor())) << pa[i].first;
  for (const auto& [name, p] : pa) EXPECT_FALSE(p.grad().defined()) << name << ": the optimiser zeroes gradients";
}

// Every node gets its position once, from 0 in each step; a node of an earlier step is not this step's.
class OrderProbe : public train::StepHook {
 public:
  void after_forward(int64_t, const Value& loss) override { last = loss.grad_fn(); }
  std::shared_ptr<Node> last;
};

TEST(StepRuntime, EachNodeHasOnePositionPerStep) {
  auto model = small_gpt();
  const data::Batch batch = token_batch();
  train::MemorySettings settings;
  settings.offload.enabled = true;  // threshold mode: the runtime drives the step
  settings.offload.options.t1 = memory::kNoLimit;
  train::StepRuntime runtime(settings);
  ASSERT_EQ(runtime.mode(), train::MemoryMode::Thresholds);
  const memory::StepProfile& profile = runtime.profile(*model, batch, 1);
  OrderProbe probe;
  runtime.add_hook(&probe);
  std::shared_ptr<Node> previous;
  for (int step = 0; step < 2; ++step) {
    runtime.run_step(*model, batch, train::StepOptions::collecting(1));
    ASSERT_TRUE(probe.last);
    // The loss is the last node recorded: its position is the profiled step's last ordinal.
    EXPECT_EQ(probe.last->ordinal, static_cast<int64_t>(profile.nodes.size()) - 1);
    if (previous) EXPECT_LT(previous->seq, probe.last->seq);
    previous = probe.last;
  }
  memory::StepOrder order;
  order.begin();
  Node fresh;
  fresh.seq = previous->seq + 1;
  EXPECT_EQ(order.assign(fresh), 0);
  EXPECT_EQ(order.of(fresh), 0);
  EXPECT_EQ(order.of(*previous), -1) << "a node of an earlier step has no position in this one";
  // A saved value is named by its producer's position; one whose graph is gone has none.
  auto producer = std::make_shared<Node>();
  producer->seq = fresh.seq + 1;
  order.assign(*producer);
  SavedValue value(producer, 0, 4);
  EXPECT_EQ(order.of(value), 1);
  producer.reset();
  EXPECT_EQ(order.of(value), -1);
}

TEST(StepRuntime, ModeFollowsTheSettings) {
  Config keep = Config::from_string("", "keep.toml");
  EXPECT_EQ(train::StepRuntime(train::read_memory_settings(keep)).mode(), train::MemoryMode::Keep);
  Config thresholds = Config::from_string("[offload]\nenabled=true\n", "t.toml");
  train::StepRuntime t(train::read_memory_settings(thresholds));
  EXPECT_EQ(t.mode(), train::MemoryMode::Thresholds);
  EXPECT_NE(t.engine(), nullptr);
  Config budget = Config::from_string("[memory]\nbudget='40MiB'\n", "b.toml");
  train::StepRuntime b(train::read_memory_settings(budget));
  EXPECT_EQ(b.mode(), train::MemoryMode::Keep) << "a budget plans at prepare(); until then nothing is dropped";
  EXPECT_EQ(b.engine(), nullptr);
}

TEST(StepRuntime, ThresholdsWithABudgetAreAnErrorNamingTheKeys) {
  Config cfg = Config::from_string("[memory]\nbudget='40MiB'\n[offload]\nenabled=true\nt2='10MiB'\n", "run.toml");
  testing::expect_error_containing([&] { train::read_memory_settings(cfg); },
                                   {"run.toml", "offload.t1/t2/t3", "memory.budget"});
}

}  // namespace
}  // namespace ration
