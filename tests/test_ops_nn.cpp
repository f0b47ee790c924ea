// Per-op oracle checks for the network ops: activations, shape (transpose/permute/cat/split/slice),
// conv/pool, normalisation, dropout, embedding, causal attention and the recurrent cells. Each check_op
// compares the engine's gradient with finite differences, libtorch autograd, and a DropAll recompute run
// (bitwise). Extra tests pin forward values to libtorch (at::lstm_cell, at::gru_cell, at::batch_norm),
// dropout's statistics, and what the memory-heavy ops keep for backward.
#include <cmath>

#include "op_check.h"
#include "ration/base/check.h"
#include "ration/ops/ops.h"

namespace ration::testing {
namespace {

// Every value `node` keeps for backward: (is_output, index, numel, dtype).
struct SavedInfo {
  bool is_output;
  int index;
  int64_t numel;
  at::ScalarType dtype;
};
std::vector<SavedInfo> saved_of(const Value& y) {
  std::vector<SavedInfo> out;
  for (const auto& ref : y.grad_fn()->saved) {
    const at::Tensor t = ref.value->data();
    out.push_back({ref.is_output, ref.index, t.numel(), t.scalar_type()});
  }
  return out;
}

TEST(OpsNn, Activations) {
  check_op("gelu", [](const Values& v) { return ops::gelu(v[0]); }, {{randd({3, 5})}});
  check_op("gelu_tanh", [](const Values& v) { return ops::gelu(v[0], "tanh"); }, {{randd({3, 5})}});
  check_op("tanh", [](const Values& v) { return ops::tanh(v[0]); }, {{randd({3, 5})}});
  check_op("sigmoid", [](const Values& v) { return ops::sigmoid(v[0]); }, {{randd({3, 5})}});
  check_op("softmax_last", [](const Values& v) { return ops::softmax(v[0], -1); }, {{randd({3, 5})}});
  check_op("softmax_dim0", [](const Values& v) { return ops::softmax(v[0], 0); }, {{randd({3, 2, 4})}});
  check_op("log_softmax", [](const Values& v) { return ops::log_softmax(v[0], 1); }, {{randd({3, 5})}});
  EXPECT_THROW(ops::gelu(Value(randd({2})), "erf"), Error);
  EXPECT_THROW(ops::softmax(Value(randd({2, 3})), 2), Error);
}

TEST(OpsNn, TransposePermuteSlice) {
  check_op("transpose", [](const Values& v) { return ops::transpose(v[0], 0, -1); }, {{randd({2, 3, 4})}});
  check_op("permute", [](const Values& v) { return ops::permute(v[0], {2, 0, 1}); }, {{randd({2, 3, 4})}});
  check_op("slice", [](const Values& v) { return ops::slice(v[0], 1, 1, 4); }, {{randd({2, 5})}});
  check_op("slice_step", [](const Values& v) { return ops::slice(v[0], -1, 0, 100, 2); }, {{randd({2, 3, 5})}});
  // Values, not just gradients, follow ATen.
  at::Tensor x = randd({2, 3, 4});
  EXPECT_TRUE(at::equal(ops::permute(Value(x), {1, 2, 0}).tensor(), x.permute({1, 2, 0})));
  EXPECT_TRUE(at::equal(ops::slice(Value(x), 2, 1, 3).tensor(), x.slice(2, 1, 3)));
  EXPECT_THROW(ops::permute(Value(x), {0, 0, 1}), Error);
  EXPECT_THROW(ops::transpose(Value(x), 0, 3), Error);
}

TEST(OpsNn, CatAndSplit) {
  check_op("cat_dim1", [](const Values& v) { return ops::cat({v[0], v[1], v[2]}, 1); },
           {{randd({2, 1, 3})}, {randd({2, 4, 3})}, {randd({2, 2, 3})}});
  check_op("cat_partial_grad", [](const Values& v) { return ops::cat({v[0], v[1]}, -1); },
           {{randd({2, 3})}, {randd({2, 2}), false}});
  // split into uneven pieces (sizes 2, 2, 1); each piece gets a distinct scale so a mixed-up gradient
  // route shows up, and the pieces come back together through cat ...
  check_op("split_cat", [](const Values& v) {
    Values pieces = ops::split(v[0], 2, 1);
    EXPECT_EQ(pieces.size(), 3u);
    Values scaled;
    for (size_t i = 0; i < pieces.size(); ++i) scaled.push_back(ops::mul_scalar(pieces[i], 1.0 + static_cast<double>(i)));
    return ops::cat(scaled, 1);
  }, {{randd({3, 5})}});
  // ... or through a sum of scaled pieces, where one piece is unused (its gradient must be zero-filled).
  check_op("split_sum", [](const Values& v) {
    Values pieces = ops::split(v[0], 2, 0);
    return ops::add(ops::sum(ops::mul_scalar(pieces[0], 2.0)), ops::sum(ops::mul_scalar(pieces[2], -3.0)));
  }, {{randd({6, 2})}});
  at::Tensor x = randd({5, 2});
  Values pieces = ops::split(Value(x), 2, 0);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_TRUE(at::equal(pieces[2].tensor(), x.slice(0, 4, 5)));
  EXPECT_THROW(ops::cat({Value(randd({2, 3})), Value(randd({3, 2}))}, 1), Error);
  EXPECT_THROW(ops::split(Value(x), 0, 0), Error);
}

TEST(OpsNn, Conv2d) {
  check_op("conv2d", [](const Values& v) { return ops::conv2d(v[0], v[1], v[2]); },
           {{randd({2, 2, 5, 5})}, {randd({3, 2, 3, 3})}, {randd({3})}});
  check_op("conv2d_stride_pad", [](const Values& v) { return ops::conv2d(v[0], v[1], v[2], {2, 1}, {1, 2}); },
           {{randd({1, 2, 5, 4})}, {randd({3, 2, 3, 3})}, {randd({3})}});
  check_op("conv2d_groups_nobias", [](const Values& v) { return ops::conv2d(v[0], v[1], Value(), {1, 1}, {1, 1}, {1, 1}, 2); },
           {{randd({1, 4, 4, 4})}, {randd({4, 2, 3, 3})}});
  check_op("conv2d_dilation", [](const Values& v) { return ops::conv2d(v[0], v[1], v[2], {1, 1}, {0, 0}, {2, 2}); },
           {{randd({1, 1, 6, 6})}, {randd({2, 1, 2, 2})}, {randd({2})}});
  check_op("conv2d_data_input", [](const Values& v) { return ops::conv2d(v[0], v[1], v[2], {2, 2}, {1, 1}); },
           {{randd({2, 3, 4, 4}), false}, {randd({2, 3, 3, 3})}, {randd({2})}});
  EXPECT_THROW(ops::conv2d(Value(randd({1, 3, 4, 4})), Value(randd({2, 2, 3, 3})), Value()), Error);
}

TEST(OpsNn, Pools) {
  check_op("max_pool2d", [](const Values& v) { return ops::max_pool2d(v[0], {2, 2}); }, {{randd({2, 2, 4, 4})}});
  check_op("max_pool2d_overlap_pad", [](const Values& v) { return ops::max_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}); },
           {{randd({1, 2, 5, 5})}});
  check_op("avg_pool2d", [](const Values& v) { return ops::avg_pool2d(v[0], {2, 2}); }, {{randd({2, 2, 4, 4})}});
  check_op("avg_pool2d_overlap_pad", [](const Values& v) { return ops::avg_pool2d(v[0], {3, 2}, {2, 1}, {1, 1}); },
           {{randd({1, 2, 5, 4})}});
  // max_pool2d keeps only its int64 argmax indices (shape of y), never the input; avg_pool2d keeps nothing.
  Value x(randd({1, 2, 4, 4}), true);
  Value y = ops::max_pool2d(x, {2, 2});
  auto saved = saved_of(y);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_TRUE(saved[0].is_output);
  EXPECT_EQ(saved[0].numel, y.numel());
  EXPECT_EQ(saved[0].dtype, at::kLong);
  EXPECT_TRUE(saved_of(ops::avg_pool2d(x, {2, 2})).empty());
}

