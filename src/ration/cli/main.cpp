// main.cpp — the `ration` command line: train, gradcheck, plan, launch (and, in seq_commands.cpp,
// plan --sequence, stream, generate).
// Owns: argument parsing and exit codes (0 ok, 1 check failed, 2 user error). Work happens in train/.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>

#include "ration/base/blas.h"
#include "ration/base/openmp.h"
#include "ration/cli/seq_commands.h"
#include "ration/cli/validators.h"
#include "ps_command.h"
#include "train_views.h"
#include "ration/base/check.h"
#include "ration/core/trace.h"
#include "ration/distributed/launch.h"
#include "ration/base/allocator.h"
#include "ration/plan/html.h"
#include "ration/plan/report.h"
#include "ration/torchscript/op_report.h"
#include "ration/runtime/budget.h"
#include "ration/train/checkpoint_shards.h"
#include "ration/train/gradcheck.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

namespace {

using ration::cli::integer_at_least;

// Budget flags are config keys ([memory] section) set from the command line.
struct BudgetFlags {
  std::string budget, plan, keep_bytes;
  int64_t keep_groups = -1;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--memory-budget", budget, "whole device-memory budget, e.g. 512MiB, 2GiB, 1.5G (memory.budget)");
    cmd->add_option("--plan", plan, "planner strategy: " + ration::memory::strategy_name_list() + " (memory.plan; default knapsack)");
    cmd->add_option("--keep-groups", keep_groups, "keep at most N saved groups (may only lower the plan's figure)")
        ->check(integer_at_least(0, "saved groups to keep"));
    cmd->add_option("--keep-bytes", keep_bytes, "keep at most SIZE of saved groups (may only lower the plan's figure)");
  }
  void apply(std::vector<std::string>& overrides) const {
    if (!budget.empty()) overrides.push_back("memory.budget=" + budget);
    if (!plan.empty()) overrides.push_back("memory.plan=" + plan);
    if (keep_groups >= 0) overrides.push_back("memory.keep_groups=" + std::to_string(keep_groups));
    if (!keep_bytes.empty()) overrides.push_back("memory.keep_bytes=" + keep_bytes);
  }
};

// Offload flags are config keys ([offload] section) set from the command line.
struct OffloadFlags {
  bool offload = false;
  std::string tier, t1, t2, t3, min_bytes, dir;
  int prefetch = -1;
  void add_to(CLI::App* cmd) {
    cmd->add_flag("--offload", offload, "offload saved activations (offload.enabled); with --memory-budget the "
                                        "planner chooses keep/recompute/offload");
    cmd->add_option("--offload-tier", tier, "disk (default), host or host+disk (offload.tier)");
    cmd->add_option("--offload-t1", t1, "without a budget: copy out when device usage exceeds SIZE (offload.t1, default 0)");
    cmd->add_option("--offload-t2", t2, "without a budget: pause forward while usage exceeds SIZE and copies are in "
                                        "flight (offload.t2)");
    cmd->add_option("--offload-t3", t3, "without a budget: hold prefetches while usage would exceed SIZE (offload.t3)");
    cmd->add_option("--offload-min-bytes", min_bytes, "keep saved values smaller than SIZE (offload.min_bytes, 64KiB)");
    cmd->add_option("--offload-dir", dir, "spill directory (offload.dir, default $TMPDIR or /tmp)");
    cmd->add_option("--offload-prefetch", prefetch, "fetch back N backward nodes ahead (offload.prefetch, default 2)")
        ->check(integer_at_least(0, "backward nodes to fetch ahead"));
  }
  void apply(std::vector<std::string>& overrides) const {
    if (offload) overrides.push_back("offload.enabled=true");
    if (!tier.empty()) overrides.push_back("offload.tier=" + tier);
    if (!t1.empty()) overrides.push_back("offload.t1=" + t1);
    if (!t2.empty()) overrides.push_back("offload.t2=" + t2);
    if (!t3.empty()) overrides.push_back("offload.t3=" + t3);
    if (!min_bytes.empty()) overrides.push_back("offload.min_bytes=" + min_bytes);
    if (!dir.empty()) overrides.push_back("offload.dir=" + dir);
    if (prefetch >= 0) overrides.push_back("offload.prefetch=" + std::to_string(prefetch));
  }
};

