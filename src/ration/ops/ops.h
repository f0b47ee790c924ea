// ops.h — every differentiable op ration provides.
// Each op lives in one place in ops/*.cpp: its forward closure, its backward closure (ATen backward
// kernels where they exist) and its OpSpec (what backward reads), passed to apply_op (core/node.h).
// Ops never modify inputs in place; RNG ops record their seed so recompute reproduces them.
// Shapes: B batch, C channels, H/W spatial, T time, D features, N rows.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ration/core/value.h"

namespace ration::ops {

// ---- elementwise, broadcasting ------------------------------------------------------------------
Value add(const Value& a, const Value& b);
Value sub(const Value& a, const Value& b);
Value mul(const Value& a, const Value& b);
Value div(const Value& a, const Value& b);
Value add_scalar(const Value& a, double s);
Value mul_scalar(const Value& a, double s);
Value div_scalar(const Value& a, double s);  // a / s, rounded as at::div (not a * (1 / s))

// ---- linear algebra -----------------------------------------------------------------------------
Value matmul(const Value& a, const Value& b);              // at::matmul semantics (batched, broadcast)
Value bmm(const Value& a, const Value& b);                 // (B, N, K) x (B, K, M) -> (B, N, M)
Value linear(const Value& x, const Value& w, const Value& b);  // x (..., in), w (out, in), b (out) or undefined

// ---- convolution and pooling (NCHW) --------------------------------------------------------------
Value conv2d(const Value& x, const Value& w, const Value& b, std::vector<int64_t> stride = {1, 1},
             std::vector<int64_t> padding = {0, 0}, std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
Value max_pool2d(const Value& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                 std::vector<int64_t> padding = {0, 0});
Value avg_pool2d(const Value& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                 std::vector<int64_t> padding = {0, 0});
// Causal convolution over time (conv1d_causal.cpp): x (B, C_in, T), w (C_out, C_in, k), b (C_out) or
// undefined -> (B, C_out, T); y[t] reads x[t - L .. t], L = (k - 1) * dilation, zeros before the start.
// `past` (B, C_in, P <= L, no gradient) continues a sequence: the P steps that came before x.
Value conv1d_causal(const Value& x, const Value& w, const Value& b, int64_t dilation = 1,
                    const Value& past = Value());

// ---- activations --------------------------------------------------------------------------------
Value relu(const Value& x);
Value gelu(const Value& x, const std::string& approximate = "none");  // "none" or "tanh"
Value tanh(const Value& x);
Value sigmoid(const Value& x);
Value softmax(const Value& x, int64_t dim);
Value log_softmax(const Value& x, int64_t dim);

// ---- normalisation and regularisation ------------------------------------------------------------
Value layer_norm(const Value& x, std::vector<int64_t> normalized_shape, const Value& w, const Value& b,
                 double eps = 1e-5);
// Training mode updates running_mean/running_var in place (buffers, not graph values).
Value batch_norm(const Value& x, const Value& w, const Value& b, at::Tensor running_mean,
                 at::Tensor running_var, bool training, double momentum = 0.1, double eps = 1e-5);
Value dropout(const Value& x, double p, bool training);
Value embedding(const Value& weight, const Value& indices, int64_t padding_idx = -1);  // indices int64

// ---- sparse lookups (embedding_bag.cpp) --------------------------------------------------------------
// Multi-hot bags: out[b] = reduce(table_rows[ids[offsets[b] .. offsets[b+1])]) with weights when given.
// table_rows (N, D); ids int64 (n) in [0, N); offsets int64 (B) bag starts (first 0, non-decreasing,
// empty bags allowed); per_sample_weights (n) or undefined (mode sum only). Output (B, D). The table's
// gradient is sparse: a coalesced COO tensor holding only the unique ids and their row gradients.
enum class EmbeddingBagMode { Sum, Mean };
std::string embedding_bag_mode_name(EmbeddingBagMode mode);
Value embedding_bag(const Value& table_rows, const Value& ids, const Value& offsets,
                    EmbeddingBagMode mode = EmbeddingBagMode::Sum, const Value& per_sample_weights = {});
// The unique row ids (U) int64, sorted, and their gradients (U, D), of a sparse gradient from embedding_bag.
struct SparseRows {
  at::Tensor ids;
  at::Tensor rows;
};
SparseRows sparse_rows(const at::Tensor& grad);

// ---- losses (mean over non-ignored elements) ------------------------------------------------------
Value cross_entropy(const Value& logits, const Value& target, int64_t ignore_index = -100);  // (N, C), (N)
Value mse_loss(const Value& input, const Value& target);

// ---- shape --------------------------------------------------------------------------------------
Value reshape(const Value& x, std::vector<int64_t> shape);
Value view(const Value& x, std::vector<int64_t> shape);
// x itself (a view) whose backward hands the incoming gradient to `observer` before passing it on
// unchanged: how natural-gradient methods see a layer's output gradient (nn/observe.h).
Value observe_grad(const Value& x, std::function<void(const at::Tensor&)> observer);
Value flatten(const Value& x, int64_t start_dim = 1, int64_t end_dim = -1);
Value transpose(const Value& x, int64_t dim0, int64_t dim1);
Value permute(const Value& x, std::vector<int64_t> dims);
Value cat(const Values& xs, int64_t dim);
Values split(const Value& x, int64_t split_size, int64_t dim);
Value slice(const Value& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);

// ---- reductions ---------------------------------------------------------------------------------
Value sum(const Value& x);
Value sum(const Value& x, std::vector<int64_t> dims, bool keepdim = false);
Value mean(const Value& x);
Value mean(const Value& x, std::vector<int64_t> dims, bool keepdim = false);

// ---- attention ----------------------------------------------------------------------------------
// Causal scaled-dot-product attention: q (B, H, Tq, D), k, v (B, H, Tk, D), Tk >= Tq -> (B, H, Tq, D);
// dropout on the weights. Query i sits at position i + Tk - Tq among the keys (Tk == Tq: self-attention
// over one sequence; Tk > Tq: the keys start with Tk - Tq cached earlier steps). window = 0 attends every
// earlier key; window = L > 0 only the current key and the previous L (sliding-window attention).
// `heads` says which heads of a larger layer q holds (tensor parallel, distributed/tensor_parallel_block.h):
// the dropout mask is drawn for all `heads.total` heads and this slice of it kept, so the masks are the
// one-process layer's for these heads (the default: q holds every head).
struct HeadSlice {
  int64_t first = 0;  // q's head 0 is head `first` of the layer
  int64_t total = 0;  // the layer's heads; 0: q.size(1) (q holds them all)
};
Value causal_attention(const Value& q, const Value& k, const Value& v, double dropout_p = 0.0,
                       bool training = false, int64_t window = 0, HeadSlice heads = {});

// ---- recurrent cells (PyTorch gate layouts) --------------------------------------------------------
// LSTM: x (B, I), h/c (B, H), w_ih (4H, I), w_hh (4H, H), biases (4H) or undefined -> {h', c'}.
Values lstm_cell(const Value& x, const Value& h, const Value& c, const Value& w_ih, const Value& w_hh,
                 const Value& b_ih, const Value& b_hh);
// GRU: x (B, I), h (B, H), w_ih (3H, I), w_hh (3H, H), biases (3H) or undefined -> h'.
Value gru_cell(const Value& x, const Value& h, const Value& w_ih, const Value& w_hh, const Value& b_ih,
               const Value& b_hh);

}  // namespace ration::ops

namespace ration {
inline Value operator+(const Value& a, const Value& b) { return ops::add(a, b); }
inline Value operator-(const Value& a, const Value& b) { return ops::sub(a, b); }
inline Value operator*(const Value& a, const Value& b) { return ops::mul(a, b); }
inline Value operator/(const Value& a, const Value& b) { return ops::div(a, b); }
inline Value operator*(const Value& a, double s) { return ops::mul_scalar(a, s); }
inline Value operator+(const Value& a, double s) { return ops::add_scalar(a, s); }
}  // namespace ration
