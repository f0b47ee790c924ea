// rnn.cpp — lstm_cell and gru_cell with PyTorch's gate layouts and a hand-written backward in ATen ops.
//
// LSTM (gates stacked i, f, g, o in w_ih (4H, I), w_hh (4H, H)):
//   gates = h w_hh^T + b_hh + x w_ih^T + b_ih                       (B, 4H)
//   i = sigmoid, f = sigmoid, g = tanh, o = sigmoid of the four chunks
//   c' = f * c + i * g,  h' = o * tanh(c')
//   keeps: x, h, c, w_ih, w_hh (inputs), c' (output 1) and the activated gates [i f g o] (output 2,
//   internal, (B, 4H)); tanh(c') is recomputed in backward rather than kept.
// lstm_cell_projected: the same cell given gx = x w_ih^T + b_ih (B, 4H), computed by the caller for a whole
//   sequence in one matmul (nn::LSTM), as torch.nn.LSTM does; keeps h, c, w_hh, c' and the gates, and
//   returns dgates as gx's gradient (so w_ih's gradient is one matmul over the sequence too).
//
// GRU (gates stacked r, z, n in w_ih (3H, I), w_hh (3H, H)):
//   gi = x w_ih^T + b_ih, gh = h w_hh^T + b_hh                      (B, 3H) each
//   r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r * gh_n)
//   h' = (1 - z) * n + z * h  (computed as (h - n) * z + n, like at::gru_cell)
//   keeps: x, h, w_ih, w_hh (inputs) and [r z n gh_n] (output 1, internal, (B, 4H)).
//
// Gradients for the biases are the row sums of the pre-activation gradients; b_ih and b_hh share them
// for LSTM, and differ only in the n chunk for GRU (r * dn vs dn).
#include "ration/base/check.h"
#include "ration/ops/op_util.h"
#include "ration/ops/ops.h"
#include "ration/ops/recurrent.h"

#include <utility>

