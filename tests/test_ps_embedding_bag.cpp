// embedding_bag: gradients vs libtorch autograd (at::embedding_bag differentiated by torch) and finite
// differences for sum, mean, per-sample weights, empty bags and repeated ids; the table gradient is
// sparse (unique ids + rows, nothing table-sized); dropping every saved value and recomputing gives the
// same gradient bitwise; bad input errors.
#include <gtest/gtest.h>

#include "op_check.h"
#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::testing {
namespace {

at::Tensor dense(const at::Tensor& t) { return t.is_sparse() ? t.to_dense() : t; }

struct BagCase {
  const char* name;
  std::vector<int64_t> ids;
  std::vector<int64_t> offsets;
  ops::EmbeddingBagMode mode;
  bool weighted;
};

void check_bag(const BagCase& c, int64_t rows = 7, int64_t dim = 3) {
  SCOPED_TRACE(c.name);
  const at::Tensor ids = at::tensor(c.ids, at::kLong);
  const at::Tensor offsets = at::tensor(c.offsets, at::kLong);
  std::vector<OpInput> inputs = {{randd({rows, dim})}, {ids, false}, {offsets, false}};
  if (c.weighted) inputs.push_back({randd({static_cast<int64_t>(c.ids.size())})});
  const ops::EmbeddingBagMode mode = c.mode;
  OpFn f = [mode](const Values& v) {
    return ops::embedding_bag(v[0], v[1], v[2], mode, v.size() > 3 ? v[3] : Value());
  };
  at::Tensor upstream = at::randn({static_cast<int64_t>(c.offsets.size()), dim}, at::kDouble);
  const auto engine = grads_of(f, inputs, upstream, Mode::Engine);
  const auto oracle = grads_of(f, inputs, upstream, Mode::Oracle);
  const auto dropped = grads_of(f, inputs, upstream, Mode::DropAll);
  // The table's gradient is sparse, with exactly the unique ids of the batch.
  ASSERT_TRUE(engine[0].is_sparse());
  const ops::SparseRows sr = ops::sparse_rows(engine[0]);
  const at::Tensor unique = std::get<0>(at::_unique2(ids, true, false, false));
  EXPECT_TRUE(at::equal(sr.ids, unique));
  EXPECT_EQ(sr.rows.size(0), unique.size(0));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad) continue;
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(oracle[i].defined());
    EXPECT_LE(max_rel_error(dense(engine[i]), dense(oracle[i])), 1e-12) << "engine vs libtorch autograd";
    EXPECT_TRUE(at::equal(dense(engine[i]), dense(dropped[i]))) << "recomputed backward differs";
    const at::Tensor fd = finite_difference(f, inputs, upstream, i, 1e-6, 1234);
    EXPECT_LE(max_rel_error(dense(engine[i]), fd), 1e-6) << "engine vs finite differences";
  }
}

TEST(PsEmbeddingBag, SumMatchesLibtorch) {
  check_bag({"sum", {0, 2, 5, 1, 3, 6}, {0, 2, 3}, ops::EmbeddingBagMode::Sum, false});
}

TEST(PsEmbeddingBag, MeanMatchesLibtorch) {
  check_bag({"mean", {0, 2, 5, 1, 3, 6}, {0, 2, 3}, ops::EmbeddingBagMode::Mean, false});
}

TEST(PsEmbeddingBag, PerSampleWeightsMatchLibtorch) {
  check_bag({"weighted", {4, 2, 5, 1, 3, 6, 0}, {0, 1, 4}, ops::EmbeddingBagMode::Sum, true});
}

TEST(PsEmbeddingBag, EmptyBagsMatchLibtorch) {
  // Bag 1 and the trailing bag 4 are empty; mean of an empty bag is zero.
  check_bag({"empty_sum", {0, 2, 5, 1}, {0, 2, 2, 3, 4}, ops::EmbeddingBagMode::Sum, false});
  check_bag({"empty_mean", {0, 2, 5, 1}, {0, 2, 2, 3, 4}, ops::EmbeddingBagMode::Mean, false});
  check_bag({"empty_weighted", {0, 2, 5, 1}, {0, 0, 2, 3, 4}, ops::EmbeddingBagMode::Sum, true});
}

