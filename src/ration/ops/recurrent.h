// recurrent.h — the LSTM cell over a precomputed input projection (ops/rnn.cpp; the cells taking x are in
// ops.h). Owns: the declaration only.
#pragma once
#include "ration/core/value.h"

namespace ration::ops {

// The LSTM cell from the input's projection gx = x w_ih^T + b_ih (B, 4H), computed for many steps at once by
// the caller (nn::LSTM: one matmul over the sequence, as torch.nn.LSTM does): gx, h/c (B, H), w_hh (4H, H),
// b_hh (4H) or undefined -> {h', c'}. gx's gradient is the pre-activation gates' (B, 4H).
Values lstm_cell_projected(const Value& gx, const Value& h, const Value& c, const Value& w_hh, const Value& b_hh);

}  // namespace ration::ops