TEST(OpsNn, LayerNorm) {
  check_op("layer_norm", [](const Values& v) { return ops::layer_norm(v[0], {4}, v[1], v[2]); },
           {{randd({2, 3, 4})}, {randd({4})}, {randd({4})}});
  check_op("layer_norm_2d", [](const Values& v) { return ops::layer_norm(v[0], {2, 3}, v[1], v[2], 1e-3); },
           {{randd({2, 2, 3})}, {randd({2, 3})}, {randd({2, 3})}});
  check_op("layer_norm_plain", [](const Values& v) { return ops::layer_norm(v[0], {5}, Value(), Value()); },
           {{randd({3, 5})}});
  at::Tensor x = randd({2, 3, 4}), w = randd({4}), b = randd({4});
  EXPECT_TRUE(at::allclose(ops::layer_norm(Value(x), {4}, Value(w), Value(b)).tensor(), at::layer_norm(x, {4}, w, b),
                           1e-14, 1e-14));
  EXPECT_THROW(ops::layer_norm(Value(x), {3}, Value(), Value()), Error);
}

TEST(OpsNn, BatchNormTrainAndEval) {
  // The buffers live in the lambdas; training updates them on every call, which must not affect gradients.
  auto rm = std::make_shared<at::Tensor>(at::zeros({3}, at::kDouble));
  auto rv = std::make_shared<at::Tensor>(at::ones({3}, at::kDouble));
  check_op("batch_norm_train", [rm, rv](const Values& v) { return ops::batch_norm(v[0], v[1], v[2], *rm, *rv, true); },
           {{randd({3, 3, 2, 2})}, {randd({3})}, {randd({3})}});
  check_op("batch_norm_train_2d_noaffine",
           [](const Values& v) { return ops::batch_norm(v[0], Value(), Value(), {}, {}, true, 0.1, 1e-3); },
           {{randd({4, 3})}});
  at::Tensor eval_mean = randd({3}), eval_var = randd({3}).abs() + 0.5;
  check_op("batch_norm_eval",
           [eval_mean, eval_var](const Values& v) {
             return ops::batch_norm(v[0], v[1], v[2], eval_mean, eval_var, false);
           },
           {{randd({2, 3, 2, 2})}, {randd({3})}, {randd({3})}});
  // Eval reads the buffers but never writes them; the forward equals libtorch's.
  at::Tensor x = randd({2, 3, 2, 2}), w = randd({3}), b = randd({3});
  at::Tensor m0 = eval_mean.clone(), v0 = eval_var.clone();
  at::Tensor y = ops::batch_norm(Value(x), Value(w), Value(b), eval_mean, eval_var, false).tensor();
  EXPECT_TRUE(at::equal(eval_mean, m0));
  EXPECT_TRUE(at::equal(eval_var, v0));
  EXPECT_TRUE(at::allclose(y, at::batch_norm(x, w, b, m0, v0, false, 0.1, 1e-5, false), 1e-14, 1e-14));
  EXPECT_THROW(ops::batch_norm(Value(randd({1, 3})), Value(), Value(), {}, {}, true), Error);
}

