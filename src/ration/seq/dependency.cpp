// dependency.cpp — the sequence plan (see dependency.h).
#include "ration/seq/dependency.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::seq {

const char* to_string(Dependency d) {
  switch (d) {
    case Dependency::PerStep: return "1 per-step";
    case Dependency::Window: return "2 window";
    case Dependency::WholeSequence: return "3 whole-sequence";
  }
  return "?";
}

int64_t buffer_steps(const LayerDependency& d, int64_t seq_len) {
  if (d.type == Dependency::PerStep) return 1;
  if (d.type == Dependency::Window) return d.window + 1;
  return seq_len;
}

SequencePlan plan_sequence(const std::vector<LayerDependency>& layers, int64_t seq_len, int64_t batch,
                           int64_t element_size) {
  RATION_CHECK(seq_len >= 1, "sequence length must be >= 1 (--seq-len T); got ", seq_len);
  RATION_CHECK(batch >= 1, "batch size must be >= 1; got ", batch);
  SequencePlan plan;
  plan.seq_len = seq_len;
  plan.batch = batch;
  plan.element_size = element_size;
  for (const LayerDependency& d : layers) {
    SequencePlanRow row;
    row.layer = d;
    row.buffer_steps = buffer_steps(d, seq_len);
    const int64_t per_step = d.step_floats * batch * element_size;
    row.buffer_bytes = row.buffer_steps * per_step;
    row.full_seq_bytes = seq_len * per_step;
    plan.streamed_bytes += row.buffer_bytes;
    plan.full_seq_bytes += row.full_seq_bytes;
    plan.rows.push_back(row);
  }
  return plan;
}

std::string SequencePlan::whole_sequence_layer() const {
  for (const auto& r : rows)
    if (r.layer.type == Dependency::WholeSequence) return r.layer.layer;
  return "";
}

std::string SequencePlan::to_table() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "sequence plan: T = %lld, batch %lld, %lld-byte elements\n",
                static_cast<long long>(seq_len), static_cast<long long>(batch), static_cast<long long>(element_size));
  out += line;
  std::snprintf(line, sizeof line, "%-28s %-17s %6s %-14s %12s %14s %14s\n", "layer", "type", "L", "holds",
                "buffer steps", "buffer", "full sequence");
  out += line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-28s %-17s %6lld %-14s %12lld %14s %14s\n", r.layer.layer.c_str(),
                  to_string(r.layer.type), static_cast<long long>(r.layer.window), r.layer.holds.c_str(),
                  static_cast<long long>(r.buffer_steps), memory::format_bytes(r.buffer_bytes).c_str(),
                  memory::format_bytes(r.full_seq_bytes).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "total: streamed %s, full sequence %s\n", memory::format_bytes(streamed_bytes).c_str(),
                memory::format_bytes(full_seq_bytes).c_str());
  out += line;
  const std::string blocker = whole_sequence_layer();
  out += blocker.empty() ? "streamable: yes (memory does not grow with T)\n"
                         : "streamable: no (layer '" + blocker + "' depends on the whole sequence)\n";
  return out;
}

nlohmann::json SequencePlan::to_json() const {
  nlohmann::json j = {{"seq_len", seq_len}, {"batch", batch}, {"element_size", element_size},
                      {"streamed_bytes", streamed_bytes}, {"full_sequence_bytes", full_seq_bytes},
                      {"streamable", whole_sequence_layer().empty()}};
  j["layers"] = nlohmann::json::array();
  for (const auto& r : rows)
    j["layers"].push_back({{"layer", r.layer.layer}, {"type", static_cast<int>(r.layer.type)},
                           {"L", r.layer.window}, {"holds", r.layer.holds}, {"step_floats", r.layer.step_floats},
                           {"buffer_steps", r.buffer_steps}, {"buffer_bytes", r.buffer_bytes},
                           {"full_sequence_bytes", r.full_seq_bytes}});
  return j;
}

void require_streamable(const std::vector<LayerDependency>& layers, const std::string& model) {
  for (const LayerDependency& d : layers) {
    RATION_CHECK(d.type != Dependency::WholeSequence, "model '", model, "' cannot stream: layer '", d.layer,
                 "' depends on the whole sequence (type 3, buffer of T steps); ",
                 "hint: for gpt set model.attention_window = L (sliding-window attention, L < model.block_size)");
  }
}

}  // namespace ration::seq
