// test_seq_stream.cpp — the dependency analysis and the streaming executor (docs/METHODS.md,
// "Temporal-dependency buffers for sequence models"):
//   * the sequence plan lists every layer with type, L, buffer steps (1, L + 1, T) and bytes;
//   * streamed logits equal the full-sequence forward within 1e-6 (lstm_lm: type 1; tcn_lm and windowed
//     gpt: type 2), for chunks 1, 7 and 64 and lengths that are not multiples of them. Not bitwise: the
//     output projection of a chunk multiplies fewer rows than the whole sequence's, and OpenBLAS's
//     kernels (its small-matrix path on AVX-512 machines) may sum a row's products in another order for
//     another row count (seen: 3e-8 on an AVX-512 EPYC, bitwise elsewhere);
//   * the ring buffers wrap correctly; the measured peak of scoring a stream is flat in its length;
//   * errors: a type-3 layer (named), chunk 0, a window not below block_size, a model that does not stream.
#include <nlohmann/json.hpp>

#include <sstream>

#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/models/gpt.h"
#include "ration/models/model.h"
#include "ration/models/tcn_lm.h"
#include "ration/streaming/stream_executor.h"
#include "seq_fixture.h"
#include "test_util.h"

namespace ration::testing {
namespace {

std::unique_ptr<models::Model> build(const std::string& toml) { return build_eval_model(toml, "test_seq_stream"); }

const char* const kLstm = kSeqLstm;
const char* const kTcn = kSeqTcn;
const char* kGptWindow =
    "[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 2\nn_head = 2\nn_embd = 8\nblock_size = 32\n"
    "attention_window = 5\ndropout = 0.0\n";

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Streams `tokens` in chunks of C and compares with one full forward.
void expect_stream_equals_full(models::Model& model, const at::Tensor& tokens, double tol) {
  at::Tensor full;
  {
    NoGradGuard no_grad;
    full = dynamic_cast<models::LanguageModel&>(model).logits(Value(tokens)).tensor();  // (B, T, V)
  }
  for (int64_t C : {1, 7, 64}) {
    SCOPED_TRACE("chunk " + std::to_string(C));
    NoGradGuard no_grad;
    seq::StreamExecutor ex(model, C, tokens.size(0));
    const at::Tensor streamed = ex.feed(tokens);
    ASSERT_EQ(streamed.sizes(), full.sizes());
    if (tol == 0) EXPECT_TRUE(at::equal(streamed, full)) << "max abs diff " << max_abs(streamed, full);
    else EXPECT_LE(max_abs(streamed, full), tol);
    EXPECT_EQ(ex.position(), tokens.size(1));
  }
}

TEST(SeqStream, LstmLmStreamsWithin1e6) {
  at::manual_seed(1);
  auto model = build(kLstm);
  expect_stream_equals_full(*model, at::randint(0, 11, {2, 150}, at::kLong), 1e-6);
}

TEST(SeqStream, TcnLmStreamsWithin1e6) {
  at::manual_seed(2);
  auto model = build(kTcn);
  EXPECT_EQ(dynamic_cast<models::TCNLM&>(*model).receptive_field(), 1 + 2 + 4 + 8);
  expect_stream_equals_full(*model, at::randint(0, 11, {2, 150}, at::kLong), 1e-6);
}

TEST(SeqStream, WindowedGptStreamsWithin1e6BeyondBlockSize) {
  at::manual_seed(3);
  auto model = build(kGptWindow);
  // 150 steps > block_size 32: positions repeat with period 32, the window is 5.
  expect_stream_equals_full(*model, at::randint(0, 11, {2, 150}, at::kLong), 1e-6);
}

TEST(SeqStream, WindowZeroGptIsUnchanged) {
  // window 0 keeps full causal attention: logits of a prefix do not depend on later tokens, and every
  // earlier token matters (a change at step 0 reaches step 20, beyond any window).
  at::manual_seed(4);
  auto model = build("[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 32\n");
  NoGradGuard no_grad;
  at::Tensor t = at::randint(0, 11, {1, 24}, at::kLong);
  auto& lm = dynamic_cast<models::LanguageModel&>(*model);
  const at::Tensor a = lm.logits(Value(t)).tensor();
  at::Tensor t2 = t.clone();
  t2[0][0] = (t[0][0].item<int64_t>() + 1) % 11;
  EXPECT_FALSE(at::equal(lm.logits(Value(t2)).tensor().select(1, 20), a.select(1, 20)));
  // With a window of 5 the same change cannot reach step 20.
  auto windowed = build(kGptWindow);
  auto& wlm = dynamic_cast<models::LanguageModel&>(*windowed);
  at::Tensor u = at::randint(0, 11, {1, 24}, at::kLong), u2 = u.clone();
  u2[0][0] = (u[0][0].item<int64_t>() + 1) % 11;
  // 2 layers x window 5: step 0 reaches up to step 10 only.
  EXPECT_TRUE(at::equal(wlm.logits(Value(u2)).tensor().select(1, 20), wlm.logits(Value(u)).tensor().select(1, 20)));
}

TEST(SeqStream, PlanListsTypesBuffersAndTotals) {
  auto tcn = build(kTcn);
  auto layers = dynamic_cast<seq::Streamable&>(*tcn).sequence_layers();
  const seq::SequencePlan plan = seq::plan_sequence(layers, 1000, 1, 4);
  int convs = 0;
  for (const auto& r : plan.rows) {
    if (r.layer.layer.find(".conv") == std::string::npos) {
      EXPECT_EQ(r.layer.type, seq::Dependency::PerStep);
      EXPECT_EQ(r.buffer_steps, 1);
      continue;
    }
    const int64_t L = 2 << convs;  // (k - 1) * 2^i = 2, 4, 8
    EXPECT_EQ(r.layer.layer, "blocks." + std::to_string(convs) + ".conv");
    EXPECT_EQ(r.layer.type, seq::Dependency::Window);
    EXPECT_EQ(r.layer.window, L);
    EXPECT_EQ(r.buffer_steps, L + 1);
    EXPECT_EQ(r.buffer_bytes, (L + 1) * 8 * 4);
    EXPECT_EQ(r.full_seq_bytes, 1000 * 8 * 4);
    ++convs;
  }
  EXPECT_EQ(convs, 3);
  EXPECT_LT(plan.streamed_bytes, plan.full_seq_bytes);
  EXPECT_TRUE(plan.whole_sequence_layer().empty());
  EXPECT_NE(plan.to_table().find("streamable: yes"), std::string::npos);
  EXPECT_EQ(plan.to_json()["layers"].size(), plan.rows.size());

  auto gpt = build("[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 2\nn_head = 2\nn_embd = 8\nblock_size = 32\n");
  const seq::SequencePlan full = seq::plan_sequence(dynamic_cast<seq::Streamable&>(*gpt).sequence_layers(), 777, 2, 4);
  EXPECT_EQ(full.whole_sequence_layer(), "blocks.0.attn");
  for (const auto& r : full.rows)
    if (r.layer.type == seq::Dependency::WholeSequence) EXPECT_EQ(r.buffer_steps, 777);
}

TEST(SeqStream, RingBufferKeepsTheLastSteps) {
  seq::RingBuffer ring("layer", 1, 4, 2, at::TensorOptions().dtype(at::kFloat));
  auto steps = [](int64_t from, int64_t n) {
    return at::arange(from, from + n, at::kFloat).reshape({1, n, 1}).repeat({1, 1, 2});
  };
  EXPECT_EQ(ring.last(3).size(1), 0);
  ring.push(steps(0, 3));  // 0 1 2
  EXPECT_TRUE(at::equal(ring.last(5), steps(0, 3)));
  ring.push(steps(3, 2));  // 0 1 2 3 4 -> keeps 1 2 3 4 (wraps)
  EXPECT_TRUE(at::equal(ring.last(4), steps(1, 4)));
  EXPECT_TRUE(at::equal(ring.last(2), steps(3, 2)));
  ring.push(steps(5, 9));  // longer than the capacity
  EXPECT_TRUE(at::equal(ring.last(4), steps(10, 4)));
  EXPECT_EQ(ring.bytes(), 4 * 2 * 4);
}

TEST(SeqStream, ScoringMemoryIsFlatInLength) {
  memory::install_counting_allocator();
  at::manual_seed(5);
  for (const char* toml : {kLstm, kTcn, kGptWindow}) {
    auto model = build(std::string(toml) + "\n");
    SCOPED_TRACE(model->family());
    int64_t peaks[2];
    double bpb[2];
    const int64_t lengths[2] = {2000, 16000};
    for (int i = 0; i < 2; ++i) {
      std::string text;
      for (int64_t t = 0; t < lengths[i]; ++t) text.push_back(static_cast<char>(t % 11));
      std::istringstream in(text);
      seq::StreamExecutor ex(*model, 64);
      const seq::StreamScore s = seq::score_bytes(ex, in, "test text");
      EXPECT_EQ(s.tokens, lengths[i] - 1);
      peaks[i] = s.memory.peak_bytes;
      bpb[i] = s.bits_per_byte;
      EXPECT_GT(s.memory.buffers_bytes, 0);
    }
    EXPECT_GT(bpb[0], 0.0);
    // 8x longer, same peak (within 4 KiB of allocator noise).
    EXPECT_LE(std::abs(peaks[1] - peaks[0]), 4096) << peaks[0] << " vs " << peaks[1];
  }
}

TEST(SeqStream, GenerationMemoryIsFlatInTokens) {
  memory::install_counting_allocator();
  at::manual_seed(6);
  auto model = build("[model]\ntype = \"tcn_lm\"\nvocab_size = 256\nn_embd = 8\nn_layer = 3\n");
  int64_t peaks[2];
  std::string texts[2];
  for (int i = 0; i < 2; ++i) {
    seq::StreamExecutor ex(*model, 16);
    const seq::Generated g = seq::generate(ex, "hello, stream", i == 0 ? 40 : 320, 0.0, 1);
    EXPECT_EQ(g.tokens, i == 0 ? 40 : 320);
    EXPECT_EQ(static_cast<int64_t>(g.text.size()), g.tokens);
    peaks[i] = g.memory.peak_bytes;
    texts[i] = g.text;
  }
  EXPECT_EQ(texts[1].substr(0, 40), texts[0]);  // argmax sampling is deterministic
  EXPECT_LE(std::abs(peaks[1] - peaks[0]), 4096) << peaks[0] << " vs " << peaks[1];
}

// Gradients of every parameter, then zeroed.
std::vector<at::Tensor> take_grads(models::Model& m) {
  std::vector<at::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p.tensor()));
  m.zero_grad();
  return g;
}

