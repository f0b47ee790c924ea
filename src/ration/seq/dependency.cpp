// dependency.cpp — the sequence plan (see dependency.h).
#include "ration/seq/dependency.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "ration/base/check.h"
#include "ration/base/allocator.h"
#include "ration/core/node.h"

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
                         : "streamable: only with T given (layer '" + blocker + "' depends on the whole sequence: "
                           "its buffer holds T steps, memory grows with T)\n";
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
                 "' depends on the whole sequence (type 3, buffer of T steps): it streams only when the sequence ",
                 "length T is known up front (StreamExecutor's seq_len); hint: for gpt set model.attention_window = L ",
                 "(sliding-window attention, L < model.block_size)");
  }
}

// ---- types derived from the operators -----------------------------------------------------------------
const char* to_string(TimeAccess a) {
  switch (a) {
    case TimeAccess::Pointwise: return "pointwise in time";
    case TimeAccess::CarriedState: return "step + carried state";
    case TimeAccess::CausalWindow: return "causal window";
    case TimeAccess::WholeSequence: return "whole sequence";
  }
  return "?";
}

Dependency dependency_of(TimeAccess a) {
  if (a == TimeAccess::CausalWindow) return Dependency::Window;
  if (a == TimeAccess::WholeSequence) return Dependency::WholeSequence;
  return Dependency::PerStep;
}

namespace {
thread_local OpTrace* t_trace = nullptr;
}  // namespace

OpTrace::OpTrace() : previous_(t_trace) { t_trace = this; }
OpTrace::~OpTrace() { t_trace = previous_; }
void OpTrace::add(OpAccess op) { ops_.push_back(std::move(op)); }

void note_op(const std::string& op, TimeAccess access, int64_t window, const std::string& suffix) {
  if (t_trace == nullptr) return;
  t_trace->add({current_scope() + suffix, op, access, window});
}

void note_op_of(const std::string& layer, const std::string& op, TimeAccess access, int64_t window) {
  if (t_trace == nullptr) return;
  t_trace->add({layer, op, access, window});
}

std::vector<DerivedLayer> derive_types(const std::vector<OpAccess>& ops) {
  std::vector<DerivedLayer> layers;
  for (const OpAccess& op : ops) {
    auto it = std::find_if(layers.begin(), layers.end(), [&](const DerivedLayer& l) { return l.layer == op.layer; });
    if (it == layers.end()) {
      layers.push_back({op.layer, Dependency::PerStep, 0, {}});
      it = layers.end() - 1;
    }
    const bool seen = std::any_of(it->ops.begin(), it->ops.end(), [&](const OpAccess& o) {
      return o.op == op.op && o.access == op.access && o.window == op.window;
    });
    if (seen) continue;
    it->ops.push_back(op);
    const Dependency d = dependency_of(op.access);
    if (static_cast<int>(d) > static_cast<int>(it->type)) it->type = d;
    if (op.access == TimeAccess::CausalWindow) it->window += op.window;
  }
  for (DerivedLayer& l : layers)
    if (l.type != Dependency::Window) l.window = 0;
  return layers;
}

std::string derived_table(const std::vector<DerivedLayer>& layers) {
  std::string out = "types derived from the operators (each operator's access to the time axis):\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-22s %-36s %-20s %6s %-17s\n", "layer", "operator", "time access", "L", "type");
  out += line;
  for (const DerivedLayer& l : layers) {
    for (const OpAccess& op : l.ops) {
      std::snprintf(line, sizeof line, "%-22s %-36s %-20s %6lld %-17s\n", l.layer.c_str(), op.op.c_str(),
                    to_string(op.access), static_cast<long long>(op.window), to_string(dependency_of(op.access)));
      out += line;
    }
    std::snprintf(line, sizeof line, "%-22s %-36s %-20s %6lld %-17s\n", l.layer.c_str(), "= layer", "",
                  static_cast<long long>(l.window), to_string(l.type));
    out += line;
  }
  return out;
}

nlohmann::json derived_json(const std::vector<DerivedLayer>& layers) {
  nlohmann::json j = nlohmann::json::array();
  for (const DerivedLayer& l : layers) {
    nlohmann::json ops = nlohmann::json::array();
    for (const OpAccess& op : l.ops)
      ops.push_back({{"op", op.op}, {"access", to_string(op.access)}, {"L", op.window},
                     {"type", static_cast<int>(dependency_of(op.access))}});
    j.push_back({{"layer", l.layer}, {"type", static_cast<int>(l.type)}, {"L", l.window}, {"operators", ops}});
  }
  return j;
}

namespace {
// The operator that gives a derived layer its type: the first one whose access has the layer's type.
const OpAccess& deciding_op(const DerivedLayer& l) {
  for (const OpAccess& op : l.ops)
    if (dependency_of(op.access) == l.type) return op;
  return l.ops.front();
}
}  // namespace

void check_declarations(const std::vector<LayerDependency>& declared, const std::vector<DerivedLayer>& derived,
                        const std::string& model) {
  for (const LayerDependency& d : declared) {
    auto it = std::find_if(derived.begin(), derived.end(), [&](const DerivedLayer& l) { return l.layer == d.layer; });
    RATION_CHECK(it != derived.end(), "model '", model, "' declares layer '", d.layer,
                 "' in sequence_layers(), but no operator of that layer ran in a traced step");
    const OpAccess& op = deciding_op(*it);
    RATION_CHECK(d.type == it->type, "model '", model, "': layer '", d.layer, "' is declared type ",
                 to_string(d.type), ", but its operator '", op.op, "' reads the time axis as ", to_string(op.access),
                 op.access == TimeAccess::CausalWindow ? " (L = " + std::to_string(op.window) + ")" : std::string(),
                 ": type ", to_string(it->type));
    RATION_CHECK(d.type != Dependency::Window || d.window == it->window, "model '", model, "': layer '", d.layer,
                 "' is declared with L = ", d.window, ", but its operator '", op.op, "' reads a causal window of L = ",
                 it->window);
  }
  for (const DerivedLayer& l : derived) {
    const bool known = std::any_of(declared.begin(), declared.end(), [&](const LayerDependency& d) { return d.layer == l.layer; });
    RATION_CHECK(known, "model '", model, "': operator '", l.ops.front().op, "' ran in layer '", l.layer,
                 "', which sequence_layers() does not declare");
  }
}

}  // namespace ration::seq