// The running statistics are buffers updated once per forward call, outside the recorded forward closure:
// a recompute (DropAll re-runs every forward in backward) must not update them again.
TEST(OpsNn, BatchNormRunningStatsUpdatedOncePerForward) {
  const double momentum = 0.3, eps = 1e-5;
  at::Tensor x0 = randd({4, 3, 2, 2}), x1 = randd({4, 3, 2, 2}) * 2 + 1, w = randd({3}), b = randd({3});
  // libtorch's reference: two training steps.
  at::Tensor ref_mean = randd({3}), ref_var = randd({3}).abs() + 0.5;
  const at::Tensor init_mean = ref_mean.clone(), init_var = ref_var.clone();
  at::batch_norm(x0, w, b, ref_mean, ref_var, true, momentum, eps, false);
  const at::Tensor ref_mean1 = ref_mean.clone(), ref_var1 = ref_var.clone();
  at::batch_norm(x1, w, b, ref_mean, ref_var, true, momentum, eps, false);

  for (Mode mode : {Mode::Engine, Mode::DropAll, Mode::Oracle}) {
    SCOPED_TRACE(mode == Mode::Engine ? "engine" : mode == Mode::DropAll ? "drop_all" : "oracle");
    at::Tensor rm = init_mean.clone(), rv = init_var.clone();
    int recomputes = 0;
    auto f = [&](const Values& v) { return ops::batch_norm(v[0], v[1], v[2], rm, rv, true, momentum, eps); };
    const at::Tensor upstream = randd({4, 3, 2, 2});
    grads_of(f, {{x0}, {w}, {b}}, upstream, mode, 1234, &recomputes);
    if (mode == Mode::DropAll) EXPECT_GT(recomputes, 0) << "DropAll should have re-run batch_norm's forward";
    // The update is (1-m)*r + m*s computed by ATen ops instead of the kernel's scalar loop: equal up to
    // the rounding of that one expression.
    EXPECT_TRUE(at::allclose(rm, ref_mean1, 1e-15, 1e-15)) << rm << ref_mean1;
    EXPECT_TRUE(at::allclose(rv, ref_var1, 1e-15, 1e-15)) << rv << ref_var1;
    grads_of(f, {{x1}, {w}, {b}}, upstream, mode, 1234, &recomputes);
    EXPECT_TRUE(at::allclose(rm, ref_mean, 1e-15, 1e-15));
    EXPECT_TRUE(at::allclose(rv, ref_var, 1e-15, 1e-15));
  }
  // Like libtorch, a training-mode forward under no-grad still updates the buffers (once).
  at::Tensor rm = init_mean.clone(), rv = init_var.clone();
  {
    NoGradGuard no_grad;
    ops::batch_norm(Value(x0), Value(w), Value(b), rm, rv, true, momentum, eps);
  }
  EXPECT_TRUE(at::allclose(rm, ref_mean1, 1e-15, 1e-15));
  EXPECT_TRUE(at::allclose(rv, ref_var1, 1e-15, 1e-15));
}

