#include "ration/core/engine.h"

#include <ATen/core/grad_mode.h>

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/core/trace.h"
#include "ration/base/allocator.h"
#include "ration/core/saved_value.h"

namespace ration {
namespace {

struct PendingNode {
  int dependencies = 0;
  std::vector<at::Tensor> grads;  // one per visible output, summed
};

struct BySeq {
  bool operator()(const Node* a, const Node* b) const { return a->seq < b->seq; }
};

void add_into(at::Tensor& slot, at::Tensor g) {
  if (!slot.defined()) slot = std::move(g);
  else slot = slot + g;  // out of place: `slot` may alias a gradient routed elsewhere
}

void accumulate_leaf(ValueImpl& leaf, at::Tensor g) {
  memory::CategoryGuard cat(memory::Category::Gradients);
  // Sparse row gradients (ops::embedding_bag) stay sparse: only the touched rows exist.
  if (g.is_sparse() || (leaf.grad.defined() && leaf.grad.is_sparse())) {
    if (!leaf.grad.defined()) leaf.grad = std::move(g);
    else if (leaf.grad.is_sparse() && g.is_sparse()) leaf.grad = (leaf.grad + g).coalesce();
    else leaf.grad = leaf.grad.is_sparse() ? g + leaf.grad : leaf.grad + g;  // dense + sparse is dense
    return;
  }
  if (!leaf.grad.defined()) {
    const bool unique = g.use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
                        g.storage_offset() == 0 && g.numel() * g.element_size() == static_cast<int64_t>(g.storage().nbytes());
    leaf.grad = unique ? std::move(g) : g.clone(at::MemoryFormat::Contiguous);
    memory::retag(leaf.grad, memory::Category::Gradients);
  } else {
    leaf.grad.add_(g);
  }
}

}  // namespace

void run_backward(const Values& roots, const std::vector<at::Tensor>& grads, bool retain_graph) {
  RATION_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(), " gradients");
  std::unordered_map<Node*, PendingNode> pending;
  std::unordered_map<ValueImpl*, int> leaf_dependencies;

  // Count, for every reachable node and leaf, how many edges will deliver a gradient to it.
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const auto& root : roots) {
    RATION_CHECK(root.defined(), "backward of an undefined value");
    RATION_CHECK(root.requires_grad(), "backward of a value that does not require grad (no parameter or "
                                       "input with requires_grad contributed to it, or it was computed under NoGradGuard)");
    if (root.grad_fn() && seen.insert(root.grad_fn().get()).second) stack.push_back(root.grad_fn().get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    pending[n];
    for (const Edge& e : n->next_edges) {
      if (e.node) {
        ++pending[e.node.get()].dependencies;
        if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      } else if (e.leaf) {
        ++leaf_dependencies[e.leaf.get()];
      }
    }
  }

  // Seed the roots.
  std::priority_queue<Node*, std::vector<Node*>, BySeq> ready;
  for (size_t r = 0; r < roots.size(); ++r) {
    const Value& root = roots[r];
    at::Tensor g = grads[r];
    if (!g.defined()) {
      RATION_CHECK(root.numel() == 1, "backward without a gradient needs a scalar; got shape ", root.sizes());
      g = at::ones_like(root.tensor());
    }
    RATION_CHECK(g.sizes() == root.sizes(), "backward gradient shape ", g.sizes(), " != value shape ", root.sizes());
    if (!root.grad_fn()) {
      accumulate_leaf(*root.impl(), g);
      for (auto& hook : root.impl()->grad_ready_hooks) hook(*root.impl());
      continue;
    }
    Node* n = root.grad_fn().get();
    auto& p = pending[n];
    p.grads.resize(static_cast<size_t>(n->spec.visible_outputs));
    add_into(p.grads[static_cast<size_t>(root.impl()->output_nr)], g);
  }
  for (const auto& root : roots) {
    Node* n = root.grad_fn().get();
    if (n && pending[n].dependencies == 0 && seen.erase(n)) ready.push(n);
  }

  memory::CategoryGuard workspace(memory::Category::Workspace);
  MemoryPolicy* policy = current_policy();
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    TraceSpan span(SpanKind::Backward, n->scope, n->spec.name);  // ends after the gradients are routed
    RATION_CHECK(!n->released, "Trying to backward through the graph a second time (op '", n->spec.name,
                 "' already freed its saved values). Pass retain_graph=true to the first backward.");
    std::vector<at::Tensor> grad_out = std::move(pending[n].grads);
    pending.erase(n);
    grad_out.resize(static_cast<size_t>(n->spec.visible_outputs));
    for (size_t j = 0; j < grad_out.size(); ++j) {
      if (!grad_out[j].defined()) {
        const TensorMeta& m = n->output_meta[j];
        grad_out[j] = at::zeros(m.sizes, m.options);
      }
    }
    if (policy) policy->before_backward_node(*n);
    std::vector<at::Tensor> grad_in;
    {
      at::NoGradGuard no_grad;
      RecomputeCache recompute_cache;
      // Rebuild or fetch every saved value before the node's backward allocates anything, so a node's
      // peak is (rebuilt values) then (its backward workspace), the order the planner simulates.
      for (auto& ref : n->saved) (void)ref.value->unpack(ref.version);
      BackwardCtx ctx(*n);
      grad_in = n->backward(ctx, grad_out);
    }
    grad_out.clear();
    RATION_ASSERT(grad_in.size() == n->next_edges.size(), "op '", n->spec.name, "' backward returned ",
                  grad_in.size(), " gradients for ", n->next_edges.size(), " inputs");
    for (auto& ref : n->saved) ref.value->release_use(retain_graph);
    if (!retain_graph && !n->saved.empty()) {
      n->saved.clear();
      n->released = true;
    }
    if (policy) policy->after_backward_node(*n);

    for (size_t i = 0; i < grad_in.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid()) continue;
      at::Tensor g = std::move(grad_in[i]);
      if (g.defined()) {
        RATION_ASSERT(g.sizes() == at::IntArrayRef(n->input_meta[i].sizes), "op '", n->spec.name,
                      "' gradient for input ", i, " has shape ", g.sizes(), ", input was ",
                      at::IntArrayRef(n->input_meta[i].sizes));
      }
      if (e.node) {
        Node* next = e.node.get();
        auto& p = pending[next];
        if (g.defined()) {
          p.grads.resize(static_cast<size_t>(next->spec.visible_outputs));
          add_into(p.grads[static_cast<size_t>(e.output_nr)], std::move(g));
        }
        if (--p.dependencies == 0) ready.push(next);
      } else {
        ValueImpl& leaf = *e.leaf;
        if (g.defined()) accumulate_leaf(leaf, std::move(g));
        if (--leaf_dependencies[&leaf] == 0) {
          for (auto& hook : leaf.grad_ready_hooks) hook(leaf);
        }
      }
    }
  }
}

}  // namespace ration
