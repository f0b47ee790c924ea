// test_seq_ops.cpp — the sequence ops and layers of docs/METHODS.md, "Temporal-dependency buffers for
// sequence models": causal conv1d (finite differences, libtorch autograd, drop-all recompute; forward vs
// at::conv1d on a left-padded input; continuing from `past` equals one long convolution), windowed causal
// attention (the same three checks; forward vs an explicit masked softmax; window 0 unchanged), and the
// bidirectional GRU/LSTM layer (forward vs at::gru/at::lstm bidirectional, gradients vs libtorch autograd).
#include <cmath>
#include <limits>

#include "op_check.h"
#include "ration/base/check.h"
#include "ration/nn/sequence_layers.h"
#include "ration/ops/ops.h"
#include "test_util.h"

namespace ration::testing {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);

TEST(SeqOps, Conv1dCausalGradients) {
  at::manual_seed(1);
  for (int64_t dilation : {1, 2}) {
    check_op("conv1d_causal_d" + std::to_string(dilation),
             [=](const Values& v) { return ops::conv1d_causal(v[0], v[1], v[2], dilation); },
             {{randd({2, 3, 6})}, {randd({4, 3, 3})}, {randd({4})}});
  }
  check_op("conv1d_causal_nobias", [](const Values& v) { return ops::conv1d_causal(v[0], v[1], Value(), 1); },
           {{randd({2, 3, 5})}, {randd({2, 3, 2})}});
  // With 3 of L = 4 past steps given (no gradient to them).
  check_op("conv1d_causal_past", [](const Values& v) { return ops::conv1d_causal(v[0], v[1], v[2], 2, v[3]); },
           {{randd({2, 3, 5})}, {randd({4, 3, 3})}, {randd({4})}, {randd({2, 3, 3}), false}});
}

TEST(SeqOps, Conv1dCausalForwardIsLeftPaddedConv) {
  at::manual_seed(2);
  const at::Tensor x = randd({2, 3, 9}), w = randd({4, 3, 3}), b = randd({4});
  const int64_t dilation = 3, L = 6;
  const at::Tensor ref = at::conv1d(at::constant_pad_nd(x, {L, 0}), w, b, at::IntArrayRef{1}, at::IntArrayRef{0}, at::IntArrayRef{dilation});  // (2, 4, 9)
  const at::Tensor y = ops::conv1d_causal(Value(x), Value(w), Value(b), dilation).tensor();
  ASSERT_EQ(y.sizes(), ref.sizes());
  EXPECT_LE(max_rel_error(y, ref), 1e-14);
  // Output t does not read steps after t: changing x[.., 5:] leaves y[.., :5] as it was.
  at::Tensor x2 = x.clone();
  x2.narrow(2, 5, 4).normal_();
  const at::Tensor y2 = ops::conv1d_causal(Value(x2), Value(w), Value(b), dilation).tensor();
  EXPECT_TRUE(at::equal(y2.narrow(2, 0, 5), y.narrow(2, 0, 5)));
  EXPECT_FALSE(at::equal(y2.narrow(2, 5, 4), y.narrow(2, 5, 4)));
  // Continuing from the steps before t = 5 (5 of L = 6 exist) equals the convolution over the whole sequence.
  const Value past(x.narrow(2, 0, 5).contiguous());
  const at::Tensor tail =
      ops::conv1d_causal(Value(x.narrow(2, 5, 4).contiguous()), Value(w), Value(b), dilation, past).tensor();
  EXPECT_LE(max_rel_error(tail, ref.narrow(2, 5, 4)), 1e-14);
}

TEST(SeqOps, Conv1dCausalRejectsBadInput) {
  const Value x(randd({2, 3, 5})), w(randd({4, 3, 3}));
  expect_error_containing([&] { ops::conv1d_causal(x, Value(randd({4, 2, 3})), Value()); }, "C_in=3");
  expect_error_containing([&] { ops::conv1d_causal(x, w, Value(), 0); }, "dilation must be >= 1");
  expect_error_containing([&] { ops::conv1d_causal(x, w, Value(), 1, Value(randd({2, 3, 3}))); }, "P <= L=2");
  expect_error_containing([&] { ops::conv1d_causal(x, w, Value(), 1, Value(randd({2, 3, 1}), true)); },
                          "detach it");
}

// Explicit reference: softmax over keys j with p - window <= j <= p (p = i + Tk - Tq), then times v.
at::Tensor windowed_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window) {
  const int64_t tq = q.size(2), tk = k.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor mask = at::zeros({tq, tk}, at::kBool);
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) {
      const int64_t p = i + tk - tq;
      mask[i][j] = j > p || (window > 0 && j < p - window);
    }
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
}