TEST(OpsNn, Dropout) {
  check_op("dropout", [](const Values& v) { return ops::dropout(v[0], 0.3, true); }, {{randd({4, 5})}});
  // Eval mode and p == 0 are the identity: the very same value, no node.
  Value x(randd({3, 4}), true);
  EXPECT_EQ(ops::dropout(x, 0.5, false).impl(), x.impl());
  EXPECT_EQ(ops::dropout(x, 0.0, true).impl(), x.impl());

  // Same seed in every mode -> the same mask: with upstream = 1 the gradient is exactly mask / (1 - p).
  const double p = 0.25;
  auto f = [p](const Values& v) { return ops::dropout(v[0], p, true); };
  const at::Tensor ones = at::ones({40, 50}, at::kDouble);
  const auto engine = grads_of(f, {{ones}}, ones, Mode::Engine, 99);
  const auto oracle = grads_of(f, {{ones}}, ones, Mode::Oracle, 99);
  const auto dropped = grads_of(f, {{ones}}, ones, Mode::DropAll, 99);
  EXPECT_TRUE(at::equal(engine[0], oracle[0]));
  EXPECT_TRUE(at::equal(engine[0], dropped[0]));
  const auto other_seed = grads_of(f, {{ones}}, ones, Mode::Engine, 100);
  EXPECT_FALSE(at::equal(engine[0], other_seed[0]));

  // About (1 - p) of the elements kept, each scaled by exactly 1 / (1 - p), the rest exactly 0.
  manual_seed(5);
  at::Tensor y = ops::dropout(Value(ones), p, true).tensor();
  const at::Tensor kept = y != 0;
  const double kept_fraction = kept.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(kept_fraction, 1 - p, 0.03);  // 2000 Bernoulli draws: sd ~ 0.0097
  EXPECT_TRUE(at::all(y.masked_select(kept) == 1.0 / (1 - p)).item<bool>());
  // Saves the bool mask only.
  Value yv = ops::dropout(x, p, true);
  auto saved = saved_of(yv);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].dtype, at::kBool);
  EXPECT_THROW(ops::dropout(x, 1.5, true), Error);
}