TEST(SeqStream, TruncatedBpttOneChunkIsFullBpttAndShorterChunksTruncate) {
  at::manual_seed(7);
  auto model = build(kLstm);
  model->train();
  data::Batch batch;
  batch.input = Value(at::randint(0, 11, {2, 40}, at::kLong));
  batch.target = Value(at::randint(0, 11, {2, 40}, at::kLong));
  batch.items = 2;
  model->zero_grad();
  Value full_loss = model->loss(batch);
  full_loss.backward();
  const auto full = take_grads(*model);
  {
    seq::StreamExecutor ex(*model, 40, 2);
    const double loss = seq::truncated_bptt(ex, batch.input.tensor(), batch.target.tensor());
    EXPECT_EQ(loss, full_loss.item());
    const auto one_chunk = take_grads(*model);
    for (size_t i = 0; i < full.size(); ++i) EXPECT_TRUE(at::equal(one_chunk[i], full[i])) << i;
  }
  {
    seq::StreamExecutor ex(*model, 7, 2);
    const double loss = seq::truncated_bptt(ex, batch.input.tensor(), batch.target.tensor());
    EXPECT_NEAR(loss, full_loss.item(), 1e-6);  // the forward is the same sequence
    const auto truncated = take_grads(*model);
    double diff = 0;
    for (size_t i = 0; i < full.size(); ++i) diff = std::max(diff, (truncated[i] - full[i]).abs().max().item<double>());
    EXPECT_GT(diff, 1e-6);  // gradients stopped at the chunk boundaries
    // The head's gradient does not cross time: it equals full BPTT's up to rounding.
    const auto params = model->named_parameters();
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].first.rfind("head.", 0) == 0) EXPECT_LE((truncated[i] - full[i]).abs().max().item<double>(), 1e-6);
  }
}

