// test_lifetime.cpp — the graph frees itself when the last handle to it goes, whatever happened to it.
// Owns: lifetime checks of nodes and saved activations for every way a step can end without a
//       releasing backward: forward only (evaluation with grad on), an exception between forward and
//       backward, a final backward with retain_graph=true, values offloaded and never fetched; the same
//       for whole models (gpt, cnn); and
//       the other side of the design: a dropped value can still be rebuilt while its graph is alive.
// Does not own: release during backward (test_engine.cpp) or offload/budget behaviour (test_offload,
//       test_budget).
//
// Each check records weak_ptrs to every node reachable from the graph's roots, drops the Values, and
// asserts every node expired and the counting allocator is back at the bytes it held before the graph.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "op_check.h"
#include "ration/config/config.h"
#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/base/allocator.h"
#include "ration/offload/engine.h"
#include "ration/core/saved_value.h"
#include "ration/models/model.h"
#include "ration/ops/ops.h"
#include "ration/runtime/step_runtime.h"

namespace ration::testing {
namespace {

// Every node reachable from `roots` through gradient edges.
std::vector<std::weak_ptr<Node>> nodes_of(const Values& roots) {
  std::vector<std::weak_ptr<Node>> out;
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  for (const auto& r : roots)
    if (r.grad_fn()) stack.push_back(r.grad_fn());
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    out.push_back(n);
    for (const Edge& e : n->next_edges)
      if (e.node) stack.push_back(e.node);
  }
  return out;
}

int live(const std::vector<std::weak_ptr<Node>>& nodes) {
  int n = 0;
  for (const auto& w : nodes) n += w.expired() ? 0 : 1;
  return n;
}

// A small network whose nodes save inputs, their own outputs (tanh, relu, sigmoid) and internal
// outputs (dropout's mask, layer_norm's statistics): every ownership shape the graph has.
struct Net {
  Value w1, b1, w2, b2, ln_w, ln_b;
  Net()
      : w1(parameter(at::randn({32, 16}) * 0.2, "w1")),
        b1(parameter(at::zeros({32}), "b1")),
        w2(parameter(at::randn({8, 32}) * 0.2, "w2")),
        b2(parameter(at::zeros({8}), "b2")),
        ln_w(parameter(at::ones({32}), "ln.weight")),
        ln_b(parameter(at::zeros({32}), "ln.bias")) {}
  std::vector<Value> params() const { return {w1, b1, w2, b2, ln_w, ln_b}; }
  Value hidden(const Value& x) const {
    Value h = ops::tanh(ops::linear(x, w1, b1));
    h = ops::layer_norm(h, {32}, ln_w, ln_b);
    return ops::dropout(ops::relu(h), 0.25, /*training=*/true);
  }
  Value loss(const Value& x) const { return ops::mean(ops::sigmoid(ops::linear(hidden(x), w2, b2))); }
  void clear_grads() const {
    for (auto p : params()) p.grad() = at::Tensor();
  }
};

Value make_input() { return Value(at::randn({64, 16})); }

TEST(Lifetime, ForwardWithoutBackwardFreesNodesAndActivations) {
  Net net;
  Value x = make_input();
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  {
    Value loss = net.loss(x);
    nodes = nodes_of({loss});
    ASSERT_GE(nodes.size(), 8u);
    EXPECT_GT(memory::current_bytes(), baseline + 64 * 32 * 4) << "the forward saved activations";
  }
  EXPECT_EQ(live(nodes), 0) << "nodes outlive the last Value of their graph";
  EXPECT_EQ(memory::current_bytes(), baseline) << "saved activations outlive their graph";
}

TEST(Lifetime, ExceptionBetweenForwardAndBackwardFreesEverything) {
  Net net;
  Value x = make_input();
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  // The forward records its graph, then the step fails before backward (here: a shape error in the
  // next op, thrown by ATen inside apply_op); unwinding drops every Value the forward made.
  const auto failing_step = [&] {
    Value h = net.hidden(x);
    Value loss = ops::mean(ops::sigmoid(ops::linear(h, net.w2, net.b2)));
    nodes = nodes_of({loss, h});
    Value bad = ops::linear(h, net.w2, net.b2);  // (64, 8)
    (void)ops::matmul(bad, net.w1);              // (64, 8) x (32, 16): throws
    loss.backward();
  };
  EXPECT_ANY_THROW(failing_step());
  ASSERT_GE(nodes.size(), 8u);
  EXPECT_EQ(live(nodes), 0);
  EXPECT_EQ(memory::current_bytes(), baseline);
  // A ration::Error thrown by the step's own code between forward and backward, too.
  const auto user_error = [&] {
    Value loss = net.loss(x);
    nodes = nodes_of({loss});
    RATION_CHECK(loss.item() < -1.0, "loss out of range (as a step's own check would throw)");
    loss.backward();
  };
  EXPECT_THROW(user_error(), Error);
  EXPECT_EQ(live(nodes), 0);
  EXPECT_EQ(memory::current_bytes(), baseline);
}

TEST(Lifetime, RetainGraphBackwardThenDropFreesEverything) {
  Net net;
  Value x = make_input();
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  {
    Value loss = net.loss(x);
    nodes = nodes_of({loss});
    loss.backward({}, /*retain_graph=*/true);
    EXPECT_EQ(live(nodes), static_cast<int>(nodes.size())) << "retain_graph keeps the graph while it is held";
  }
  EXPECT_EQ(live(nodes), 0);
  net.clear_grads();
  EXPECT_EQ(memory::current_bytes(), baseline);
}

TEST(Lifetime, ReleasingBackwardFreesEverything) {
  Net net;
  Value x = make_input();
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  {
    Value loss = net.loss(x);
    nodes = nodes_of({loss});
    loss.backward();
  }
  EXPECT_EQ(live(nodes), 0);
  net.clear_grads();
  EXPECT_EQ(memory::current_bytes(), baseline);
}

// Offloaded values: the engine holds no graph; once the graph and the scope are gone, so is every byte.
TEST(Lifetime, OffloadedGraphWithoutBackwardFreesEverything) {
  Net net;
  Value x = make_input();
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  {
    memory::OffloadOptions options;
    options.tier = "host";
    options.min_bytes = 1024;
    OffloadScope offload(options);
    Value loss = net.loss(x);
    nodes = nodes_of({loss});
    EXPECT_GT(offload.stats().offloaded_values, 0);
  }
  EXPECT_EQ(live(nodes), 0);
  EXPECT_EQ(memory::current_bytes(), baseline);
}

// The other half of the design: while the graph is alive, every dropped value can be rebuilt, even
// when the model code dropped the Values that produced it and the node saving it saved its own output.
TEST(Lifetime, DroppedValuesAreRebuiltWhileTheGraphLives) {
  Net net;
  Value x = make_input();
  manual_seed(7);
  Value plain_loss = net.loss(x);
  plain_loss.backward();
  std::vector<at::Tensor> plain;
  for (auto& p : net.params()) plain.push_back(p.grad().clone());
  net.clear_grads();

  DropAllPolicy drop;
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  {
    PolicyScope scope(&drop);
    manual_seed(7);
    Value loss = net.loss(x);  // every intermediate Value is gone; only `loss` holds the graph
    nodes = nodes_of({loss});
    EXPECT_EQ(live(nodes), static_cast<int>(nodes.size()));
    loss.backward();
  }
  EXPECT_GT(drop.recomputes, 4);
  const auto params = net.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(at::equal(params[i].grad(), plain[i])) << params[i].name();
  EXPECT_EQ(live(nodes), 0);
  net.clear_grads();
  EXPECT_EQ(memory::current_bytes(), baseline);
}

// Whole models: loss computed with grad on, no backward, model and graph dropped.
void expect_model_freed(const std::string& toml, const std::function<data::Batch()>& make_batch) {
  const int64_t baseline = memory::current_bytes();
  std::vector<std::weak_ptr<Node>> nodes;
  {
    Config cfg = Config::from_string(toml, "test_lifetime");
    auto model = models::build_model(cfg);
    model->train();
    data::Batch batch = make_batch();
    Value loss = model->loss(batch);
    nodes = nodes_of({loss});
    ASSERT_GE(nodes.size(), 10u);
  }
  EXPECT_EQ(live(nodes), 0) << toml;
  EXPECT_EQ(memory::current_bytes(), baseline) << toml;
}

TEST(Lifetime, GptLossWithoutBackwardFreesModelAndGraph) {
  expect_model_freed(
      "[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\n"
      "dropout = 0.1\n",
      [] {
        data::Batch b;
        b.input = Value(at::randint(0, 11, {4, 8}, at::kLong));
        b.target = Value(at::randint(0, 11, {4, 8}, at::kLong));
        b.items = 32;
        return b;
      });
}

TEST(Lifetime, CnnLossWithoutBackwardFreesModelAndGraph) {
  expect_model_freed("[model]\ntype = \"cnn\"\nchannels = [4, 8]\nfc_hidden = 16\ndropout = 0.25\n", [] {
    data::Batch b;
    b.input = Value(at::randn({4, 1, 28, 28}));
    b.target = Value(at::randint(0, 10, {4}, at::kLong));
    b.items = 4;
    return b;
  });
}

}  // namespace
}  // namespace ration::testing
