// seq_commands.h — the sequence-model commands of the `ration` command line: `plan --sequence`,
// `stream` and `generate` (docs/METHODS.md, "Temporal-dependency buffers for sequence models").
// Owns: their flags, loading the model and checkpoint, and printing (table or one JSON object).
// Does not own: the analysis or the chunk loop (seq/), or the other commands (main.cpp).
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ration::cli {

// `ration plan CONFIG --sequence [--seq-len T] [--json]`: every sequence layer with type, L, buffer and bytes.
struct SequencePlanFlags {
  bool sequence = false;
  int64_t seq_len = 4096;
  void add_to(CLI::App* plan);
};
int cmd_plan_sequence(const std::string& config_path, const std::vector<std::string>& overrides, int64_t seq_len,
                      int64_t batch_size, bool json);

// `ration stream CONFIG --checkpoint DIR --input FILE [--chunk C] [--json]`: bits per byte of a text.
// `ration generate CONFIG --checkpoint DIR --prompt TEXT --tokens N [--json]`: sampled continuation.
class SequenceCommands {
 public:
  void add_to(CLI::App& app);
  // The exit code when one of them was selected; -1 otherwise.
  int run_selected();

 private:
  int stream();
  int generate();
  CLI::App* stream_ = nullptr;
  CLI::App* generate_ = nullptr;
  std::string config_, checkpoint_, input_, prompt_;
  std::vector<std::string> overrides_;
  int64_t chunk_ = 64, tokens_ = 0;
  double temperature_ = 0.8;
  uint64_t seed_ = 0;
  bool json_ = false;
};

}  // namespace ration::cli
