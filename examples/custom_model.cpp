// custom_model.cpp — writing your own model with ration's modules and training it.
// A user-defined sequence classifier: Embedding + learned positions -> one TransformerBlock -> LayerNorm
// -> mean over time -> Linear. Task (synthetic, generated here): does a sequence of bits hold more ones
// than zeros? Trains with optim::SGD and prints the loss; the loss falling shows the whole path works
// (modules, ops, ration's autograd, optimiser). Run: ./build/custom_model [steps]
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "ration/core/node.h"
#include "ration/nn/layers.h"
#include "ration/ops/ops.h"
#include "ration/optim/sgd.h"

namespace {

using ration::Value;
namespace nn = ration::nn;
namespace ops = ration::ops;

constexpr int64_t kVocab = 2, kSeq = 9, kEmbd = 16, kHeads = 2, kClasses = 2;

// Your model: subclass nn::Module, register children in the constructor, open your scope in forward.
class BitCounter : public nn::Module {
 public:
  BitCounter() {
    tok = register_module("tok", std::make_shared<nn::Embedding>(kVocab, kEmbd));
    pos = register_module("pos", std::make_shared<nn::Embedding>(kSeq, kEmbd));
    block = register_module("block", std::make_shared<nn::TransformerBlock>(kEmbd, kHeads, /*dropout=*/0.1));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(kEmbd));
    head = register_module("head", std::make_shared<nn::Linear>(kEmbd, kClasses));
  }

  // bits (B, T) int64 -> logits (B, 2)
  Value forward(const Value& bits) {
    ration::ScopeGuard scope(name());
    Value positions(at::arange(bits.size(1), at::kLong));  // (T)
    Value x = tok->forward(bits) + pos->forward(positions);  // (B, T, C)
    x = ln->forward(block->forward(x));                      // (B, T, C)
    return head->forward(ops::mean(x, {1}));                 // (B, C) -> (B, 2)
  }

  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::TransformerBlock> block;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> head;
};

// A batch of random bit strings and their labels (1 when ones outnumber zeros; kSeq is odd, no ties).
std::pair<Value, Value> make_batch(int64_t batch) {
  at::Tensor bits = at::randint(0, 2, {batch, kSeq}, at::kLong);  // (B, T)
  at::Tensor label = (bits.sum(1) * 2 > kSeq).to(at::kLong);      // (B)
  return {Value(bits), Value(label)};
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  at::manual_seed(0);
  ration::manual_seed(0);
  BitCounter model;
  std::printf("BitCounter: %lld parameters\n", static_cast<long long>(model.num_parameters()));
  for (const auto& [name, p] : model.named_parameters()) {
    std::printf("  %-28s %s\n", name.c_str(), c10::str(p.sizes()).c_str());
  }

  ration::optim::SGD sgd(model.named_parameters(), {/*lr=*/0.1, /*momentum=*/0.9});
  model.train();
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    auto [bits, label] = make_batch(64);
    Value loss = ops::cross_entropy(model.forward(bits), label);
    sgd.zero_grad();
    loss.backward();
    sgd.step();
    if (step == 0) first = loss.item();
    last = loss.item();
    if (step % 20 == 0 || step + 1 == steps) std::printf("step %4d  loss %.4f\n", step, loss.item());
  }

  // Held-out accuracy, in eval mode (dropout off) and without recording a graph.
  model.eval();
  ration::NoGradGuard no_grad;
  auto [bits, label] = make_batch(1000);
  const double accuracy =
      model.forward(bits).tensor().argmax(1).eq(label.tensor()).to(at::kDouble).mean().item<double>();
  std::printf("loss %.4f -> %.4f, held-out accuracy %.3f\n", first, last, accuracy);
  return last < first ? 0 : 1;
}
