// main.cpp — the `ration` command line: train, gradcheck, plan.
// Owns: argument parsing and exit codes (0 ok, 1 check failed, 2 user error). Work happens in train/.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "ps_command.h"
#include "ration/core/check.h"
#include "ration/memory/allocator.h"
#include "ration/memory/budget_policy.h"
#include "ration/memory/offload.h"
#include "ration/train/budget.h"
#include "ration/train/gradcheck.h"
#include "ration/train/trainer.h"

namespace {

// Budget flags are config keys ([memory] section) set from the command line.
struct BudgetFlags {
  std::string budget, plan, keep_bytes;
  int64_t keep_groups = -1;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--memory-budget", budget, "whole device-memory budget, e.g. 512MiB, 2GiB, 1.5G (memory.budget)");
    cmd->add_option("--plan", plan, "planner strategy: knapsack (default), ordered, ordered-sets, uniform, sqrt, optimal-chain (memory.plan)");
    cmd->add_option("--keep-groups", keep_groups, "keep at most N saved groups (may only lower the plan's figure)");
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
    cmd->add_option("--offload-t1", t1, "copy out when device usage exceeds SIZE (offload.t1, default 0)");
    cmd->add_option("--offload-t2", t2, "pause forward while usage exceeds SIZE and copies are in flight (offload.t2)");
    cmd->add_option("--offload-t3", t3, "hold prefetches while usage would exceed SIZE (offload.t3)");
    cmd->add_option("--offload-min-bytes", min_bytes, "keep saved values smaller than SIZE (offload.min_bytes, 64KiB)");
    cmd->add_option("--offload-dir", dir, "spill directory (offload.dir, default $TMPDIR or /tmp)");
    cmd->add_option("--offload-prefetch", prefetch, "fetch back N backward nodes ahead (offload.prefetch, default 2)");
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

// Profile one step of the configured model on its first training batch and plan for the budget.
struct Planned {
  ration::train::Setup setup;
  ration::data::Batch batch;
  ration::memory::StepProfile profile;
  ration::memory::Plan plan;
  std::unique_ptr<ration::memory::OffloadEngine> engine;  // set when the plan may offload
};
Planned plan_for(ration::train::Setup setup, int64_t batch_size) {
  using namespace ration;
  const train::BudgetSettings budget = train::read_budget_settings(setup.config);
  const train::RunSettings run = train::read_run_settings(setup.config);
  const train::OffloadSettings offload = train::read_offload_settings(setup.config);
  setup.config.check_all_used();
  RATION_CHECK(budget.budget_bytes.has_value(), "a memory budget is needed: --memory-budget SIZE (or memory.budget)");
  setup.model->train();
  Planned p{std::move(setup), {}, {}, {}, nullptr};
  p.batch = train::sample_batch(p.setup, batch_size > 0 ? batch_size : p.setup.batch_size, p.setup.seed);
  p.profile = train::profile_step(*p.setup.model, p.batch, p.setup.seed + 1);
  memory::PlanOptions po = budget.plan;
  po.extra_fixed_bytes = train::unseen_optimizer_bytes(run.optimizer, run.momentum, run.amsgrad, *p.setup.model);
  if (offload.enabled) {
    p.engine = std::make_unique<memory::OffloadEngine>(offload.options);
    po.offload = memory::measure_offload_costs(p.engine->tier(), offload.options);
  }
  p.plan = memory::make_plan(p.profile, po);
  return p;
}

int cmd_plan(const std::string& config_path, const std::vector<std::string>& overrides, int64_t batch_size, bool json) {
  using namespace ration;
  Planned p = plan_for(train::build_setup(train::load_config(config_path, overrides)), batch_size);
  if (json) std::cout << p.plan.to_json().dump(2) << "\n";
  else std::cout << p.plan.to_table();
  return 0;
}

int cmd_gradcheck(const std::string& config_path, const std::vector<std::string>& overrides, double tol,
                  int64_t batch_size, bool json) {
  using namespace ration;
  train::Setup setup = train::build_setup(train::load_config(config_path, overrides));
  // The training keys do not change a single step, but they are validated (and so not unknown).
  Config& c = setup.config;
  (void)train::read_run_settings(c);
  const bool budgeted = c.has("memory.budget");
  train::OffloadSettings offload;
  if (!budgeted) {
    (void)train::read_budget_settings(c);
    offload = train::read_offload_settings(c);
    c.check_all_used();
  }
  setup.model->train();
  std::optional<Planned> planned;
  data::Batch batch;
  if (budgeted) {
    planned.emplace(plan_for(std::move(setup), batch_size));
    batch = planned->batch;
  } else {
    batch = train::sample_batch(setup, batch_size > 0 ? batch_size : setup.batch_size, setup.seed);
  }
  models::Model& model = budgeted ? *planned->setup.model : *setup.model;
  const uint64_t seed = (budgeted ? planned->setup.seed : setup.seed) + 1;
  // With a budget or offload: our gradients are computed under the memory policy (dropped values
  // recomputed, offloaded values fetched back) and must also equal the plain engine's bit for bit.
  std::unique_ptr<memory::OffloadEngine> engine;
  std::unique_ptr<memory::BudgetPolicy> budget_policy;
  std::unique_ptr<MemoryPolicy> policy_owner;
  MemoryPolicy* policy = nullptr;
  if (budgeted) {
    budget_policy = std::make_unique<memory::BudgetPolicy>(planned->plan, planned->profile, planned->engine.get());
    policy = budget_policy.get();
  } else if (offload.enabled) {
    engine = std::make_unique<memory::OffloadEngine>(offload.options);
    policy_owner = std::make_unique<memory::OffloadPolicy>(*engine);
    policy = policy_owner.get();
  }
  memory::OffloadEngine* active_engine = budgeted ? planned->engine.get() : engine.get();
  int64_t not_bitwise = 0;
  if (policy) {
    const auto plain = engine_gradients(model, batch, seed);
    std::vector<std::pair<std::string, at::Tensor>> policy_grads;
    {
      PolicyScope scope(policy);
      if (budget_policy) budget_policy->begin_step();
      policy_grads = engine_gradients(model, batch, seed);
    }
    for (size_t i = 0; i < plain.size(); ++i) not_bitwise += at::equal(plain[i].second, policy_grads[i].second) ? 0 : 1;
    if (!json) {
      if (budgeted) std::cout << planned->plan.to_table();
      if (budget_policy)
        std::printf("budgeted step: %lld values dropped, %lld producers re-run (%.2f ms), %lld offloaded\n",
                    static_cast<long long>(budget_policy->dropped_values()),
                    static_cast<long long>(budget_policy->recomputed_nodes()), budget_policy->recompute_ms(),
                    static_cast<long long>(budget_policy->offloaded_values()));
      if (active_engine) {
        const memory::OffloadStats st = active_engine->stats();
        std::printf("offload (%s): %lld values in %lld buffers, %s written, %s read back, %lld prefetched, "
                    "%lld on demand, %lld fell back to recompute\n",
                    active_engine->tier().name().c_str(), static_cast<long long>(st.offloaded_values),
                    static_cast<long long>(st.offloaded_storages), memory::format_bytes(st.written_bytes).c_str(),
                    memory::format_bytes(st.read_bytes).c_str(), static_cast<long long>(st.prefetches),
                    static_cast<long long>(st.demand_fetches), static_cast<long long>(st.fallbacks));
      }
      std::printf("gradients bitwise equal to the plain engine: %s (%lld of %zu differ)\n",
                  not_bitwise == 0 ? "yes" : "NO", static_cast<long long>(not_bitwise), plain.size());
    }
  }
  GradcheckResult r;
  {
    PolicyScope scope(policy);
    if (budget_policy) budget_policy->begin_step();
    r = gradcheck(model, batch, seed, tol);
  }
  r.passed = r.passed && not_bitwise == 0;
  if (json) {
    nlohmann::json j = {{"loss_ours", r.loss_ours}, {"loss_torch", r.loss_torch}, {"memory_budget", budgeted},
                        {"offload", active_engine != nullptr},
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

}  // namespace

int main(int argc, char** argv) {
  ration::memory::install_counting_allocator();
  CLI::App app{"ration: train neural networks inside a memory budget"};
  app.require_subcommand(1);

  ration::train::TrainOptions topt;
  int64_t steps = 0, epochs = 0;
  auto* train = app.add_subcommand("train", "train a model from a TOML config");
  train->add_option("config", topt.config_path, "CONFIG.toml")->required()->check(CLI::ExistingFile);
  train->add_option("--set", topt.overrides, "override a config key: section.key=value (repeatable)");
  train->add_option("--steps", steps, "number of optimiser steps (overrides train.steps/epochs)")->check(CLI::PositiveNumber);
  train->add_option("--epochs", epochs, "number of epochs (overrides train.epochs)")->check(CLI::PositiveNumber);
  train->add_option("--report", topt.report_path, "write the JSON report here");
  train->add_option("--resume", topt.resume, "resume from a checkpoint dir (or a run dir: follows 'latest')");
  train->add_flag("--json", topt.json, "no progress output; print the JSON report to stdout");

  std::string gc_config;
  std::vector<std::string> gc_overrides;
  double gc_tol = 1e-5;
  int64_t gc_batch = 0;
  bool gc_json = false;
  auto* gc = app.add_subcommand("gradcheck", "compare one step's gradients with libtorch autograd");
  gc->add_option("config", gc_config, "CONFIG.toml")->required()->check(CLI::ExistingFile);
  gc->add_option("--set", gc_overrides, "override a config key: section.key=value (repeatable)");
  gc->add_option("--tol", gc_tol, "maximum relative error per parameter (default 1e-5)");
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
  plan_budget.add_to(plan);
  plan_offload.add_to(plan);

  auto ps_cmd = ration::cli::add_ps_command(app);

  CLI11_PARSE(app, argc, argv);
  train_budget.apply(topt.overrides);
  gc_budget.apply(gc_overrides);
  plan_budget.apply(plan_overrides);
  train_offload.apply(topt.overrides);
  gc_offload.apply(gc_overrides);
  plan_offload.apply(plan_overrides);
  try {
    if (*train) {
      if (steps > 0) topt.steps = steps;
      if (epochs > 0) topt.epochs = epochs;
      const auto report = ration::train::run_training(topt);
      if (topt.json) std::cout << report.dump(2) << "\n";
      return 0;
    }
    if (*gc) return cmd_gradcheck(gc_config, gc_overrides, gc_tol, gc_batch, gc_json);
    if (*plan) return cmd_plan(plan_config, plan_overrides, plan_batch, plan_json);
    if (*ps_cmd->ps) return ration::cli::run_ps_command(*ps_cmd);
  } catch (const ration::Error& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 3;
  }
  return 0;
}
