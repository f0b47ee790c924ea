// main.cpp — the `ration` command line: train, gradcheck.
// Owns: argument parsing and exit codes (0 ok, 1 check failed, 2 user error). Work happens in train/.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "ration/core/check.h"
#include "ration/memory/allocator.h"
#include "ration/train/gradcheck.h"
#include "ration/train/trainer.h"

namespace {

int cmd_gradcheck(const std::string& config_path, const std::vector<std::string>& overrides, double tol,
                  int64_t batch_size, bool json) {
  using namespace ration;
  train::Setup setup = train::build_setup(train::load_config(config_path, overrides));
  // The training keys do not change a single step, but they are validated (and so not unknown).
  Config& c = setup.config;
  (void)train::read_run_settings(c);
  c.check_all_used();

  setup.model->train();
  const data::Batch batch = train::sample_batch(setup, batch_size > 0 ? batch_size : setup.batch_size, setup.seed);
  const GradcheckResult r = gradcheck(*setup.model, batch, setup.seed + 1, tol);
  if (json) {
    nlohmann::json j = {{"loss_ours", r.loss_ours}, {"loss_torch", r.loss_torch},
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

  CLI11_PARSE(app, argc, argv);
  try {
    if (*train) {
      if (steps > 0) topt.steps = steps;
      if (epochs > 0) topt.epochs = epochs;
      const auto report = ration::train::run_training(topt);
      if (topt.json) std::cout << report.dump(2) << "\n";
      return 0;
    }
    if (*gc) return cmd_gradcheck(gc_config, gc_overrides, gc_tol, gc_batch, gc_json);
  } catch (const ration::Error& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 3;
  }
  return 0;
}
