// seq_commands.cpp — see seq_commands.h.
#include "ration/cli/seq_commands.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "ration/base/check.h"
#include "ration/cli/validators.h"
#include "ration/base/allocator.h"
#include "ration/seq/dependency.h"
#include "ration/streaming/stream_executor.h"
#include "ration/runtime/budget.h"
#include "ration/train/checkpoint.h"
#include "ration/train/signals.h"
#include "ration/train/trainer.h"

namespace ration::cli {

namespace {

// The most bytes one `generate` samples (its text is also kept for the JSON output).
constexpr int64_t kMaxGeneratedTokens = 10'000'000;
// The config's model in eval mode, with every key of the config validated.
train::Setup load_model(const std::string& config_path, const std::vector<std::string>& overrides) {
  train::Setup setup = train::build_setup(train::load_config(config_path, overrides));
  train::read_run_settings(setup.config);
  train::read_memory_settings(setup.config);
  setup.config.check_all_used();
  setup.model->eval();
  return setup;
}

void restore(models::Model& model, const std::string& checkpoint, const std::string& config_path) {
  const train::Checkpoint ckpt = train::load_checkpoint(checkpoint);
  try {
    train::restore_weights(ckpt, model.named_parameters(), model.named_buffers());
  } catch (const Error& e) {
    RATION_CHECK(false, "--checkpoint ", checkpoint, " does not hold a '", model.family(), "' model as configured in ",
                 config_path, ": ", e.what());
  }
}

nlohmann::json memory_json(const seq::StreamMemory& m) {
  return {{"peak_bytes", m.peak_bytes}, {"buffers_bytes", m.buffers_bytes}};
}
}  // namespace

void SequencePlanFlags::add_to(CLI::App* plan) {
  plan->add_flag("--sequence", sequence, "list every sequence layer with its temporal dependency (type 1/2/3), L, "
                                         "buffer length and bytes, streamed vs full-sequence totals, and the "
                                         "operators each layer runs with the type each one gives");
  plan->add_option("--seq-len", seq_len, "sequence length T for --sequence (default 4096)")->check(integer_at_least(1, "time steps"));
}

int cmd_plan_sequence(const std::string& config_path, const std::vector<std::string>& overrides, int64_t seq_len,
                      int64_t batch_size, bool json) {
  train::Setup setup = load_model(config_path, overrides);
  auto* streamable = dynamic_cast<seq::Streamable*>(setup.model.get());
  RATION_CHECK(streamable != nullptr, config_path, ": model.type '", setup.model->family(),
               "' is not a sequence model (plan --sequence takes lstm_lm, tcn_lm, gpt or birnn_tagger)");
  const int64_t element = static_cast<int64_t>(setup.model->parameter_options().dtype().itemsize());
  // The declarations are checked against the operators each layer runs (an error names the layer and the
  // operator), then planned.
  const std::vector<seq::DerivedLayer> derived = seq::trace_temporal_types(*setup.model);
  const seq::SequencePlan plan =
      seq::plan_sequence(streamable->sequence_layers(), seq_len, batch_size > 0 ? batch_size : 1, element);
  if (json) {
    nlohmann::json j = plan.to_json();
    j["derived"] = seq::derived_json(derived);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << plan.to_table() << seq::derived_table(derived);
  }
  return 0;
}

void SequenceCommands::add_to(CLI::App& app) {
  stream_ = app.add_subcommand("stream", "bits per byte of a text of any length, streamed chunk by chunk "
                                         "(memory does not grow with the text for lstm_lm, tcn_lm, windowed gpt)");
  generate_ = app.add_subcommand("generate", "sample a continuation of a prompt, one byte at a time, in constant memory");
  for (CLI::App* cmd : {stream_, generate_}) {
    cmd->add_option("config", config_, "CONFIG.toml")->required()->check(CLI::ExistingFile);
    cmd->add_option("--set", overrides_, "override a config key: section.key=value (repeatable)");
    cmd->add_option("--checkpoint", checkpoint_, "checkpoint dir (a run's checkpoint_dir or one ckpt-<step>)")->required();
    cmd->add_option("--chunk", chunk_, "steps per chunk C >= 1 (default 64)");
    cmd->add_flag("--json", json_, "print one JSON object");
  }
  stream_->add_option("--input", input_, "text file to score")->required();
  generate_->add_option("--prompt", prompt_, "text to continue")->required();
  generate_->add_option("--tokens", tokens_, "bytes to sample, at most 10,000,000 (shown as they are sampled; "
                                            "SIGINT/SIGTERM stops and reports what was sampled)")
      ->required()
      ->check(integer_in(0, kMaxGeneratedTokens, "bytes to sample"));
  generate_->add_option("--temperature", temperature_, "sampling temperature (0 = argmax; default 0.8)");
  generate_->add_option("--seed", seed_, "sampling seed (default 0)");
}

int SequenceCommands::run_selected() {
  if (stream_ && *stream_) return stream();
  if (generate_ && *generate_) return generate();
  return -1;
}

int SequenceCommands::stream() {
  RATION_CHECK(chunk_ >= 1, "--chunk must be >= 1; got ", chunk_);
  RATION_CHECK(!std::filesystem::is_directory(input_), "--input ", input_, ": is a directory; expected a text file to score");
  std::ifstream in(input_, std::ios::binary);
  RATION_CHECK(in.good(), "--input ", input_, ": cannot open the file for reading");
  train::Setup setup = load_model(config_, overrides_);
  seq::StreamExecutor executor(*setup.model, chunk_);  // first: a model that cannot stream fails before loading
  restore(*setup.model, checkpoint_, config_);
  const seq::StreamScore s = seq::score_bytes(executor, in, "--input " + input_);
  if (json_) {
    std::cout << nlohmann::json{{"model", setup.model->family()}, {"input", input_}, {"chunk", chunk_},
                                {"bits_per_byte", s.bits_per_byte}, {"tokens", s.tokens}, {"seconds", s.seconds},
                                {"memory", memory_json(s.memory)}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("%s: %lld bytes predicted, %.4f bits per byte (chunk %lld, %.1f s, %.0f bytes/s)\n", input_.c_str(),
                static_cast<long long>(s.tokens), s.bits_per_byte, static_cast<long long>(chunk_), s.seconds,
                static_cast<double>(s.tokens) / std::max(s.seconds, 1e-9));
    std::printf("memory: measured peak %s (parameters included), ring buffers %s\n",
                memory::format_bytes(s.memory.peak_bytes).c_str(), memory::format_bytes(s.memory.buffers_bytes).c_str());
  }
  return 0;
}

int SequenceCommands::generate() {
  RATION_CHECK(chunk_ >= 1, "--chunk must be >= 1; got ", chunk_);
  train::Setup setup = load_model(config_, overrides_);
  seq::StreamExecutor executor(*setup.model, chunk_);  // first: a model that cannot stream fails before loading
  restore(*setup.model, checkpoint_, config_);
  // The text goes out as it is sampled (without --json); a signal stops sampling and the summary says so.
  const train::InterruptScope interrupt;
  if (!json_) {
    std::fputs(prompt_.c_str(), stdout);
    std::fflush(stdout);
  }
  const seq::Generated g = seq::generate(executor, prompt_, tokens_, temperature_, seed_, [&](char c) {
    if (!json_) {
      std::fputc(c, stdout);
      std::fflush(stdout);
    }
    return train::InterruptScope::requested() == 0;
  });
  const int stopped_by = train::InterruptScope::requested();
  if (json_) {
    std::cout << nlohmann::json{{"model", setup.model->family()}, {"prompt", prompt_}, {"text", g.text},
                                {"tokens", g.tokens}, {"seconds", g.seconds}, {"memory", memory_json(g.memory)},
                                {"interrupted", stopped_by != 0}}
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    std::printf("\n-- %lld bytes in %.2f s%s; memory: measured peak %s, ring buffers %s\n",
                static_cast<long long>(g.tokens), g.seconds,
                stopped_by ? (std::string(", stopped by ") + train::InterruptScope::name(stopped_by)).c_str() : "",
                memory::format_bytes(g.memory.peak_bytes).c_str(), memory::format_bytes(g.memory.buffers_bytes).c_str());
  }
  return stopped_by ? train::InterruptScope::exit_status(stopped_by) : 0;
}

}  // namespace ration::cli