// --trace FILE.json [--trace-max-mb N]: a Chrome Trace Event file of everything the command runs.
struct TraceFlags {
  std::string path;
  double max_mb = 256;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--trace", path, "write a timeline of the run to FILE.json (Chrome Trace Event format: "
                                     "open in ui.perfetto.dev or chrome://tracing)");
    cmd->add_option("--trace-max-mb", max_mb, "bound on the trace file in MiB (default 256); a larger trace is an error")
        ->check(ration::cli::trace_megabytes());
  }
};

// Runs `command` under a trace when --trace was given, and writes the trace once it returns.
int with_trace(const TraceFlags& flags, const std::function<int()>& command) {
  if (flags.path.empty()) return command();
  ration::Trace trace(static_cast<int64_t>(flags.max_mb * 1024 * 1024));
  int rc = 0;
  {
    ration::TraceScope scope(trace);
    rc = command();
  }
  trace.write(flags.path, "--trace", "--trace-max-mb");
  return rc;
}

// A command's model, batch and memory runtime, built from the config (and its --set overrides) in one
// call. With a budget the runtime has profiled one step on the batch and made its plan.
struct Prepared {
  ration::train::Setup setup;
  ration::data::Batch batch;
  std::unique_ptr<ration::train::StepRuntime> runtime;
};
Prepared prepare(const std::string& config_path, const std::vector<std::string>& overrides, int64_t batch_size) {
  using namespace ration;
  Prepared p;
  p.setup = train::build_setup(train::load_config(config_path, overrides));
  Config& c = p.setup.config;
  // The training keys do not change a single step, but they are validated (and so not unknown).
  const train::RunSettings run = train::read_run_settings(c);
  train::MemorySettings memory = train::read_memory_settings(c);
  c.check_all_used();
  models::Model& model = *p.setup.model;
  model.train();
  p.batch = train::sample_batch(p.setup, batch_size > 0 ? batch_size : p.setup.batch_size, p.setup.seed);
  p.runtime = std::make_unique<train::StepRuntime>(std::move(memory));
  // The optimiser a training run would build: its state is fixed memory the plan leaves room for.
  const auto optimizer = train::build_optimizer(run, model.named_parameters());
  p.runtime->prepare(model, p.batch, p.setup.seed + 1, optimizer.get());
  const memory::Plan* plan = p.runtime->current_plan();
  if (Trace* trace = current_trace(); trace != nullptr && plan != nullptr) trace->set_budget(plan->budget_bytes);
  return p;
}

int cmd_plan(const std::string& config_path, const std::vector<std::string>& overrides, int64_t batch_size, bool json,
             const std::string& html) {
  using namespace ration;
  Prepared p = prepare(config_path, overrides, batch_size);
  const memory::Plan* plan = p.runtime->current_plan();
  RATION_CHECK(plan != nullptr, "a memory budget is needed: --memory-budget SIZE (or memory.budget)");
  if (!html.empty())
    memory::write_plan_html(html, "--html", p.runtime->step_profile(), *plan,
                            config_path + ", budget " + memory::format_bytes(plan->budget_bytes));
  // An imported TorchScript module: which ops ran as ration's own and which as generic nodes.
  const bool imported = p.setup.model->family() == "torchscript";
  const auto shares = torchscript::op_shares(p.runtime->step_profile());
  if (json) {
    nlohmann::json j = ration::memory::to_json(*plan);
    if (imported) j["imported_ops"] = torchscript::op_share_json(shares);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << plan->to_table();
    if (imported) std::cout << torchscript::op_share_table(shares);
  }
  return 0;
}

