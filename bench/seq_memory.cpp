// seq_memory.cpp — memory vs sequence length T for sequence models (docs/METHODS.md, "Temporal-dependency
// buffers for sequence models"): ration's streaming executor (chunk by chunk, per-layer ring buffers) against
// the whole sequence at once, ration's own full-sequence forward and the PyTorch peer (bench/seq_memory_peer.py,
// Debian's /usr/bin/python3, same models, measured by the same counting allocator through ctypes).
// Every row scores bits per byte of T random bytes, no grad, one thread; peak = measured peak above the
// parameters. Prints a table and writes JSON (--out).
//   build/bench/bench_seq_memory [--max-t 1000000] [--lstm-max-t 100000] [--peer-max-t 100000]
//                                [--attn-max-t 4096] [--chunk 256] [--out bench/results/seq_memory.json]
//   build/bench/bench_seq_memory --type3 1 [--max-t 100000] [--out bench/results/seq_memory_type3.json]: the
//     model with a whole-sequence layer (birnn_tagger) chunk-wise with its buffer of T steps, each layer's
//     buffer bytes, against the full sequence (ration, PyTorch) at T = 1000, 10^4, 10^5.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include <ATen/Parallel.h>

#include "ration/models/families.h"
#include "ration/streaming/stream_executor.h"

namespace {
using namespace ration;

const char* kLstm = "[model]\ntype = \"lstm_lm\"\nvocab_size = 256\nn_embd = 64\nhidden_size = 128\nn_layer = 2\n";
const char* kTcn = "[model]\ntype = \"tcn_lm\"\nvocab_size = 256\nn_embd = 96\nn_layer = 6\nkernel_size = 3\n";
std::string gpt(int64_t block, int64_t window) {
  return "[model]\ntype = \"gpt\"\nvocab_size = 256\nn_layer = 4\nn_head = 4\nn_embd = 128\ndropout = 0.0\nblock_size = " +
         std::to_string(block) + "\nattention_window = " + std::to_string(window) + "\n";
}

std::unique_ptr<models::Model> build(const std::string& toml) {
  Config cfg = Config::from_string(toml, "bench_seq_memory");
  auto m = models::build_model(cfg);
  m->eval();
  return m;
}

std::string random_bytes(int64_t n, uint64_t seed) {
  std::string s(static_cast<size_t>(n), '\0');
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& c : s) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x & 0xff);
  }
  return s;
}

struct Row {
  std::string model, mode;
  int64_t seq_len = 0, peak_bytes = 0, buffers_bytes = 0;
  double seconds = 0, bits_per_byte = 0;
};

Row streamed(const std::string& name, const std::string& toml, int64_t T, int64_t chunk) {
  auto model = build(toml);
  const int64_t base = memory::device_current_bytes(memory::stats());
  seq::StreamExecutor ex(*model, chunk);
  std::istringstream in(random_bytes(T, 7));
  const seq::StreamScore s = seq::score_bytes(ex, in, "random bytes");
  return {name, "ration streamed (chunk " + std::to_string(chunk) + ")", T, s.memory.peak_bytes - base,
          s.memory.buffers_bytes, s.seconds, s.bits_per_byte};
}

Row full_sequence(const std::string& name, const std::string& toml, int64_t T) {
  auto model = build(toml);
  NoGradGuard no_grad;
  const std::string bytes = random_bytes(T, 7);
  at::Tensor ids = at::empty({1, T}, at::kLong);
  for (int64_t i = 0; i < T; ++i) ids[0][i] = static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  const int64_t base = memory::device_current_bytes(memory::stats());
  memory::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  const at::Tensor logits = dynamic_cast<models::LanguageModel&>(*model).logits(Value(ids)).tensor();  // (1, T, V)
  const double nats = at::cross_entropy_loss(logits[0].narrow(0, 0, T - 1).to(at::kDouble), ids[0].narrow(0, 1, T - 1),
                                             {}, at::Reduction::Sum)
                          .item<double>();
  const double secs = bench::seconds_since(t0);
  const int64_t peak = memory::device_peak_bytes(memory::stats()) - base;
  return {name, "ration full sequence", T, peak, 0, secs, nats / std::log(2.0) / static_cast<double>(T - 1)};
}

Row peer(const std::string& name, const std::string& peer_model, int64_t T) {
  const std::string cmd = bench::python_peer(RATION_SOURCE_DIR, "seq_memory_peer.py") + " --probe " +
                          RATION_PROBE_PATH + " --model " + peer_model + " --seq-len " + std::to_string(T);
  int rc = 0;
  const std::string out = bench::run_command(cmd, &rc);
  RATION_CHECK(rc != -1, "cannot run ", cmd);
  Row r{name, "pytorch full sequence", T, -1, 0, 0, 0};
  const std::vector<nlohmann::json> lines = bench::json_lines(out);
  if (rc != 0 || lines.empty()) return r;  // could not reach this T (reported as such)
  const nlohmann::json& j = lines.back();
  r.peak_bytes = j["peak_bytes"].get<int64_t>();
  r.seconds = j["seconds"].get<double>();
  return r;
}

const char* kBirnn = "[model]\ntype = \"birnn_tagger\"\nvocab_size = 256\nn_embd = 64\nhidden_size = 64\nkernel_size = 3\n";