TEST(OpsNn, Embedding) {
  const at::Tensor indices = at::tensor({0, 2, 5, 2, 1, 5, 3, 2}, at::kLong).view({2, 4});
  check_op("embedding", [](const Values& v) { return ops::embedding(v[0], v[1]); },
           {{randd({6, 3})}, {indices, false}});
  // padding_idx follows PyTorch: the padding row is looked up as usual but is treated as a constant, so
  // its gradient is zero by definition while finite differences see it move the output. FD is off here
  // (fd_tol = 0); the libtorch oracle and the explicit checks below cover it.
  check_op("embedding_padding", [](const Values& v) { return ops::embedding(v[0], v[1], 2); },
           {{randd({6, 3})}, {indices, false}}, /*fd_tol=*/0);
  // The padding row gets no gradient; rows never looked up get none either.
  Value w(randd({6, 3}), true);
  ops::sum(ops::embedding(w, Value(indices), 2)).backward();
  EXPECT_TRUE(at::equal(w.grad()[2], at::zeros({3}, at::kDouble)));
  EXPECT_TRUE(at::equal(w.grad()[4], at::zeros({3}, at::kDouble)));
  EXPECT_TRUE(at::equal(w.grad()[5], at::full({3}, 2.0, at::kDouble)));
  EXPECT_THROW(ops::embedding(w, Value(indices.to(at::kInt))), Error);
}

// Reference forward: softmax(q k^T / sqrt(D) + causal mask) v.
at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t t = q.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  scores = scores.masked_fill(at::ones({t, t}, at::kBool).triu(1), -INFINITY);
  return at::matmul(at::softmax(scores, -1), v);
}

TEST(OpsNn, CausalAttention) {
  check_op("causal_attention", [](const Values& v) { return ops::causal_attention(v[0], v[1], v[2]); },
           {{randd({1, 2, 4, 3})}, {randd({1, 2, 4, 3})}, {randd({1, 2, 4, 3})}});
  check_op("causal_attention_dropout",
           [](const Values& v) { return ops::causal_attention(v[0], v[1], v[2], 0.3, /*training=*/true); },
           {{randd({2, 1, 4, 3})}, {randd({2, 1, 4, 3})}, {randd({2, 1, 4, 3})}});
  check_op("causal_attention_q_only", [](const Values& v) { return ops::causal_attention(v[0], v[1], v[2]); },
           {{randd({1, 1, 3, 2})}, {randd({1, 1, 3, 2}), false}, {randd({1, 1, 3, 2}), false}});
  at::Tensor q = randd({2, 2, 5, 4}), k = randd({2, 2, 5, 4}), v = randd({2, 2, 5, 4});
  EXPECT_TRUE(at::allclose(ops::causal_attention(Value(q), Value(k), Value(v)).tensor(), attention_reference(q, k, v),
                           1e-13, 1e-13));
  // Dropout in eval mode is off.
  EXPECT_TRUE(at::allclose(ops::causal_attention(Value(q), Value(k), Value(v), 0.5, false).tensor(),
                           attention_reference(q, k, v), 1e-13, 1e-13));
  // Two nodes: causal_attention (att, v) -> y saves att and v (with dropout also its bool keep-mask, an
  // internal output); its input 0 comes from causal_attention_weights (q, k) -> att, which saves q, k and
  // att — the same handle, so the (B, H, T, T) weights are one saved storage the memory plan keeps or drops.
  Value qv(q, true), kv(k, true), vv(v, true);
  for (const bool drop : {false, true}) {
    const Value y = ops::causal_attention(qv, kv, vv, 0.2, /*training=*/drop);
    const Node& apply = *y.grad_fn();
    EXPECT_EQ(apply.spec.name, "causal_attention");
    ASSERT_NE(apply.next_edges.at(0).node, nullptr);
    const Node& weights = *apply.next_edges[0].node;
    EXPECT_EQ(weights.spec.name, "causal_attention_weights");
    EXPECT_EQ(apply.spec.uses_rng, drop);
    EXPECT_FALSE(weights.spec.uses_rng);
    int apply_inputs = 0, masks = 0;
    for (const auto& s : saved_of(y)) {
      if (!s.is_output) {
        ++apply_inputs;
        EXPECT_EQ(s.numel, s.index == 0 ? 2 * 2 * 5 * 5 : 2 * 2 * 5 * 4);  // att, v
        EXPECT_EQ(s.dtype, at::kDouble);
      } else {
        EXPECT_EQ(s.index, 1);
        EXPECT_EQ(s.numel, 2 * 2 * 5 * 5);
        EXPECT_EQ(s.dtype, at::kBool);
        ++masks;
      }
    }
    EXPECT_EQ(apply_inputs, 2);
    EXPECT_EQ(masks, drop ? 1 : 0);
    ASSERT_EQ(weights.saved.size(), 3u);  // q, k, att
    std::shared_ptr<SavedValue> att_handle;
    for (const auto& ref : weights.saved)
      if (ref.is_output) att_handle = ref.value;
    ASSERT_NE(att_handle, nullptr);
    EXPECT_EQ(att_handle->data().numel(), 2 * 2 * 5 * 5);
    bool shared = false;
    for (const auto& ref : apply.saved) shared = shared || (!ref.is_output && ref.index == 0 && ref.value == att_handle);
    EXPECT_TRUE(shared) << "the weights node and the apply node must save one handle for att";
    // The kept weights are softmax rows: 0 above the diagonal, each row sums to 1.
    const at::Tensor att = att_handle->data();
    EXPECT_TRUE(at::allclose(att.sum(-1), at::ones({2, 2, 5}, att.options()), 1e-13, 1e-13));
    EXPECT_EQ(att.masked_select(at::ones({5, 5}, at::kBool).triu(1)).abs().max().item<double>(), 0.0);
  }
  EXPECT_THROW(ops::causal_attention(Value(q), Value(k.slice(2, 0, 4)), Value(v)), Error);
}

