// test_seq_types.cpp — temporal types derived from the operators, and type-3 buffers (docs/METHODS.md,
// "Temporal-dependency buffers for sequence models"):
//   * every sequence model's declared types and L equal those derived from the operators its layers run
//     (seq::trace_temporal_types); a wrong declaration is an error naming the layer and the operator;
//   * a model with a whole-sequence layer (birnn_tagger: a bidirectional GRU over a causal-convolution front
//     end) runs chunk-wise with buffers of 1, L + 1 and T steps, and its logits equal the full-sequence
//     forward's; full-attention gpt streams with a kv buffer of T steps;
//   * the measured peak of the chunk-wise run grows with T by the type-3 buffer's bytes alone.
#include <gtest/gtest.h>

#include "ration/base/allocator.h"
#include "ration/base/check.h"
#include "ration/models/birnn_tagger.h"
#include "ration/models/model.h"
#include "ration/models/tcn_lm.h"
#include "ration/streaming/stream_executor.h"
#include "seq_fixture.h"
#include "test_util.h"

namespace ration::testing {
namespace {

std::unique_ptr<models::Model> build(const std::string& toml) { return build_eval_model(toml, "test_seq_types"); }

const char* const kLstm = kSeqLstm;
const char* const kTcn = kSeqTcn;
const char* kGptWindow =
    "[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 2\nn_head = 2\nn_embd = 8\nblock_size = 64\n"
    "attention_window = 5\ndropout = 0.0\n";
const char* kGptFull =
    "[model]\ntype = \"gpt\"\nvocab_size = 11\nn_layer = 2\nn_head = 2\nn_embd = 8\nblock_size = 64\ndropout = 0.0\n";
const char* kBirnn = "[model]\ntype = \"birnn_tagger\"\nvocab_size = 11\nn_embd = 6\nhidden_size = 5\nkernel_size = 4\n";

const seq::DerivedLayer* find(const std::vector<seq::DerivedLayer>& derived, const std::string& layer) {
  for (const auto& d : derived)
    if (d.layer == layer) return &d;
  return nullptr;
}

bool has_op(const seq::DerivedLayer& l, const std::string& op, seq::TimeAccess access) {
  for (const auto& o : l.ops)
    if (o.op == op && o.access == access) return true;
  return false;
}

TEST(SeqTypes, DerivedTypesEqualTheDeclaredOnEverySequenceModel) {
  at::manual_seed(3);
  for (const char* toml : {kLstm, kTcn, kGptWindow, kGptFull, kBirnn}) {
    auto model = build(toml);
    SCOPED_TRACE(toml);
    const auto declared = dynamic_cast<seq::Streamable&>(*model).sequence_layers();
    const std::vector<seq::DerivedLayer> derived = seq::trace_temporal_types(*model);
    ASSERT_EQ(derived.size(), declared.size());
    for (const auto& d : declared) {
      const seq::DerivedLayer* l = find(derived, d.layer);
      ASSERT_NE(l, nullptr) << d.layer;
      EXPECT_EQ(l->type, d.type) << d.layer;
      EXPECT_EQ(l->window, d.type == seq::Dependency::Window ? d.window : 0) << d.layer;
      EXPECT_FALSE(l->ops.empty()) << d.layer;
    }
  }
  // The operators that decide: a forward recurrence is type 1 with its state, a dilated convolution type 2
  // with L = (k - 1) d, full attention and a reverse recurrence type 3.
  auto lstm = build(kLstm);
  const auto lstm_types = seq::trace_temporal_types(*lstm);
  EXPECT_TRUE(has_op(*find(lstm_types, "lstm.l1"), "lstm_cell", seq::TimeAccess::CarriedState));
  auto tcn = build(kTcn);
  const auto tcn_types = seq::trace_temporal_types(*tcn);
  EXPECT_EQ(find(tcn_types, "blocks.2.conv")->window, 8);  // (3 - 1) * 4
  EXPECT_TRUE(has_op(*find(tcn_types, "blocks.2.conv"), "conv1d_causal", seq::TimeAccess::CausalWindow));
  auto full = build(kGptFull);
  const auto gpt_types = seq::trace_temporal_types(*full);
  EXPECT_EQ(find(gpt_types, "blocks.1.attn")->type, seq::Dependency::WholeSequence);
  EXPECT_TRUE(has_op(*find(gpt_types, "blocks.1.attn"), "causal_attention", seq::TimeAccess::WholeSequence));
  auto birnn = build(kBirnn);
  const auto bi_types = seq::trace_temporal_types(*birnn);
  const seq::DerivedLayer& bi = *find(bi_types, "birnn");
  EXPECT_EQ(bi.type, seq::Dependency::WholeSequence);
  EXPECT_TRUE(has_op(bi, "gru_cell (forward)", seq::TimeAccess::CarriedState));
  EXPECT_TRUE(has_op(bi, "gru_cell (reverse)", seq::TimeAccess::WholeSequence));
  EXPECT_EQ(find(bi_types, "front")->window, 3);
  const std::string table = seq::derived_table(bi_types);
  EXPECT_NE(table.find("gru_cell (reverse)"), std::string::npos) << table;
}

// A model whose declaration of one layer was edited: tcn_lm with blocks.1.conv declared type 1 or with the
// wrong L, birnn_tagger with its bidirectional layer declared type 1.
class MisdeclaredTcn : public models::TCNLM {
 public:
  MisdeclaredTcn(const models::TCNLMOptions& o, bool wrong_window) : TCNLM(o), wrong_window_(wrong_window) {}
  std::vector<seq::LayerDependency> sequence_layers() const override {
    std::vector<seq::LayerDependency> layers = TCNLM::sequence_layers();
    for (auto& d : layers) {
      if (d.layer != "blocks.1.conv") continue;
      if (wrong_window_) d.window += 1;
      else d.type = seq::Dependency::PerStep;
    }
    return layers;
  }