TEST(PsEmbeddingBag, RepeatedIdsAccumulate) {
  check_bag({"repeat_sum", {3, 3, 3, 1, 3, 1}, {0, 3, 4}, ops::EmbeddingBagMode::Sum, false});
  check_bag({"repeat_mean", {3, 3, 3, 1, 3, 1}, {0, 3, 4}, ops::EmbeddingBagMode::Mean, false});
  check_bag({"repeat_weighted", {3, 3, 3, 1, 3, 1}, {0, 3, 4}, ops::EmbeddingBagMode::Sum, true});
  // Exact value: id 3 appears 4 times in sum mode with upstream 1 -> row gradient 4.
  Value table(at::randn({5, 2}, at::kDouble), true);
  ops::sum(ops::embedding_bag(table, Value(at::tensor({3, 3, 3, 1, 3, 1}, at::kLong)),
                              Value(at::tensor({0, 3, 4}, at::kLong))))
      .backward();
  const ops::SparseRows sr = ops::sparse_rows(table.grad());
  EXPECT_TRUE(at::equal(sr.ids, at::tensor({1, 3}, at::kLong)));
  EXPECT_TRUE(at::equal(sr.rows, at::tensor({2.0, 2.0, 4.0, 4.0}, at::kDouble).view({2, 2})));
}

TEST(PsEmbeddingBag, GradientIsNeverTableSized) {
  // A 10^6-row table touched by 3 ids: the gradient holds 3 rows.
  Value table(at::zeros({1000000, 4}), true);
  ops::sum(ops::embedding_bag(table, Value(at::tensor({7, 999999, 7, 12}, at::kLong)),
                              Value(at::tensor({0, 2}, at::kLong)), ops::EmbeddingBagMode::Mean))
      .backward();
  ASSERT_TRUE(table.grad().is_sparse());
  EXPECT_EQ(table.grad()._values().numel(), 3 * 4);
  // Two backward passes accumulate sparsely (coalesced).
  ops::sum(ops::embedding_bag(table, Value(at::tensor({7}, at::kLong)), Value(at::tensor({0}, at::kLong))))
      .backward();
  const ops::SparseRows sr = ops::sparse_rows(table.grad());
  EXPECT_TRUE(at::equal(sr.ids, at::tensor({7, 12, 999999}, at::kLong)));
  EXPECT_FLOAT_EQ(sr.rows[0][0].item<float>(), 0.5f + 0.5f + 1.0f);
}

TEST(PsEmbeddingBag, NonLeafTableGetsDenseGradient) {
  Value base(at::randn({4, 2}, at::kDouble), true);
  Value table = ops::mul_scalar(base, 2.0);
  ops::sum(ops::embedding_bag(table, Value(at::tensor({1, 1}, at::kLong)), Value(at::tensor({0}, at::kLong))))
      .backward();
  ASSERT_FALSE(base.grad().is_sparse());
  EXPECT_DOUBLE_EQ(base.grad()[1][0].item<double>(), 4.0);
  EXPECT_DOUBLE_EQ(base.grad()[0][0].item<double>(), 0.0);
}

TEST(PsEmbeddingBag, BadInputIsAnError) {
  Value table(at::randn({4, 2}), true);
  const Value ids(at::tensor({0, 5}, at::kLong));
  const Value off(at::tensor({0}, at::kLong));
  EXPECT_THROW(ops::embedding_bag(table, ids, off), Error);  // id 5 >= 4 rows
  EXPECT_THROW(ops::embedding_bag(table, Value(at::tensor({0, 1}, at::kInt)), off), Error);
  EXPECT_THROW(ops::embedding_bag(table, Value(at::tensor({0, 1}, at::kLong)), Value(at::tensor({1}, at::kLong))),
               Error);  // first offset must be 0
  EXPECT_THROW(ops::embedding_bag(table, Value(at::tensor({0, 1}, at::kLong)),
                                  Value(at::tensor({0, 2, 1}, at::kLong))),
               Error);  // decreasing
  EXPECT_THROW(ops::embedding_bag(table, Value(at::tensor({0, 1}, at::kLong)), off, ops::EmbeddingBagMode::Mean,
                                  Value(at::ones({2}))),
               Error);  // weights need sum
}

}  // namespace
}  // namespace ration::testing
