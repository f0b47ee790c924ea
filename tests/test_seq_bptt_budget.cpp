// test_seq_bptt_budget.cpp — full backpropagation through time of lstm_lm under a memory budget
// (docs/METHODS.md, "Temporal-dependency buffers for sequence models", "Full BPTT under a budget"):
//   * model.unroll = "step" is the same model as "sequence": loss within 1e-6, gradients within 1e-5;
//   * at T = 512, a plan for 10% of the unconstrained activation memory runs with a measured peak
//     (counting allocator) within the budget and gradients bitwise equal to the unconstrained step.
#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/plan/planner.h"
#include "ration/models/model.h"
#include "ration/runtime/step_runtime.h"
#include "test_util.h"

namespace ration::testing {
namespace {

std::unique_ptr<models::Model> lstm(const std::string& unroll) {
  Config cfg = Config::from_string("[model]\ntype='lstm_lm'\nvocab_size=32\nn_embd=8\nhidden_size=32\nn_layer=2\n"
                                   "unroll='" + unroll + "'\n",
                                   "test_seq_bptt_budget");
  at::manual_seed(5);  // the same initial weights for both unrolls
  auto m = models::build_model(cfg);
  cfg.check_all_used();
  m->train();
  return m;
}

data::Batch tokens(int64_t B, int64_t T) {
  at::manual_seed(9);
  data::Batch b;
  b.input = Value(at::randint(0, 32, {B, T}, at::kLong));
  b.target = Value(at::randint(0, 32, {B, T}, at::kLong));
  b.items = B;
  return b;
}

TEST(SeqBpttBudget, StepUnrollIsTheSameModel) {
  auto seq = lstm("sequence"), step = lstm("step");
  const data::Batch batch = tokens(3, 37);
  train::StepRuntime runtime;
  const train::StepStats a = runtime.measure_step(*seq, batch, train::StepOptions::collecting(1));
  const train::StepStats b = runtime.measure_step(*step, batch, train::StepOptions::collecting(1));
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
  ASSERT_EQ(a.gradients.size(), b.gradients.size());
  for (size_t i = 0; i < a.gradients.size(); ++i) {
    EXPECT_EQ(a.gradients[i].first, b.gradients[i].first);
    EXPECT_LE((a.gradients[i].second - b.gradients[i].second).abs().max().item<double>(), 1e-5) << a.gradients[i].first;
  }
  expect_error_containing(
      [] {
        Config cfg = Config::from_string("[model]\ntype='lstm_lm'\nunroll='steps'\n", "bad.toml");
        models::build_model(cfg);
      },
      {"model.unroll", "\"sequence\", \"step\""});
}

TEST(SeqBpttBudget, TenPercentOfActivationsAtT512BitwiseGradients) {
  memory::install_counting_allocator();
  auto model = lstm("step");
  const data::Batch batch = tokens(8, 512);
  train::StepRuntime plain, planned;
  const train::StepStats ref = plain.measure_step(*model, batch, train::StepOptions::collecting(3));
  const int64_t activation = ref.peak_above_baseline();
  ASSERT_GT(activation, 0);
  const memory::StepProfile& profile = planned.profile(*model, batch, 3);
  memory::PlanOptions o;
  o.budget_bytes = ref.baseline_bytes + activation / 10;
  planned.use_plan(memory::make_plan(profile, o));
  const train::StepStats st = planned.measure_step(*model, batch, train::StepOptions::collecting(3));
  EXPECT_LE(st.peak_bytes, o.budget_bytes)
      << "peak " << memory::format_bytes(st.peak_above_baseline()) << " above baseline vs budget "
      << memory::format_bytes(activation / 10) << " (activation " << memory::format_bytes(activation) << ")";
  EXPECT_LE(st.peak_above_baseline(), activation / 10);
  EXPECT_GT(st.recomputed_nodes, 0);
  EXPECT_EQ(st.loss, ref.loss);
  ASSERT_EQ(st.gradients.size(), ref.gradients.size());
  for (size_t i = 0; i < st.gradients.size(); ++i)
    EXPECT_TRUE(at::equal(st.gradients[i].second, ref.gradients[i].second)) << st.gradients[i].first;
}

}  // namespace
}  // namespace ration::testing