 private:
  bool wrong_window_;
};

class MisdeclaredTagger : public models::BiRNNTagger {
 public:
  using BiRNNTagger::BiRNNTagger;
  std::vector<seq::LayerDependency> sequence_layers() const override {
    std::vector<seq::LayerDependency> layers = BiRNNTagger::sequence_layers();
    for (auto& d : layers)
      if (d.layer == "birnn") d.type = seq::Dependency::PerStep;
    return layers;
  }
};

TEST(SeqTypes, AWrongDeclarationIsReportedWithLayerAndOperator) {
  models::TCNLMOptions o;
  o.vocab_size = 11;
  o.n_embd = 8;
  o.n_layer = 3;
  MisdeclaredTcn as_type1(o, false), wrong_l(o, true);
  expect_error_containing([&] { seq::trace_temporal_types(as_type1); },
                          {"model 'tcn_lm'", "layer 'blocks.1.conv' is declared type 1", "operator 'conv1d_causal'",
                           "causal window (L = 4)", "type 2"});
  expect_error_containing([&] { seq::trace_temporal_types(wrong_l); },
                          {"layer 'blocks.1.conv' is declared with L = 5", "operator 'conv1d_causal'", "L = 4"});
  // The executor refuses to stream a model whose declaration is wrong.
  expect_error_containing([&] { seq::StreamExecutor ex(as_type1, 8); }, "layer 'blocks.1.conv'");
  models::BiRNNTaggerOptions b;
  b.vocab_size = 11;
  b.n_embd = 6;
  b.hidden_size = 5;
  MisdeclaredTagger tagger(b);
  expect_error_containing([&] { seq::trace_temporal_types(tagger); },
                          {"layer 'birnn' is declared type 1", "operator 'gru_cell (reverse)'", "whole sequence"});
}

// Logits of the full-sequence forward (no grad).
at::Tensor full_logits(models::Model& model, const at::Tensor& tokens) {
  NoGradGuard no_grad;
  return dynamic_cast<models::LanguageModel&>(model).logits(Value(tokens)).tensor();
}

TEST(SeqTypes, TypeThreeLayersRunChunkwiseWithBuffersOfTAndEqualTheFullSequence) {
  at::manual_seed(7);
  auto model = build(kBirnn);
  const int64_t B = 2, T = 37, E = 6, H = 5, L = 3;
  const at::Tensor tokens = at::randint(0, 11, {B, T}, at::kLong);
  const at::Tensor full = full_logits(*model, tokens);  // (B, T, V)
  for (int64_t C : {1, 5, 64}) {
    SCOPED_TRACE("chunk " + std::to_string(C));
    NoGradGuard no_grad;
    seq::StreamExecutor ex(*model, C, B, T);
    EXPECT_FALSE(ex.feed(tokens).defined()) << "a tagger's outputs wait for the whole sequence";
    // Buffers: the front end's L + 1 inputs, the GRU's T steps of [input, reverse state]; embed and head none.
    EXPECT_EQ(ex.buffers().of("front").capacity(), L + 1);
    EXPECT_EQ(ex.buffers().of("birnn").capacity(), T);
    EXPECT_EQ(ex.buffers().bytes(), 4 * B * ((L + 1) * E + T * (E + H)));
    int64_t pieces = 0;
    std::vector<at::Tensor> out;
    ex.finish([&](const at::Tensor& logits) {
      EXPECT_LE(logits.size(1), C);
      out.push_back(logits.clone());
      ++pieces;
    });
    EXPECT_EQ(pieces, (T + C - 1) / C);
    const at::Tensor streamed = at::cat(out, 1);
    ASSERT_EQ(streamed.sizes(), full.sizes());
    EXPECT_LE((streamed - full).abs().max().item<double>(), 1e-6);
  }
  // Without T a type-3 layer cannot stream; a stream longer than T is refused.
  expect_error_containing([&] { seq::StreamExecutor ex(*model, 8); }, {"layer 'birnn'", "whole sequence"});
  seq::StreamExecutor short_one(*model, 8, B, T - 1);
  expect_error_containing([&] { short_one.feed(tokens); short_one.finish(); }, {"layer 'birnn'", "more than the 36 steps"});

  // Full-attention gpt: its keys and values in a buffer of T steps, logits chunk by chunk.
  auto gpt = build(kGptFull);
  const at::Tensor t2 = at::randint(0, 11, {1, 40}, at::kLong);
  const at::Tensor gpt_full = full_logits(*gpt, t2);
  NoGradGuard no_grad;
  seq::StreamExecutor ex(*gpt, 7, 1, 40);
  EXPECT_EQ(ex.buffers().of("blocks.0.attn").capacity(), 40);
  const at::Tensor streamed = ex.feed(t2);
  EXPECT_LE((streamed - gpt_full).abs().max().item<double>(), 1e-6);
  EXPECT_FALSE(ex.finish().defined());
}

// The measured peak of a chunk-wise run (C = 64, no grad, each chunk's logits reduced as they come) grows
// from T to 4T and 16T by the type-3 buffer's bytes, within 2% of them; the full-sequence forward's grows
// by several times more.
TEST(SeqTypes, ChunkwisePeakGrowsWithTOnlyByTheTypeThreeBuffer) {
  memory::install_counting_allocator();
  at::manual_seed(9);
  auto model = build("[model]\ntype = \"birnn_tagger\"\nvocab_size = 256\nn_embd = 32\nhidden_size = 32\n");
  const int64_t lengths[3] = {512, 2048, 8192};
  int64_t streamed_peak[3], buffer_bytes[3], full_peak[3];
  for (int i = 0; i < 3; ++i) {
    const at::Tensor tokens = at::randint(0, 256, {1, lengths[i]}, at::kLong);
    NoGradGuard no_grad;
    {
      seq::StreamExecutor ex(*model, 64, 1, lengths[i]);
      const int64_t before = memory::current_bytes();
      memory::reset_peak();
      for (int64_t s = 0; s < lengths[i]; s += 64) ex.feed_chunk(Value(tokens.narrow(1, s, 64).contiguous()));
      double sum = 0;
      ex.finish([&](const at::Tensor& logits) { sum += logits.sum().item<double>(); });
      EXPECT_TRUE(std::isfinite(sum));
      streamed_peak[i] = memory::device_peak_bytes(memory::stats()) - before + ex.buffers().bytes();
      buffer_bytes[i] = ex.buffers().bytes();
    }
    const int64_t before = memory::current_bytes();
    memory::reset_peak();
    full_logits(*model, tokens);
    full_peak[i] = memory::device_peak_bytes(memory::stats()) - before;
  }
  for (int i = 1; i < 3; ++i) {
    const int64_t grew = streamed_peak[i] - streamed_peak[0], buffers_grew = buffer_bytes[i] - buffer_bytes[0];
    EXPECT_EQ(buffers_grew, 4 * (lengths[i] - lengths[0]) * (32 + 32));
    EXPECT_NEAR(static_cast<double>(grew), static_cast<double>(buffers_grew), 0.02 * static_cast<double>(buffers_grew))
        << "T " << lengths[i] << ": peak " << streamed_peak[i] << " vs " << streamed_peak[0];
    EXPECT_GT(full_peak[i] - full_peak[0], 4 * buffers_grew) << "full-sequence peaks " << full_peak[i] << ", " << full_peak[0];
  }
}

}  // namespace
}  // namespace ration::testing
