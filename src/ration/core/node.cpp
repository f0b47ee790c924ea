#include "ration/core/node.h"
#include "ration/base/timing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>

#include "ration/base/check.h"
#include "ration/core/trace.h"
#include "ration/core/saved_value.h"

#ifdef RATION_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace ration {
namespace {

std::atomic<uint64_t> g_next_seq{1};
thread_local std::string t_scope;
std::mutex g_seed_mu;
std::mt19937_64 g_seed_stream(0x5eed);

TensorMeta meta_of(const at::Tensor& t) {
  if (!t.defined()) return {};
  return {t.sizes().vec(), t.options()};
}

int64_t bytes_of(const TensorMeta& m) {
  if (m.sizes.empty() && !m.options.has_dtype()) return 0;
  int64_t n = 1;
  for (auto s : m.sizes) n *= s;
  return n * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(m.options.dtype())));
}

// The shared handle for an input value; leaves and constants get a pinned one.
std::shared_ptr<SavedValue> handle_of(const Value& v) {
  ValueImpl& impl = *v.impl();
  if (auto h = impl.saved.lock()) return h;
  std::shared_ptr<SavedValue> h;
  if (impl.grad_fn) {
    h = impl.grad_fn->output_handle(impl.output_nr);
  } else {
    h = std::make_shared<SavedValue>(impl.tensor);
    impl.pinned_saved = h;
  }
  impl.saved = h;
  return h;
}

Values wrap_outputs(std::vector<at::Tensor>& outs, int visible, bool torch_tracks) {
  Values result;
  result.reserve(static_cast<size_t>(visible));
  for (int j = 0; j < visible; ++j) {
    auto impl = std::make_shared<ValueImpl>();
    impl->tensor = std::move(outs[static_cast<size_t>(j)]);
    impl->requires_grad = torch_tracks && impl->tensor.defined() && impl->tensor.requires_grad();
    result.emplace_back(std::move(impl));
  }
  return result;
}

}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_seed_mu);
  g_seed_stream.seed(seed);
}

uint64_t next_op_seed() {
  std::lock_guard<std::mutex> lock(g_seed_mu);
  return g_seed_stream();
}

at::Generator make_generator(uint64_t seed, const at::Device& device) {
#ifdef RATION_CUDA
  if (device.is_cuda()) {
    at::Generator gen = at::cuda::detail::createCUDAGenerator(device.index());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  RATION_CHECK(device.is_cpu(), "random ops on ", device, " need a build with -DRATION_CUDA=ON");
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

namespace {
thread_local RecomputeCache* t_recompute_cache = nullptr;
}  // namespace

RecomputeCache::RecomputeCache() : prev_(t_recompute_cache) { t_recompute_cache = this; }
RecomputeCache::~RecomputeCache() { t_recompute_cache = prev_; }
RecomputeCache* RecomputeCache::current() { return t_recompute_cache; }
const std::vector<at::Tensor>* RecomputeCache::find(const Node* node) const {
  auto it = entries_.find(node);
  return it == entries_.end() ? nullptr : &it->second;
}
void RecomputeCache::insert(const Node* node, std::vector<at::Tensor> outputs) { entries_[node] = std::move(outputs); }

ScopeGuard::ScopeGuard(const std::string& name) : prev_len_(t_scope.size()) {
  if (name.empty()) return;
  if (!t_scope.empty()) t_scope += '.';
  t_scope += name;
}
ScopeGuard::~ScopeGuard() { t_scope.resize(prev_len_); }
const std::string& current_scope() { return t_scope; }

std::shared_ptr<SavedValue> Node::output_handle(int j) {
  auto& slot = outputs.at(static_cast<size_t>(j));
  if (auto h = slot.lock()) return h;
  auto h = std::make_shared<SavedValue>(shared_from_this(), j, bytes_of(output_meta.at(static_cast<size_t>(j))));
  slot = h;
  return h;
}

std::vector<at::Tensor> Node::recompute(bool store_required) {
  RecomputeCache* cache = RecomputeCache::current();
  MemoryPolicy* policy = current_policy();
  if (cache != nullptr) {
    if (const auto* hit = cache->find(this)) {
      for (size_t j = 0; j < hit->size(); ++j) {
        if (auto h = outputs[j].lock()) h->accept_rebuilt((*hit)[j]);
      }
      return *hit;
    }
  }
  TraceSpan span(SpanKind::Recompute, scope, spec.name);
  std::vector<at::Tensor> in(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]) in[i] = inputs[i]->materialize();
  }
  ForwardCtx ctx;
  if (rng_seed) ctx.generator = make_generator(*rng_seed, output_meta.at(0).options.device());
  std::vector<at::Tensor> outs;
  const auto t0 = std::chrono::steady_clock::now();
  {
    at::NoGradGuard no_grad;
    outs = forward(in, ctx);
  }
  const double ms = ms_since(t0);
  RATION_ASSERT(outs.size() == output_meta.size(), spec.name, " recompute returned ", outs.size(), " outputs");
  // Asked after the re-run, like the simulator, so the decision sees the same step state.
  const bool transient = !store_required && policy != nullptr && !policy->store_rebuilt(*this);
  if (!transient) {
    for (size_t j = 0; j < outs.size(); ++j) {
      if (auto h = outputs[j].lock()) h->accept_rebuilt(outs[j]);
    }
  }
  if (policy != nullptr) policy->on_recompute(*this, ms);
  if (cache != nullptr && !transient) cache->insert(this, outs);
  return outs;
}