// A tensor-parallel rank holds heads [first, first + h) of a layer's H (distributed/tensor_parallel_block.h):
// with HeadSlice{first, H} its dropout mask is the slice of the mask the whole layer draws from the same seed,
// so its output is the whole layer's output for those heads.
TEST(OpsNn, CausalAttentionHeadSliceDrawsTheWholeLayersMaskSlice) {
  const at::Tensor q = randd({2, 4, 5, 3}), k = randd({2, 4, 5, 3}), v = randd({2, 4, 5, 3});
  manual_seed(77);
  const at::Tensor whole = ops::causal_attention(Value(q), Value(k), Value(v), 0.4, /*training=*/true).tensor();
  for (const int64_t first : {0, 2}) {
    auto heads = [&](const at::Tensor& t) { return Value(t.narrow(1, first, 2).contiguous()); };
    manual_seed(77);
    const at::Tensor part =
        ops::causal_attention(heads(q), heads(k), heads(v), 0.4, true, 0, ops::HeadSlice{first, 4}).tensor();
    EXPECT_LE(max_rel_error(part, whole.narrow(1, first, 2)), 1e-14) << "heads from " << first;
    manual_seed(77);  // without the slice, the mask is drawn for 2 heads: another mask for heads 2 and 3
    const at::Tensor own = ops::causal_attention(heads(q), heads(k), heads(v), 0.4, true).tensor();
    if (first == 2) EXPECT_GT(max_rel_error(own, whole.narrow(1, first, 2)), 1e-2);
  }
  EXPECT_THROW(ops::causal_attention(Value(q), Value(k), Value(v), 0.4, true, 0, ops::HeadSlice{2, 4}), Error);
}

// Drops only the attention weights (the input 0 the apply node saves) after the apply node's forward, and
// records which nodes backward re-ran.
class DropAttentionWeights : public MemoryPolicy {
 public:
  explicit DropAttentionWeights(bool drop_weights) : drop_weights_(drop_weights) {}
  void after_forward_node(Node& node, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&) override {
    if (!drop_weights_ || node.spec.name != "causal_attention") return;
    for (auto& ref : node.saved)
      if (!ref.is_output && ref.index == 0 && ref.value->state() == SavedState::Resident) ref.value->drop();
  }
  void on_recompute(Node& node, double) override { reran.push_back(node.spec.name); }
  std::vector<std::string> reran;

 private:
  bool drop_weights_;
};