TEST(SeqOps, WindowedAttentionGradientsAndValues) {
  at::manual_seed(3);
  for (int64_t window : {1, 3}) {
    check_op("attention_window_" + std::to_string(window),
             [=](const Values& v) { return ops::causal_attention(v[0], v[1], v[2], 0.0, false, window); },
             {{randd({2, 2, 6, 3})}, {randd({2, 2, 6, 3})}, {randd({2, 2, 6, 3})}});
  }
  // A chunk of 3 queries after 4 cached keys.
  check_op("attention_cached_keys",
           [](const Values& v) { return ops::causal_attention(v[0], v[1], v[2], 0.0, false, 2); },
           {{randd({1, 2, 3, 4})}, {randd({1, 2, 7, 4})}, {randd({1, 2, 7, 4})}});
  const at::Tensor q = randd({2, 2, 7, 4}), k = randd({2, 2, 7, 4}), v = randd({2, 2, 7, 4});
  for (int64_t window : {0, 1, 4, 6, 10}) {
    SCOPED_TRACE(window);
    const at::Tensor y = ops::causal_attention(Value(q), Value(k), Value(v), 0.0, false, window).tensor();
    EXPECT_LE(max_rel_error(y, windowed_reference(q, k, v, window)), 1e-12);
  }
  // Tail queries against all keys equal the full self-attention's tail rows.
  const at::Tensor full = ops::causal_attention(Value(q), Value(k), Value(v), 0.0, false, 3).tensor();
  const at::Tensor tail =
      ops::causal_attention(Value(q.narrow(2, 4, 3)), Value(k), Value(v), 0.0, false, 3).tensor();
  EXPECT_LE(max_rel_error(tail, full.narrow(2, 4, 3)), 1e-14);
  expect_error_containing([&] { ops::causal_attention(Value(q), Value(k.narrow(2, 0, 3)), Value(v.narrow(2, 0, 3))); },
                          "Tk >= Tq");
  expect_error_containing([&] { ops::causal_attention(Value(q), Value(k), Value(v), 0.0, false, -1); },
                          "window must be >= 0");
}

// at::gru / at::lstm parameter order: per direction w_ih, w_hh, b_ih, b_hh (forward, then reverse).
std::vector<at::Tensor> flat(const nn::Bidirectional& bi) {
  std::vector<at::Tensor> out;
  for (int d = 0; d < 2; ++d)
    for (const Value* v : {&bi.w_ih[d], &bi.w_hh[d], &bi.b_ih[d], &bi.b_hh[d]}) out.push_back(v->tensor());
  return out;
}

TEST(SeqLayers, BidirectionalMatchesAtenAndTorchAutograd) {
  at::manual_seed(4);
  for (nn::RecurrentCell cell : {nn::RecurrentCell::GRU, nn::RecurrentCell::LSTM}) {
    const bool lstm = cell == nn::RecurrentCell::LSTM;
    SCOPED_TRACE(lstm ? "LSTM" : "GRU");
    nn::Bidirectional bi(cell, 3, 4);
    bi.to(kF64);
    const at::Tensor x = at::randn({2, 5, 3}, kF64);  // (B, T, I)
    const Value y = bi.forward(Value(x));
    ASSERT_EQ(y.sizes(), at::IntArrayRef({2, 5, 8}));
    const at::Tensor h0 = at::zeros({2, 2, 4}, kF64);  // (directions, B, H)
    const at::Tensor ref = lstm ? std::get<0>(at::lstm(x, {h0, h0}, flat(bi), true, 1, 0.0, false, true, true))
                                : std::get<0>(at::gru(x, h0, flat(bi), true, 1, 0.0, false, true, true));
    EXPECT_LE(max_rel_error(y.tensor(), ref), 1e-12);
    // Gradients: ration's engine vs libtorch autograd over the same forward.
    auto loss_of = [&] {
      Value out = bi.forward(Value(x));
      return ops::sum(ops::mul(out, out));
    };
    bi.zero_grad();
    loss_of().backward();
    std::vector<at::Tensor> engine;
    for (auto& p : bi.parameters()) engine.push_back(p.grad().clone());
    bi.zero_grad();
    {
      OracleScope oracle(bi.parameters());
      loss_of().backward();
    }
    const auto params = bi.parameters();
    for (size_t i = 0; i < params.size(); ++i) EXPECT_LE(max_rel_error(engine[i], params[i].grad()), 1e-10) << i;
    // The reverse direction reads the future: output 0 changes when the last step does.
    at::Tensor x2 = x.clone();
    x2.select(1, 4).normal_();
    EXPECT_FALSE(at::equal(bi.forward(Value(x2)).tensor().select(1, 0), y.tensor().select(1, 0)));
    const seq::LayerDependency d = bi.dependency("encoder");
    EXPECT_EQ(d.type, seq::Dependency::WholeSequence);
  }
  nn::Bidirectional named(nn::RecurrentCell::GRU, 3, 4);
  std::vector<std::string> names;
  for (auto& [n, p] : named.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                                             "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse",
                                             "bias_hh_l0_reverse"}));
}

}  // namespace
}  // namespace ration::testing