void print_memory_runtime_step(const ration::train::StepRuntime& runtime, const ration::train::StepStats& st) {
  using namespace ration;
  if (runtime.mode() == train::MemoryMode::Plan)
    std::printf("budgeted step: %lld values dropped, %lld producers re-run (%.2f ms), %lld offloaded\n",
                static_cast<long long>(st.dropped_values), static_cast<long long>(st.recomputed_nodes),
                st.recompute_ms, static_cast<long long>(st.offloaded_values));
  if (runtime.settings().offload.enabled) {
    const memory::OffloadStats& o = st.offload;
    std::printf("offload (%s): %lld values in %lld buffers, %s written, %s read back, %lld prefetched, "
                "%lld on demand, %lld fell back to recompute\n",
                runtime.engine()->tier().name().c_str(),
                static_cast<long long>(o.offloaded_values), static_cast<long long>(o.offloaded_storages),
                memory::format_bytes(o.written_bytes).c_str(), memory::format_bytes(o.read_bytes).c_str(),
                static_cast<long long>(o.prefetches), static_cast<long long>(o.demand_fetches),
                static_cast<long long>(o.fallbacks));
  }
}

int cmd_gradcheck(const std::string& config_path, const std::vector<std::string>& overrides, double tol,
                  int64_t batch_size, bool json) {
  using namespace ration;
  Prepared p = prepare(config_path, overrides, batch_size);
  models::Model& model = *p.setup.model;
  train::StepRuntime& runtime = *p.runtime;
  const uint64_t seed = p.setup.seed + 1;
  // With a budget or offload: our gradients are computed under the memory runtime (dropped values
  // recomputed, offloaded values fetched back) and must also equal the plain engine's bit for bit.
  int64_t not_bitwise = 0;
  if (runtime.mode() != train::MemoryMode::Keep) {
    train::StepRuntime plain_runtime;
    const train::StepStats plain = engine_step(plain_runtime, model, p.batch, seed);
    const train::StepStats managed = engine_step(runtime, model, p.batch, seed);
    for (size_t i = 0; i < plain.gradients.size(); ++i)
      not_bitwise += at::equal(plain.gradients[i].second, managed.gradients[i].second) ? 0 : 1;
    if (!json) {
      if (const memory::Plan* plan = runtime.current_plan()) std::cout << plan->to_table();
      print_memory_runtime_step(runtime, managed);
      std::printf("gradients bitwise equal to the plain engine: %s (%lld of %zu differ)\n",
                  not_bitwise == 0 ? "yes" : "NO", static_cast<long long>(not_bitwise), plain.gradients.size());
    }
  }
  GradcheckResult r = gradcheck(runtime, model, p.batch, seed, tol);
  r.passed = r.passed && not_bitwise == 0;
  if (json) {
    nlohmann::json j = {{"loss_ours", r.loss_ours}, {"loss_torch", r.loss_torch},
                        {"memory_budget", runtime.settings().budget.has_budget()},
                        {"offload", runtime.engine() != nullptr},
                        {"policy_vs_plain_params_differing", not_bitwise},
                        {"worst_rel_error", r.worst_rel_error}, {"tolerance", tol}, {"passed", r.passed}};
    for (const auto& p : r.params)
      j["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"max_abs_error", p.max_abs_error},
                             {"max_rel_error", p.max_rel_error}, {"bitwise_equal", p.bitwise_equal}});
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("gradcheck %s: loss ours %.8f, torch::autograd %.8f\n", config_path.c_str(), r.loss_ours, r.loss_torch);
    std::printf("%-40s %-18s %12s %12s %s\n", "parameter", "shape", "max abs err", "max rel err", "bitwise");
    for (const auto& p : r.params) {
      std::string shape;
      for (size_t i = 0; i < p.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(p.shape[i]);
      std::printf("%-40s %-18s %12.3e %12.3e %s\n", p.name.c_str(), shape.c_str(), p.max_abs_error, p.max_rel_error,
                  p.bitwise_equal ? "yes" : "no");
    }
    std::printf("worst relative error %.3e (tolerance %.1e): %s\n", r.worst_rel_error, tol, r.passed ? "PASS" : "FAIL");
  }
  return r.passed ? 0 : 1;
}