at::Tensor BackwardCtx::unpack(bool is_output, int index) {
  for (auto& ref : node_.saved) {
    if (ref.is_output == is_output && ref.index == index) return ref.value->unpack(ref.version);
  }
  RATION_ASSERT(false, "op '", node_.spec.name, "' backward reads ", is_output ? "output " : "input ", index,
                " which its OpSpec does not save");
}

at::Tensor BackwardCtx::input(int i) { return unpack(false, i); }
at::Tensor BackwardCtx::output(int j) { return unpack(true, j); }
bool BackwardCtx::needs_input_grad(int i) const {
  return node_.next_edges.at(static_cast<size_t>(i)).valid();
}

Values apply_op(const OpSpec& spec, const Values& inputs, ForwardFn forward, BackwardFn backward) {
  std::vector<at::Tensor> in(inputs.size());
  bool any_requires_grad = false;
  at::Device device = at::kCPU;
  bool have_device = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    in[i] = inputs[i].tensor();
    any_requires_grad = any_requires_grad || inputs[i].requires_grad();
    if (!have_device) {
      device = in[i].device();
      have_device = true;
    }
  }
  ForwardCtx ctx;
  std::optional<uint64_t> seed;
  if (spec.uses_rng) {
    seed = next_op_seed();
    ctx.generator = make_generator(*seed, device);
  }

  if (oracle_mode()) {  // torch::autograd records the forward; we record nothing
    std::vector<at::Tensor> outs = forward(in, ctx);
    return wrap_outputs(outs, spec.visible_outputs, /*torch_tracks=*/true);
  }

  const bool record = any_requires_grad && grad_enabled();
  // Spans the forward and the policy's after_forward_node: the memory sample at its end is the node's.
  std::optional<TraceSpan> span;
  if (record) span.emplace(SpanKind::Forward, t_scope, spec.name);
  std::vector<at::Tensor> outs;
  const auto t0 = std::chrono::steady_clock::now();
  {
    at::NoGradGuard no_grad;
    outs = forward(in, ctx);
  }
  const double ms = ms_since(t0);
  RATION_ASSERT(static_cast<int>(outs.size()) >= spec.visible_outputs, spec.name, " returned ", outs.size(),
                " outputs, spec says ", spec.visible_outputs, " visible");
  if (!record) return wrap_outputs(outs, spec.visible_outputs, /*torch_tracks=*/false);

  auto node = std::make_shared<Node>();
  node->spec = spec;
  node->seq = g_next_seq++;
  node->scope = t_scope;
  node->forward = std::move(forward);
  node->backward = std::move(backward);
  node->rng_seed = seed;
  node->forward_ms = ms;
  node->inputs.resize(inputs.size());
  node->next_edges.resize(inputs.size());
  node->input_meta.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    node->inputs[i] = handle_of(inputs[i]);
    node->input_meta[i] = meta_of(in[i]);
    const ValueImpl& impl = *inputs[i].impl();
    if (impl.requires_grad) {
      if (impl.grad_fn) node->next_edges[i] = Edge{impl.grad_fn, impl.output_nr, nullptr};
      else node->next_edges[i] = Edge{nullptr, 0, inputs[i].impl()};
    }
  }
  node->output_meta.reserve(outs.size());
  for (const auto& t : outs) node->output_meta.push_back(meta_of(t));
  node->outputs.resize(outs.size());

  for (int i : spec.save_inputs) {
    auto h = node->inputs.at(static_cast<size_t>(i));
    if (!h) continue;  // optional input not given
    const uint32_t version = h->save(in[static_cast<size_t>(i)]);
    if (spec.replicas && std::find(spec.replicated_inputs.begin(), spec.replicated_inputs.end(), i) !=
                             spec.replicated_inputs.end())
      h->set_replicas(spec.replicas);
    node->saved.push_back(SavedRef{h, version, false, i});
  }
  for (int j : spec.save_outputs) {
    if (!outs.at(static_cast<size_t>(j)).defined()) continue;
    auto h = node->output_handle(j);
    const uint32_t version = h->save(outs[static_cast<size_t>(j)]);
    node->saved.push_back(SavedRef{h, version, true, j});
  }

  Values result;
  result.reserve(static_cast<size_t>(spec.visible_outputs));
  for (int j = 0; j < spec.visible_outputs; ++j) {
    auto impl = std::make_shared<ValueImpl>();
    impl->tensor = outs[static_cast<size_t>(j)];
    impl->requires_grad = impl->tensor.defined() && at::isFloatingType(impl->tensor.scalar_type());
    if (impl->requires_grad) {
      impl->grad_fn = node;
      impl->output_nr = j;
      if (auto h = node->outputs[static_cast<size_t>(j)].lock()) impl->saved = h;
    }
    node->output_values.push_back(impl);
    result.emplace_back(std::move(impl));
  }
  if (MemoryPolicy* policy = current_policy()) policy->after_forward_node(*node, in, outs);
  span.reset();  // ends here: the memory sample sees what the policy left, before `outs` goes
  return result;
}

}  // namespace ration