TEST(SeqStream, ErrorsNameTheProblem) {
  auto gpt = build("[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 2\nn_head = 2\nn_embd = 8\nblock_size = 32\n");
  expect_error_containing([&] { seq::StreamExecutor ex(*gpt, 8); },
                          {"blocks.0.attn", "whole sequence", "model.attention_window"});
  auto lstm = build(kLstm);
  expect_error_containing([&] { seq::StreamExecutor ex(*lstm, 0); }, "--chunk C");
  expect_error_containing([&] { build("[model]\ntype = \"gpt\"\nblock_size = 16\nattention_window = 16\n"); },
                          {"model.attention_window", "< model.block_size (16)"});
  auto mlp = build("[model]\ntype = \"mlp\"\nhidden = [4]\n");
  expect_error_containing([&] { seq::StreamExecutor ex(*mlp, 8); }, "model.type 'mlp' does not run over sequences");
}

}  // namespace
}  // namespace ration::testing

namespace ration::testing {
namespace {

// A byte the model has no token for (>= model.vocab_size) is named with its offset and the vocabulary,
// in scoring and in a prompt, instead of ATen's "index out of range in self".
TEST(SeqStream, BytesOutsideTheVocabularyAreNamed) {
  auto model = build(std::string(kLstm) + "\n");  // vocab_size = 11
  std::string text = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2};
  text[7] = 40;
  std::istringstream in(text);
  seq::StreamExecutor ex(*model, 4);
  EXPECT_EQ(ex.vocab_size(), 11);
  try {
    (void)seq::score_bytes(ex, in, "--input notes.txt");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--input notes.txt: byte 40 at offset 7 is outside the model's vocabulary "
                                         "(model.vocab_size = 11: it knows bytes 0..10)"),
              std::string::npos)
        << e.what();
  }
  seq::StreamExecutor gen(*model, 4);
  try {
    (void)seq::generate(gen, std::string("\x01\x02\x30", 3), 2, 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--prompt: byte 48 at offset 2 is outside"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ration::testing