namespace ration::ops {
using namespace detail;
using Tensors = std::vector<at::Tensor>;

namespace {
void check_cell(const char* op, int64_t gates, const Value& x, const Value& h, const Value& w_ih, const Value& w_hh,
                const Value& b_ih, const Value& b_hh) {
  RATION_CHECK(x.dim() == 2 && h.dim() == 2 && x.size(0) == h.size(0), op, " expects x (B, I) and h (B, H); got ",
               x.sizes(), " and ", h.sizes());
  const int64_t hidden = h.size(1);
  RATION_CHECK(w_ih.dim() == 2 && w_ih.size(0) == gates * hidden && w_ih.size(1) == x.size(1), op, ": w_ih must be (",
               gates, "H=", gates * hidden, ", I=", x.size(1), "); got ", w_ih.sizes());
  RATION_CHECK(w_hh.dim() == 2 && w_hh.size(0) == gates * hidden && w_hh.size(1) == hidden, op, ": w_hh must be (",
               gates, "H=", gates * hidden, ", H=", hidden, "); got ", w_hh.sizes());
  for (const Value* b : {&b_ih, &b_hh}) {
    RATION_CHECK(!b->defined() || (b->dim() == 1 && b->size(0) == gates * hidden), op, ": biases must be (", gates,
                 "H=", gates * hidden, ") or undefined; got ", b->sizes());
  }
}
}  // namespace

// The cell from its pre-activation gates (B, 4H), a fresh tensor, and c (B, H): {h' (B, H), c' (B, H),
// act [i f g o] (B, 4H)}. The gates are activated in place (as PyTorch's CPU cell does) unless libtorch
// autograd records the op (the oracle: ops run under libtorch autograd in tests), which in-place writes to views
// of one tensor would break; both give the same bits.
static Tensors lstm_from_gates(at::Tensor gates, const at::Tensor& c) {
  const int64_t hs = c.size(1);
  const bool recorded = at::GradMode::is_enabled() && (gates.requires_grad() || c.requires_grad());
  at::Tensor act = gates;  // (B, 4H)
  if (recorded) {
    act = at::cat({at::sigmoid(gates.narrow(1, 0, 2 * hs)), at::tanh(gates.narrow(1, 2 * hs, hs)),
                   at::sigmoid(gates.narrow(1, 3 * hs, hs))},
                  1);
  } else {
    gates.narrow(1, 0, 2 * hs).sigmoid_();
    gates.narrow(1, 2 * hs, hs).tanh_();
    gates.narrow(1, 3 * hs, hs).sigmoid_();
  }
  const at::Tensor i = act.narrow(1, 0, hs), f = act.narrow(1, hs, hs), g = act.narrow(1, 2 * hs, hs),
                   o = act.narrow(1, 3 * hs, hs);
  at::Tensor c_next = at::mul(f, c).add_(at::mul(i, g));                          // (B, H)
  at::Tensor h_next = recorded ? at::mul(o, at::tanh(c_next)) : at::tanh(c_next).mul_(o);  // (B, H)
  return Tensors{h_next, c_next, act};
}

// Backward through the gates: {dgates (B, 4H) pre-activation, dc (B, H) = dL/dc for the previous c}, from
// the output gradients, the kept c' and act, and the input c.
static std::pair<at::Tensor, at::Tensor> lstm_gate_grads(const Tensors& grads, const at::Tensor& c_next,
                                                  const at::Tensor& act, const at::Tensor& c) {
  const at::Tensor &dh_next = grads[0], &dc_next = grads[1];
  const int64_t hs = act.size(1) / 4;
  const at::Tensor i = act.narrow(1, 0, hs), f = act.narrow(1, hs, hs), g = act.narrow(1, 2 * hs, hs),
                   o = act.narrow(1, 3 * hs, hs);
  const at::Tensor tanh_c = at::tanh(c_next);                               // (B, H)
  const at::Tensor dc = dc_next + at::tanh_backward(dh_next * o, tanh_c);  // (B, H) total dL/dc'
  at::Tensor dgates = at::empty_like(act);                                  // (B, 4H), pre-activation
  at::Tensor di = dgates.narrow(1, 0, hs), df = dgates.narrow(1, hs, hs), dg = dgates.narrow(1, 2 * hs, hs),
             d_o = dgates.narrow(1, 3 * hs, hs);
  at::sigmoid_backward_out(di, dc * g, i);
  at::sigmoid_backward_out(df, dc * c, f);
  at::tanh_backward_out(dg, dc * i, g);
  at::sigmoid_backward_out(d_o, dh_next * tanh_c, o);
  return {dgates, dc * f};
}

Values lstm_cell(const Value& x, const Value& h, const Value& c, const Value& w_ih, const Value& w_hh,
                 const Value& b_ih, const Value& b_hh) {
  check_cell("lstm_cell", 4, x, h, w_ih, w_hh, b_ih, b_hh);
  RATION_CHECK(c.sizes() == h.sizes(), "lstm_cell: c ", c.sizes(), " must match h ", h.sizes());
  // inputs: 0 x, 1 h, 2 c, 3 w_ih, 4 w_hh, 5 b_ih, 6 b_hh
  // outputs: 0 h' (B, H), 1 c' (B, H), 2 activated gates [i f g o] (B, 4H), internal
  return apply_op(
      spec("lstm_cell", {0, 1, 2, 3, 4}, {1, 2}, /*visible_outputs=*/2), {x, h, c, w_ih, w_hh, b_ih, b_hh},
      [](const Tensors& in, ForwardCtx&) {
        const at::Tensor gates = at::linear(in[1], in[4], in[6]).add(at::linear(in[0], in[3], in[5]));  // (B, 4H)
        return lstm_from_gates(gates, in[2]);
      },
      [](BackwardCtx& ctx, const Tensors& grads) {
        const auto [dgates, dc_prev] = lstm_gate_grads(grads, ctx.output(1), ctx.output(2), ctx.input(2));
        Tensors d(7);
        if (ctx.needs_input_grad(0)) d[0] = at::mm(dgates, ctx.input(3));
        if (ctx.needs_input_grad(1)) d[1] = at::mm(dgates, ctx.input(4));
        if (ctx.needs_input_grad(2)) d[2] = dc_prev;
        if (ctx.needs_input_grad(3)) d[3] = at::mm(dgates.t(), ctx.input(0));
        if (ctx.needs_input_grad(4)) d[4] = at::mm(dgates.t(), ctx.input(1));
        if (ctx.needs_input_grad(5) || ctx.needs_input_grad(6)) {
          const at::Tensor db = dgates.sum(0);  // (4H)
          if (ctx.needs_input_grad(5)) d[5] = db;
          if (ctx.needs_input_grad(6)) d[6] = db;
        }
        return d;
      });
}

Values lstm_cell_projected(const Value& gx, const Value& h, const Value& c, const Value& w_hh, const Value& b_hh) {
  RATION_CHECK(gx.dim() == 2 && h.dim() == 2 && gx.size(0) == h.size(0) && gx.size(1) == 4 * h.size(1),
               "lstm_cell_projected expects gx (B, 4H) and h (B, H); got ", gx.sizes(), " and ", h.sizes());
  RATION_CHECK(c.sizes() == h.sizes(), "lstm_cell_projected: c ", c.sizes(), " must match h ", h.sizes());
  RATION_CHECK(w_hh.dim() == 2 && w_hh.size(0) == gx.size(1) && w_hh.size(1) == h.size(1),
               "lstm_cell_projected: w_hh must be (4H, H); got ", w_hh.sizes());
  // inputs: 0 gx, 1 h, 2 c, 3 w_hh, 4 b_hh
  // outputs: 0 h' (B, H), 1 c' (B, H), 2 activated gates [i f g o] (B, 4H), internal
  return apply_op(
      spec("lstm_cell_projected", {1, 2, 3}, {1, 2}, /*visible_outputs=*/2), {gx, h, c, w_hh, b_hh},
      [](const Tensors& in, ForwardCtx&) {
        const at::Tensor gates = at::linear(in[1], in[3], in[4]).add(in[0]);  // (B, 4H)
        return lstm_from_gates(gates, in[2]);
      },
      [](BackwardCtx& ctx, const Tensors& grads) {
        const auto [dgates, dc_prev] = lstm_gate_grads(grads, ctx.output(1), ctx.output(2), ctx.input(2));
        Tensors d(5);
        if (ctx.needs_input_grad(0)) d[0] = dgates;
        if (ctx.needs_input_grad(1)) d[1] = at::mm(dgates, ctx.input(3));
        if (ctx.needs_input_grad(2)) d[2] = dc_prev;
        if (ctx.needs_input_grad(3)) d[3] = at::mm(dgates.t(), ctx.input(1));
        if (ctx.needs_input_grad(4)) d[4] = dgates.sum(0);
        return d;
      });
}

Value gru_cell(const Value& x, const Value& h, const Value& w_ih, const Value& w_hh, const Value& b_ih,
               const Value& b_hh) {
  check_cell("gru_cell", 3, x, h, w_ih, w_hh, b_ih, b_hh);
  // inputs: 0 x, 1 h, 2 w_ih, 3 w_hh, 4 b_ih, 5 b_hh
  // outputs: 0 h' (B, H), 1 [r z n gh_n] (B, 4H), internal
  return single(apply_op(
      spec("gru_cell", {0, 1, 2, 3}, {1}), {x, h, w_ih, w_hh, b_ih, b_hh},
      [](const Tensors& in, ForwardCtx&) {
        const int64_t hs = in[1].size(1);
        const at::Tensor gi = at::linear(in[0], in[2], in[4]);  // (B, 3H)
        const at::Tensor gh = at::linear(in[1], in[3], in[5]);  // (B, 3H)
        const at::Tensor r = at::sigmoid(gh.narrow(1, 0, hs).add(gi.narrow(1, 0, hs)));
        const at::Tensor z = at::sigmoid(gh.narrow(1, hs, hs).add(gi.narrow(1, hs, hs)));
        const at::Tensor gh_n = gh.narrow(1, 2 * hs, hs);
        const at::Tensor n = at::tanh(gi.narrow(1, 2 * hs, hs).add(gh_n.mul(r)));
        at::Tensor h_next = at::sub(in[1], n).mul(z).add(n);  // (B, H)
        return Tensors{h_next, at::cat({r, z, n, gh_n}, 1)};
      },
      [](BackwardCtx& ctx, const Tensors& grads) {
        const at::Tensor& dh_next = grads[0];
        const at::Tensor saved = ctx.output(1);
        const int64_t hs = saved.size(1) / 4;
        const at::Tensor r = saved.narrow(1, 0, hs), z = saved.narrow(1, hs, hs), n = saved.narrow(1, 2 * hs, hs),
                         gh_n = saved.narrow(1, 3 * hs, hs);
        const at::Tensor h = ctx.input(1);
        const at::Tensor dn = at::tanh_backward(dh_next * (1 - z), n);       // (B, H), pre-tanh
        const at::Tensor dz = at::sigmoid_backward(dh_next * (h - n), z);    // (B, H), pre-sigmoid
        const at::Tensor dr = at::sigmoid_backward(dn * gh_n, r);            // (B, H), pre-sigmoid
        const at::Tensor dgi = at::cat({dr, dz, dn}, 1);                      // (B, 3H)
        const at::Tensor dgh = at::cat({dr, dz, dn * r}, 1);                  // (B, 3H)
        Tensors d(6);
        if (ctx.needs_input_grad(0)) d[0] = at::mm(dgi, ctx.input(2));
        if (ctx.needs_input_grad(1)) d[1] = at::mm(dgh, ctx.input(3)).add(dh_next * z);
        if (ctx.needs_input_grad(2)) d[2] = at::mm(dgi.t(), ctx.input(0));
        if (ctx.needs_input_grad(3)) d[3] = at::mm(dgh.t(), h);
        if (ctx.needs_input_grad(4)) d[4] = dgi.sum(0);
        if (ctx.needs_input_grad(5)) d[5] = dgh.sum(0);
        return d;
      }));
}

}  // namespace ration::ops
