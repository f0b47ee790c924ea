// generic_op.cpp — see generic_op.h.
#include "ration/torchscript/generic_op.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>

#include "ration/base/check.h"
#include "ration/core/node.h"

namespace ration::torchscript {
namespace {

using Tensors = std::vector<at::Tensor>;

// fn with ATen's default CPU generator seeded from `seed` (its state restored afterwards), so a re-run
// draws exactly what the first run drew; without a seed, fn as is.
Tensors run_seeded(const TensorFn& fn, const Tensors& in, std::optional<uint64_t> seed) {
  if (!seed) return fn(in);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor state = gen.get_state();
  gen.set_current_seed(*seed);
  Tensors out;
  try {
    out = fn(in);
  } catch (...) {
    gen.set_state(state);
    throw;
  }
  gen.set_state(state);
  return out;
}

// Re-runs fn on the saved inputs with libtorch autograd recording, then differentiates it: the gradients
// of the inputs backward asks for (floating ones only; the others get none).
Tensors generic_backward(const std::string& op, const std::string& where, const TensorFn& fn, BackwardCtx& ctx,
                         const Tensors& grads) {
  const size_t n = ctx.node().inputs.size();
  Tensors in(n), wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < n; ++i) {
    if (ctx.node().inputs[i] == nullptr) continue;  // an absent optional input
    at::Tensor t = ctx.input(static_cast<int>(i)).detach();
    if (ctx.needs_input_grad(static_cast<int>(i)) && at::isFloatingType(t.scalar_type())) {
      t.requires_grad_(true);
      wrt.push_back(t);
      wrt_index.push_back(i);
    }
    in[i] = t;
  }
  Tensors outs;
  {
    at::AutoGradMode on(true);
    outs = run_seeded(fn, in, ctx.node().rng_seed);
  }
  Tensors ys, dys;
  for (size_t j = 0; j < outs.size() && j < grads.size(); ++j) {
    if (!grads[j].defined() || !outs[j].defined() || !outs[j].requires_grad()) continue;
    ys.push_back(outs[j]);
    dys.push_back(grads[j]);
  }
  Tensors result(n);
  if (ys.empty() || wrt.empty()) return result;
  Tensors dx;
  try {
    dx = torch::autograd::grad(ys, wrt, dys, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  } catch (const c10::Error& e) {
    RATION_CHECK(false, "torchscript: ", op, " (", where, ") has no backward in libtorch, so ration cannot train ",
                 "through it: ", e.what_without_backtrace(),
                 "; hint: keep this op out of the trained path (compute it under torch.no_grad() in the module)");
  }
  for (size_t k = 0; k < wrt_index.size(); ++k) result[wrt_index[k]] = dx[k];
  return result;
}

}  // namespace

std::string generic_node_name(const std::string& op) { return "generic:" + op; }

Values generic_node(const std::string& op, const std::string& where, const Values& inputs, TensorFn fn,
                    int visible_outputs, bool uses_rng) {
  OpSpec spec;
  spec.name = generic_node_name(op);
  spec.visible_outputs = visible_outputs;
  spec.uses_rng = uses_rng;
  for (size_t i = 0; i < inputs.size(); ++i) spec.save_inputs.push_back(static_cast<int>(i));
  auto forward = [fn](const Tensors& in, ForwardCtx& ctx) {
    std::optional<uint64_t> seed;
    if (ctx.generator) seed = ctx.generator->current_seed();
    return run_seeded(fn, in, seed);
  };
  auto backward = [op, where, fn](BackwardCtx& ctx, const Tensors& grads) {
    return generic_backward(op, where, fn, ctx, grads);
  };
  return apply_op(spec, inputs, forward, backward);
}

}  // namespace ration::torchscript