// A plan that drops the weights pays one re-run of the weights node (never the apply node, its matmul
// with v or its dropout draw) and gets bitwise the gradients of keeping them; kept, nothing re-runs.
TEST(OpsNn, CausalAttentionDroppedWeightsRerunOnlyTheWeightsNode) {
  const at::Tensor q = randd({2, 2, 6, 4}), k = randd({2, 2, 6, 4}), v = randd({2, 2, 6, 4});
  const at::Tensor upstream = randd({2, 2, 6, 4});
  for (const bool dropout : {false, true}) {
    auto run = [&](MemoryPolicy* policy) {
      Value qv(q.clone(), true), kv(k.clone(), true), vv(v.clone(), true);
      manual_seed(77);
      PolicyScope scope(policy);
      Value y = ops::causal_attention(qv, kv, vv, 0.25, /*training=*/dropout);
      y.backward(upstream);
      return std::vector<at::Tensor>{qv.grad(), kv.grad(), vv.grad()};
    };
    DropAttentionWeights keeping(/*drop_weights=*/false), dropping(/*drop_weights=*/true);
    const std::vector<at::Tensor> kept = run(&keeping);
    const std::vector<at::Tensor> rebuilt = run(&dropping);
    EXPECT_TRUE(keeping.reran.empty());
    ASSERT_EQ(dropping.reran.size(), 1u);
    EXPECT_EQ(dropping.reran[0], "causal_attention_weights");
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(at::equal(kept[i], rebuilt[i])) << "input " << i;
  }
}

TEST(OpsNn, LstmCell) {
  const int64_t b = 2, in = 3, hs = 2;
  auto both = [](const Values& out) { return ops::cat({out[0], out[1]}, 1); };  // (B, 2H): h' then c'
  check_op("lstm_cell",
           [both](const Values& v) { return both(ops::lstm_cell(v[0], v[1], v[2], v[3], v[4], v[5], v[6])); },
           {{randd({b, in})}, {randd({b, hs})}, {randd({b, hs})}, {randd({4 * hs, in})}, {randd({4 * hs, hs})},
            {randd({4 * hs})}, {randd({4 * hs})}});
  check_op("lstm_cell_nobias_h_only",  // only h' used: c' gets a zero-filled gradient
           [](const Values& v) { return ops::lstm_cell(v[0], v[1], v[2], v[3], v[4], Value(), Value())[0]; },
           {{randd({b, in})}, {randd({b, hs})}, {randd({b, hs})}, {randd({4 * hs, in})}, {randd({4 * hs, hs})}});
  at::Tensor x = randd({b, in}), h = randd({b, hs}), c = randd({b, hs}), w_ih = randd({4 * hs, in}),
             w_hh = randd({4 * hs, hs}), b_ih = randd({4 * hs}), b_hh = randd({4 * hs});
  Values out = ops::lstm_cell(Value(x), Value(h), Value(c), Value(w_ih), Value(w_hh), Value(b_ih), Value(b_hh));
  auto [h_ref, c_ref] = at::lstm_cell(x, {h, c}, w_ih, w_hh, b_ih, b_hh);
  EXPECT_TRUE(at::allclose(out[0].tensor(), h_ref, 1e-14, 1e-14));
  EXPECT_TRUE(at::allclose(out[1].tensor(), c_ref, 1e-14, 1e-14));
  EXPECT_THROW(ops::lstm_cell(Value(x), Value(h), Value(c), Value(w_hh), Value(w_hh), Value(), Value()), Error);
}

TEST(OpsNn, GruCell) {
  const int64_t b = 2, in = 3, hs = 2;
  check_op("gru_cell", [](const Values& v) { return ops::gru_cell(v[0], v[1], v[2], v[3], v[4], v[5]); },
           {{randd({b, in})}, {randd({b, hs})}, {randd({3 * hs, in})}, {randd({3 * hs, hs})}, {randd({3 * hs})},
            {randd({3 * hs})}});
  check_op("gru_cell_nobias", [](const Values& v) { return ops::gru_cell(v[0], v[1], v[2], v[3], Value(), Value()); },
           {{randd({b, in})}, {randd({b, hs})}, {randd({3 * hs, in})}, {randd({3 * hs, hs})}});
  at::Tensor x = randd({b, in}), h = randd({b, hs}), w_ih = randd({3 * hs, in}), w_hh = randd({3 * hs, hs}),
             b_ih = randd({3 * hs}), b_hh = randd({3 * hs});
  at::Tensor y = ops::gru_cell(Value(x), Value(h), Value(w_ih), Value(w_hh), Value(b_ih), Value(b_hh)).tensor();
  EXPECT_TRUE(at::allclose(y, at::gru_cell(x, h, w_ih, w_hh, b_ih, b_hh), 1e-14, 1e-14));
  EXPECT_THROW(ops::gru_cell(Value(x), Value(h), Value(w_ih), Value(w_ih), Value(), Value()), Error);
}

}  // namespace
}  // namespace ration::testing