const char* const kLaunchUsage =
    "usage: ration launch -n N [--servers S] [--master-addr A] [--master-port P] [--nnodes M --node-rank R] [--grace S] [--oversubscribe] "
    "-- train CONFIG.toml [train flags...]\n"
    "  starts N ranks of this node with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as torchrun "
    "does;\n  --master-port 0 picks a free port (one node); defaults 127.0.0.1:29500, --grace 15 (seconds the "
    "others get\n  to stop after one rank fails, before SIGTERM); -n is bounded by the machine (4 ranks per core, one "
    "per 256 MiB)\n  unless --oversubscribe; --servers S adds S dedicated parameter servers (dist.servers, "
    "dist.topology = \"ps\"),\n  ranks N*M .. N*M+S-1, started on node 0\n";

// `ration launch ... -- COMMAND...`: parsed by hand so that everything after `--` reaches the ranks as is.
int cmd_launch(int argc, char** argv) {
  ration::dist::LaunchOptions o;
  int i = 2;
  auto int_flag = [&](const std::string& flag, const std::string& text) {
    size_t pos = 0;
    int v = 0;
    try {
      v = std::stoi(text, &pos);
    } catch (const std::exception&) {
      pos = std::string::npos;
    }
    RATION_CHECK(pos == text.size(), "ration launch: ", flag, " needs an integer, got '", text, "'\n", kLaunchUsage);
    return v;
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      std::cout << kLaunchUsage;
      return 0;
    }
    if (a == "--oversubscribe") {
      o.oversubscribe = true;
      continue;
    }
    RATION_CHECK(i + 1 < argc, "ration launch: unknown or incomplete argument '", a, "'\n", kLaunchUsage);
    const std::string v = argv[++i];
    if (a == "-n" || a == "--nproc-per-node") o.nproc_per_node = int_flag(a, v);
    else if (a == "--servers") o.servers = int_flag(a, v);
    else if (a == "--master-addr") o.master_addr = v;
    else if (a == "--master-port") o.master_port = int_flag(a, v);
    else if (a == "--nnodes") o.nnodes = int_flag(a, v);
    else if (a == "--node-rank") o.node_rank = int_flag(a, v);
    else if (a == "--grace") o.grace_s = int_flag(a, v);
    else RATION_CHECK(false, "ration launch: unknown argument '", a, "'\n", kLaunchUsage);
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  return ration::dist::launch(o);
}

// The exit codes every command follows (README, "Exit codes"): 0 done; 1 a check failed (gradcheck over
// its tolerance; launch: a rank failed); 2 bad input or a refused request (command-line errors included);
// 3 a failure while running; 130 / 143 stopped by SIGINT / SIGTERM after saving.
constexpr int kExitBadInput = 2;

// Parses the command line; returns -1 to go on, else the exit code (0 after --help / --version). An
// unknown command or an option before the command is named as such, not as a missing subcommand, and
// every parse error exits kExitBadInput (CLI11's own codes are not ration's).
int parse_command_line(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  commands.emplace_back("launch");
  std::string list;
  for (size_t i = 0; i < commands.size(); ++i) list += (i ? (i + 1 == commands.size() ? " or " : ", ") : "") + commands[i];
  if (argc > 1) {
    const std::string first = argv[1];
    const bool option = !first.empty() && first[0] == '-';
    const bool known = std::find(commands.begin(), commands.end(), first) != commands.end();
    if (!known && !(option && (first == "-h" || first == "--help" || first == "--version"))) {
      std::fprintf(stderr, "error: %s '%s'; expected a command: %s (ration --help lists them)\n",
                   option ? "unknown option" : "unknown command", first.c_str(), list.c_str());
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitBadInput;
  }
  return -1;
}

}  // namespace