// birnn_tagger chunk-wise with its buffers of 1, L + 1 and T steps: bits per byte of T random bytes from the
// logits finish() hands out chunk by chunk; the peak includes the buffers (allocated before the run starts).
Row streamed_type3(int64_t T, int64_t chunk, nlohmann::json& layers) {
  auto model = build(kBirnn);
  NoGradGuard no_grad;
  const std::string bytes = random_bytes(T, 7);
  at::Tensor ids = at::empty({1, T}, at::kLong);
  for (int64_t i = 0; i < T; ++i) ids[0][i] = static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  const int64_t base = memory::device_current_bytes(memory::stats());
  memory::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  seq::StreamExecutor ex(*model, chunk, 1, T);
  for (int64_t s = 0; s < T; s += chunk) ex.feed_chunk(Value(ids.narrow(1, s, std::min(chunk, T - s)).contiguous()));
  double nats = 0;
  int64_t at = 0;
  ex.finish([&](const at::Tensor& logits) {  // (1, n, V): step at + i predicts byte at + i + 1
    const int64_t n = std::min(logits.size(1), T - 1 - at);
    if (n > 0)
      nats += at::cross_entropy_loss(logits[0].narrow(0, 0, n).to(at::kDouble), ids[0].narrow(0, at + 1, n), {},
                                     at::Reduction::Sum).item<double>();
    at += logits.size(1);
  });
  const double secs = bench::seconds_since(t0);
  const int64_t peak = memory::device_peak_bytes(memory::stats()) - base;
  const seq::SequencePlan plan = seq::plan_sequence(dynamic_cast<seq::Streamable&>(*model).sequence_layers(), T, 1, 4);
  layers = nlohmann::json::object();
  for (const auto& r : plan.rows) layers[r.layer.layer] = r.layer.carries ? r.buffer_bytes : 0;
  return {"birnn_tagger", "ration chunk-wise (chunk " + std::to_string(chunk) + ")", T, peak, ex.buffers().bytes(), secs,
          nats / std::log(2.0) / static_cast<double>(T - 1)};
}

}  // namespace

int main(int argc, char** argv) {
  memory::install_counting_allocator();
  at::set_num_threads(1);
  int64_t max_t = 1000000, lstm_max_t = 100000, peer_max_t = 100000, attn_max_t = 4096, chunk = 256;
  std::string out_path = "bench/results/seq_memory.json";
  bool type3 = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const std::string v = argv[i + 1];
    if (a == "--max-t") max_t = std::stoll(v);
    else if (a == "--lstm-max-t") lstm_max_t = std::stoll(v);
    else if (a == "--peer-max-t") peer_max_t = std::stoll(v);
    else if (a == "--attn-max-t") attn_max_t = std::stoll(v);
    else if (a == "--chunk") chunk = std::stoll(v);
    else if (a == "--out") out_path = v;
    else if (a == "--type3") {
      type3 = v != "0";
    }
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<int64_t> lengths;
  for (int64_t t = 1000; t <= max_t; t *= 10) lengths.push_back(t);
  std::vector<Row> rows;
  auto emit = [&](Row r) {
    std::printf("%-12s %-30s %9lld %14s %12s %9.2f\n", r.model.c_str(), r.mode.c_str(), static_cast<long long>(r.seq_len),
                r.peak_bytes < 0 ? "not reached" : memory::format_bytes(r.peak_bytes).c_str(),
                r.buffers_bytes > 0 ? memory::format_bytes(r.buffers_bytes).c_str() : "-", r.seconds);
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  std::printf("%-12s %-30s %9s %14s %12s %9s\n", "model", "mode", "T", "peak", "buffers", "seconds");
  if (type3) {
    nlohmann::json j = nlohmann::json::array();
    for (int64_t T : lengths) {
      nlohmann::json layers;
      const Row rows3[3] = {streamed_type3(T, chunk, layers), full_sequence("birnn_tagger", kBirnn, T),
                            peer("birnn_tagger", "birnn_tagger", T)};
      for (const Row& r : rows3) {
        emit(r);
        j.push_back({{"model", r.model}, {"mode", r.mode}, {"seq_len", r.seq_len}, {"peak_bytes", r.peak_bytes},
                     {"buffers_bytes", r.buffers_bytes}, {"seconds", r.seconds}, {"bits_per_byte", r.bits_per_byte}});
        if (&r == &rows3[0]) j.back()["layer_buffer_bytes"] = layers;
      }
      std::printf("  buffers per layer at T = %lld: %s\n", static_cast<long long>(T), layers.dump().c_str());
    }
    bench::write_json(out_path, j);
    std::printf("wrote %s\n", out_path.c_str());
    return 0;
  }
  for (int64_t T : lengths) {
    if (T <= lstm_max_t) emit(streamed("lstm_lm", kLstm, T, chunk));
    if (T <= peer_max_t) emit(peer("lstm_lm", "lstm_lm", T));
    emit(streamed("tcn_lm", kTcn, T, chunk));
    if (T <= peer_max_t) emit(peer("tcn_lm", "tcn_lm", T));
    emit(streamed("gpt_window64", gpt(128, 64), T, chunk));
    if (T <= attn_max_t) emit(peer("gpt_window64", "gpt_window", T));
    if (T <= attn_max_t) emit(full_sequence("gpt_full", gpt(T, 0), T));
    if (T <= attn_max_t) emit(peer("gpt_full", "gpt_full", T));
  }
  for (int64_t T : {attn_max_t}) {
    if (T == 1000 || T > max_t) continue;
    emit(streamed("gpt_window64", gpt(128, 64), T, chunk));
    emit(peer("gpt_window64", "gpt_window", T));
    emit(full_sequence("gpt_full", gpt(T, 0), T));
    emit(peer("gpt_full", "gpt_full", T));
  }
  nlohmann::json j = nlohmann::json::array();
  for (const Row& r : rows)
    j.push_back({{"model", r.model}, {"mode", r.mode}, {"seq_len", r.seq_len}, {"peak_bytes", r.peak_bytes},
                 {"buffers_bytes", r.buffers_bytes}, {"seconds", r.seconds}, {"bits_per_byte", r.bits_per_byte}});
  bench::write_json(out_path, j);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
