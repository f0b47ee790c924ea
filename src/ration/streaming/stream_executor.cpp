// stream_executor.cpp — see stream_executor.h.
#include "ration/streaming/stream_executor.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/models/families.h"
#include "ration/ops/ops.h"

namespace ration::seq {

namespace {
Streamable& streamable_of(models::Model& model) {
  auto* s = dynamic_cast<Streamable*>(&model);
  RATION_CHECK(s != nullptr, "model.type '", model.family(), "' does not run over sequences; streaming needs ",
               "lstm_lm, tcn_lm or gpt with model.attention_window");
  return *s;
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

StreamExecutor::StreamExecutor(models::Model& model, int64_t chunk, int64_t batch, int64_t seq_len)
    : model_(model), streamable_(streamable_of(model)), chunk_(chunk) {
  RATION_CHECK(chunk >= 1, "chunk size must be >= 1 (--chunk C); got ", chunk);
  RATION_CHECK(seq_len >= 0, "sequence length must be >= 0 (0: not known); got ", seq_len);
  layers_ = streamable_.sequence_layers();
  if (seq_len == 0) require_streamable(layers_, model.family());
  trace_temporal_types(model);
  buffers_ = std::make_unique<StreamBuffers>(layers_, batch, model.parameter_options(), seq_len);
}

std::vector<DerivedLayer> trace_temporal_types(models::Model& model, int64_t probe_steps) {
  RATION_CHECK(probe_steps >= 1, "a temporal trace needs at least one step; got ", probe_steps);
  Streamable& streamable = streamable_of(model);
  const std::vector<LayerDependency> layers = streamable.sequence_layers();
  NoGradGuard no_grad;
  // In eval mode: a probe must not draw from the dropout stream a training run reads.
  const bool training = model.is_training();
  model.eval();
  // Every carried buffer holds the whole probe, so a declaration the operators disagree with cannot stop the
  // probe before the check names it.
  std::vector<LayerDependency> roomy = layers;
  for (LayerDependency& d : roomy) d.type = Dependency::WholeSequence;
  StreamBuffers buffers(roomy, 1, model.parameter_options(), probe_steps);
  OpTrace trace;
  const at::Tensor tokens = at::zeros({1, probe_steps}, model.parameter_options().dtype(at::kLong));
  try {
    streamable.stream_logits(Value(tokens), buffers);
    buffers.position += probe_steps;
    streamable.finish_logits(buffers, probe_steps, [](const at::Tensor&) {});
  } catch (...) {
    model.train(training);
    throw;
  }
  model.train(training);
  std::vector<DerivedLayer> derived = derive_types(trace.ops());
  check_declarations(layers, derived, model.family());
  return derived;
}

void StreamExecutor::finish(const std::function<void(const at::Tensor&)>& emit) {
  NoGradGuard no_grad;
  streamable_.finish_logits(*buffers_, chunk_, emit);
}

at::Tensor StreamExecutor::finish() {
  std::vector<at::Tensor> out;
  finish([&](const at::Tensor& logits) { out.push_back(logits); });
  return out.empty() ? at::Tensor() : at::cat(out, 1);
}

int64_t StreamExecutor::vocab_size() const {
  const auto* lm = dynamic_cast<const models::LanguageModel*>(&model_);
  return lm != nullptr ? lm->vocab_size() : 256;
}

// A byte the model has no token for is named, with where it is, instead of failing inside an embedding.
static void check_byte(int64_t byte, int64_t vocab, const std::string& what, int64_t offset) {
  RATION_CHECK(byte < vocab, what, ": byte ", byte, " at offset ", offset, " is outside the model's vocabulary "
               "(model.vocab_size = ", vocab, ": it knows bytes 0..", vocab - 1, "); give text whose bytes are all below ",
               vocab, ", or a model trained with a larger model.vocab_size");
}

Value StreamExecutor::feed_chunk(const Value& tokens) {
  RATION_CHECK(tokens.dim() == 2 && tokens.size(0) == buffers_->batch() && tokens.size(1) >= 1 &&
                   tokens.size(1) <= chunk_,
               "stream chunk must be tokens (B=", buffers_->batch(), ", 1..", chunk_, "); got ", tokens.sizes());
  Value logits = streamable_.stream_logits(tokens, *buffers_);
  buffers_->position += tokens.size(1);
  return logits;
}

at::Tensor StreamExecutor::feed(const at::Tensor& tokens) {
  RATION_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong, "stream input must be int64 tokens (B, n); got ",
               tokens.scalar_type(), " ", tokens.sizes());
  std::vector<at::Tensor> out;
  for (int64_t s = 0; s < tokens.size(1); s += chunk_) {
    const int64_t n = std::min(chunk_, tokens.size(1) - s);
    const Value logits = feed_chunk(Value(tokens.narrow(1, s, n).contiguous()));
    if (logits.defined()) out.push_back(logits.tensor());
  }
  return out.empty() ? at::Tensor() : at::cat(out, 1);
}

StreamScore score_bytes(StreamExecutor& executor, std::istream& in, const std::string& what) {
  NoGradGuard no_grad;
  RATION_CHECK(executor.buffers().batch() == 1, "score_bytes streams one sequence (batch 1)");
  memory::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  StreamScore score;
  const int64_t C = executor.chunk();
  std::vector<char> block(static_cast<size_t>(C));
  char first = 0;
  RATION_CHECK(in.get(first), what, ": empty input; bits per byte needs at least 2 bytes");
  const int64_t vocab = executor.vocab_size();
  int64_t prev = static_cast<unsigned char>(first);
  check_byte(prev, vocab, what, 0);
  double nats = 0;
  while (in) {
    in.read(block.data(), C);
    const int64_t m = in.gcount();
    if (m == 0) break;
    at::Tensor seq = at::empty({m + 1}, at::kLong);  // [prev, block...]
    auto* p = seq.data_ptr<int64_t>();
    p[0] = prev;
    for (int64_t i = 0; i < m; ++i) {
      p[i + 1] = static_cast<unsigned char>(block[static_cast<size_t>(i)]);
      check_byte(p[i + 1], vocab, what, score.tokens + 1 + i);
    }
    const at::Tensor inputs = seq.narrow(0, 0, m).reshape({1, m});
    const at::Tensor targets = seq.narrow(0, 1, m);
    const at::Tensor logits = executor.feed_chunk(Value(inputs)).tensor().reshape({m, -1});  // (m, V)
    nats += at::cross_entropy_loss(logits.to(at::kDouble), targets, {}, at::Reduction::Sum).item<double>();
    score.tokens += m;
    prev = p[m];
  }
  RATION_CHECK(score.tokens > 0, what, ": one byte only; bits per byte needs at least 2 bytes");
  score.bits_per_byte = nats / std::log(2.0) / static_cast<double>(score.tokens);
  score.seconds = seconds_since(t0);
  score.memory.peak_bytes = memory::device_peak_bytes(memory::stats());
  score.memory.buffers_bytes = executor.buffers().bytes();
  return score;
}

Generated generate(StreamExecutor& executor, const std::string& prompt, int64_t n_tokens, double temperature,
                   uint64_t seed, const std::function<bool(char)>& on_token) {
  NoGradGuard no_grad;
  RATION_CHECK(!prompt.empty(), "--prompt must not be empty (generation continues a text)");
  RATION_CHECK(n_tokens >= 0, "--tokens must be >= 0; got ", n_tokens);
  RATION_CHECK(temperature >= 0, "--temperature must be >= 0 (0 = argmax); got ", temperature);
  memory::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor ids = at::empty({1, static_cast<int64_t>(prompt.size())}, at::kLong);
  const int64_t vocab = executor.vocab_size();
  for (size_t i = 0; i < prompt.size(); ++i) {
    const int64_t byte = static_cast<unsigned char>(prompt[i]);
    check_byte(byte, vocab, "--prompt", static_cast<int64_t>(i));
    ids[0][static_cast<int64_t>(i)] = byte;
  }
  at::Tensor last;
  // The prompt in chunks; only the last step's logits are kept.
  for (int64_t s = 0; s < ids.size(1); s += executor.chunk()) {
    const int64_t n = std::min(executor.chunk(), ids.size(1) - s);
    last = executor.feed_chunk(Value(ids.narrow(1, s, n).contiguous())).tensor().select(1, n - 1);  // (1, V)
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Generated out;
  for (int64_t i = 0; i < n_tokens; ++i) {
    at::Tensor next;
    if (temperature == 0) next = last.argmax(-1);  // (1)
    else next = at::multinomial(at::softmax(last.to(at::kDouble).div(temperature), -1), 1, false, gen).reshape({1});
    const int64_t token = next.item<int64_t>();
    out.text.push_back(static_cast<char>(token));
    ++out.tokens;
    if (on_token && !on_token(static_cast<char>(token))) break;
    if (i + 1 < n_tokens) last = executor.feed_chunk(Value(next.reshape({1, 1}).to(at::kLong))).tensor().select(1, 0);
  }
  out.seconds = seconds_since(t0);
  out.memory.peak_bytes = memory::device_peak_bytes(memory::stats());
  out.memory.buffers_bytes = executor.buffers().bytes();
  return out;
}

Value chunk_loss(StreamExecutor& executor, const at::Tensor& inputs, const at::Tensor& targets, int64_t start,
                 int64_t n) {
  const int64_t T = inputs.size(1);
  Value logits = executor.feed_chunk(Value(inputs.narrow(1, start, n).contiguous()));  // (B, n, V)
  Value flat = ops::reshape(logits, {-1, logits.size(-1)});                             // (B n, V)
  Value loss = ops::cross_entropy(flat, Value(targets.narrow(1, start, n).reshape({-1})));
  if (n == T) return loss;
  // Chunk mean -> share of the whole sequence's mean.
  return ops::mul_scalar(loss, static_cast<double>(n) / static_cast<double>(T));
}

double truncated_bptt(StreamExecutor& executor, const at::Tensor& inputs, const at::Tensor& targets) {
  RATION_CHECK(inputs.dim() == 2 && inputs.scalar_type() == at::kLong && targets.sizes() == inputs.sizes() &&
                   targets.scalar_type() == at::kLong,
               "truncated_bptt expects int64 inputs and targets (B, T) of one shape; got ", inputs.sizes(), " and ",
               targets.sizes());
  const int64_t T = inputs.size(1), C = executor.chunk();
  double loss_sum = 0;
  for (int64_t s = 0; s < T; s += C) {
    Value loss = chunk_loss(executor, inputs, targets, s, std::min(C, T - s));
    loss_sum += loss.item();
    loss.backward();
  }
  return loss_sum;
}

}  // namespace ration::seq