// `ration checkpoint merge DIR --out model.pt [--step N]`: the shards of a split model's run as one model.pt.
struct MergeCommand {
  std::string dir, out;
  int64_t step = -1;
  CLI::App* command = nullptr;
  void add_to(CLI::App& app) {
    auto* checkpoint = app.add_subcommand("checkpoint", "checkpoint tools");
    command = checkpoint->add_subcommand(
        "merge", "merge the per-shard checkpoints of a split model (parallel.tensor / parallel.pipeline) into one model.pt");
    command->add_option("dir", dir, "the run's train.checkpoint_dir (holding manifest.json)")->required()
        ->check(CLI::ExistingDirectory);
    command->add_option("--out", out, "the merged model.pt (torch.load gives a dict of name -> tensor)")->required();
    command->add_option("--step", step, "the step to merge (default: the newest step every shard has)")
        ->check(integer_at_least(0, "checkpoint step"));
    checkpoint->require_subcommand(1);
  }
  int run() const {
    const auto weights =
        ration::train::merge_checkpoint_shards(dir, step >= 0 ? std::optional<int64_t>(step) : std::nullopt);
    ration::train::write_model_file(out, weights);
    std::printf("merged %zu weights of %s into %s\n", weights.size(), dir.c_str(), out.c_str());
    return 0;
  }
};

// `ration train`. Before it prints anything: with more than one intra-op thread, a bounded OpenMP spin-wait
// (base/openmp.h; this may restart the process once).
int cmd_train(ration::train::TrainOptions& topt, const ration::cli::TrainViewFlags& view_flags, char** argv) {
  ration::Config threads_config = ration::train::load_config(topt.config_path, topt.overrides);
  ration::openmp::bound_spin_wait(argv, static_cast<int>(ration::train::read_threads(threads_config)));
  ration::cli::TrainViews views(view_flags, topt.config_path);
  if (views.active()) topt.observer = &views;
  const auto report = ration::train::run_training(topt);
  views.finish(report);
  if (topt.json && report["dist"]["rank"].get<int>() == 0) std::cout << report.dump(2) << "\n";
  return ration::train::exit_status(report);  // 130 / 143 on SIGINT / SIGTERM; 1 over the memory budget
}

int main(int argc, char** argv) {
  ration::blas::select_core(argv);  // may restart this process once with OpenBLAS's best kernels
  if (argc > 1 && std::string(argv[1]) == "launch") {
    try {
      return cmd_launch(argc, argv);
    } catch (const ration::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
  }
  ration::memory::install_counting_allocator();
  CLI::App app{"ration: train neural networks inside a memory budget"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ration ") + RATION_VERSION);
  app.footer("launch: ration launch -n N [...] -- train CONFIG.toml ... (ration launch --help)");

  ration::train::TrainOptions topt;
  int64_t steps = 0, epochs = 0;
  auto* train = app.add_subcommand("train", "train a model from a TOML config");
  train->add_option("config", topt.config_path, "CONFIG.toml")->required()->check(CLI::ExistingFile);
  train->add_option("--set", topt.overrides, "override a config key: section.key=value (repeatable)");
  train->add_option("--steps", steps, "number of optimiser steps (overrides train.steps/epochs)")
      ->check(integer_at_least(1, "number of optimiser steps"));
  train->add_option("--epochs", epochs, "number of epochs (overrides train.epochs)")
      ->check(integer_at_least(1, "number of epochs"));
  train->add_option("--report", topt.report_path, "write the JSON report here");
  train->add_option("--resume", topt.resume, "resume from a checkpoint dir (or a run dir: follows 'latest')");
  train->add_flag("--json", topt.json, "no progress output; print the JSON report to stdout");
  ration::cli::TrainViewFlags train_views;
  train_views.add_to(train);
  bool profile_ops = false;
  int64_t profile_steps = 5;
  train->add_flag("--profile-ops", profile_ops,
                  "time steps per op and per node, forward and backward (after the first step); prints the table "
                  "and adds \"op_profile\" to the report");
  train->add_option("--profile-steps", profile_steps, "steps --profile-ops averages over (default 5)")
      ->check(integer_at_least(1, "steps to profile"));

  std::string gc_config;
  std::vector<std::string> gc_overrides;
  double gc_tol = 1e-5;
  int64_t gc_batch = 0;
  bool gc_json = false;
  auto* gc = app.add_subcommand("gradcheck", "compare one step's gradients with libtorch autograd");
  gc->add_option("config", gc_config, "CONFIG.toml")->required()->check(CLI::ExistingFile);
  gc->add_option("--set", gc_overrides, "override a config key: section.key=value (repeatable)");
  gc->add_option("--tol", gc_tol, "maximum relative error per parameter (default 1e-5)")
      ->check(ration::cli::number_in(0, 1, "> 0 and <= 1", "relative error per parameter"));
  gc->add_option("--batch-size", gc_batch, "batch size for the check (default: train.batch_size)");
  gc->add_flag("--json", gc_json, "print JSON");

  BudgetFlags train_budget, gc_budget, plan_budget;
  train_budget.add_to(train);
  gc_budget.add_to(gc);
  OffloadFlags train_offload, gc_offload, plan_offload;
  train_offload.add_to(train);
  gc_offload.add_to(gc);

  std::string plan_config;
  std::vector<std::string> plan_overrides;
  int64_t plan_batch = 0;
  bool plan_json = false;
  auto* plan = app.add_subcommand("plan", "profile one step and print the keep/recompute plan for a memory budget");
  plan->add_option("config", plan_config, "CONFIG.toml")->required()->check(CLI::ExistingFile);
  plan->add_option("--set", plan_overrides, "override a config key: section.key=value (repeatable)");
  plan->add_option("--batch-size", plan_batch, "batch size (default: train.batch_size)");
  plan->add_flag("--json", plan_json, "print the plan as JSON");
  std::string plan_html;
  plan->add_option("--html", plan_html, "also write the memory picture (chart and sortable group table) to FILE.html");
  plan_budget.add_to(plan);
  plan_offload.add_to(plan);
  TraceFlags gc_trace, plan_trace;
  gc_trace.add_to(gc);
  plan_trace.add_to(plan);
  ration::cli::SequencePlanFlags plan_sequence;
  plan_sequence.add_to(plan);
  ration::cli::SequenceCommands sequence_commands;
  sequence_commands.add_to(app);

  auto ps_cmd = ration::cli::add_ps_command(app);

  MergeCommand merge;
  merge.add_to(app);

  if (const int rc = parse_command_line(app, argc, argv); rc >= 0) return rc;
  train_budget.apply(topt.overrides);
  gc_budget.apply(gc_overrides);
  plan_budget.apply(plan_overrides);
  train_offload.apply(topt.overrides);
  gc_offload.apply(gc_overrides);
  plan_offload.apply(plan_overrides);
  try {
    if (*train) {
      if (steps > 0) topt.steps = steps;
      if (profile_ops) topt.profile_ops = profile_steps;
      if (epochs > 0) topt.epochs = epochs;
      return cmd_train(topt, train_views, argv);
    }
    if (*gc) return with_trace(gc_trace, [&] { return cmd_gradcheck(gc_config, gc_overrides, gc_tol, gc_batch, gc_json); });
    if (*plan && plan_sequence.sequence)
      return ration::cli::cmd_plan_sequence(plan_config, plan_overrides, plan_sequence.seq_len, plan_batch, plan_json);
    if (const int rc = sequence_commands.run_selected(); rc >= 0) return rc;
    if (*plan)
      return with_trace(plan_trace, [&] { return cmd_plan(plan_config, plan_overrides, plan_batch, plan_json, plan_html); });
    if (*ps_cmd->ps) return ration::cli::run_ps_command(*ps_cmd);
    if (*merge.command) return merge.run();
  } catch (const ration::Error& e) {
    std::fprintf(stderr, "\nerror: %s\n", ration::describe_error(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nerror: %s\n", ration::describe_error(e).c_str());
    return 3;
  }
  return 0;
}
