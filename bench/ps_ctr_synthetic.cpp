// bench_ps_ctr_synthetic — how close the ctr model gets to the planted model on synthetic clicks.
// Each variant trains configs/ctr.toml (plus the variant's settings) and reports its eval AUC next to
// three references on the same evaluation samples: the planted model itself (every true weight), and the
// planted model knowing only the weights of the ids that occur in the training split at least once /
// at least 5 times (every other id at 0, the weights' mean) — the most a learner of this training data
// could know (an id seen once gives one noisy label, so the second is the more realistic ceiling).
// Variants run whole epochs, so "seen in the training split" is what the run saw.
// Usage: bench_ps_ctr_synthetic [--config configs/ctr.toml] [--json OUT] [--set key=value ...]
//   With --set: one run with those settings (added to every variant's); --only NAME: one built-in variant.
#include <absl/container/flat_hash_map.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/data/ctr_data.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/train/trainer.h"

namespace {

struct Variant {
  std::string name;
  std::vector<std::string> settings;
};

// The planted model's AUC on `eval` knowing the weights of ids seen >= min_count times in `train`.
double knowing_auc(const ration::data::CtrSynthetic& train, const ration::data::CtrSynthetic& eval,
                   const std::vector<absl::flat_hash_map<int64_t, int64_t>>& counts, int64_t min_count) {
  std::vector<float> scores, labels;
  std::vector<int64_t> all(static_cast<size_t>(eval.size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  const ration::data::Batch b = eval.get(all);
  const int64_t* y = b.target.tensor().data_ptr<int64_t>();
  for (int64_t i = 0; i < eval.size(); ++i) {
    scores.push_back(static_cast<float>(eval.planted_probability_knowing(i, [&](int64_t f, int64_t id) {
      auto it = counts[static_cast<size_t>(f)].find(id);
      return it != counts[static_cast<size_t>(f)].end() && it->second >= min_count;
    })));
    labels.push_back(static_cast<float>(y[i]));
  }
  (void)train;
  return ration::data::roc_auc(scores, labels);
}

}  // namespace

int main(int argc, char** argv) {
  std::string config = "configs/ctr.toml", out = "bench/results/ps_ctr_synthetic.json", only;
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a == "--json" && i + 1 < argc) out = argv[++i];
    else if (a == "--set" && i + 1 < argc) extra.push_back(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
  }
  std::vector<Variant> variants = {
      {"1 epoch", {"train.steps=0", "train.epochs=1", "train.eval_every=0"}},
      {"2 epochs", {"train.steps=0", "train.epochs=2", "train.eval_every=0"}},
  };
  if (!extra.empty()) variants = {{"--set", {}}};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-32s %8s %8s %14s %14s %10s\n", "variant", "ctr AUC", "planted", "knowing >=1", "knowing >=5",
              "logloss");
  for (const Variant& v : variants) {
    if (!only.empty() && v.name.rfind(only, 0) != 0) continue;
    std::vector<std::string> settings = v.settings;
    settings.insert(settings.end(), extra.begin(), extra.end());
    // The references: the same datasets the run trains on.
    ration::Config cfg = ration::train::load_config(config, settings);
    const ration::data::CtrSets sets = ration::data::make_ctr_datasets(cfg, "synthetic_ctr");
    const auto& train = dynamic_cast<const ration::data::CtrSynthetic&>(*sets.train);
    const auto& eval = dynamic_cast<const ration::data::CtrSynthetic&>(*sets.eval);
    std::vector<absl::flat_hash_map<int64_t, int64_t>> counts(static_cast<size_t>(train.num_fields()));
    for (int64_t i = 0; i < train.size(); ++i)
      for (int64_t f = 0; f < train.num_fields(); ++f)
        for (int64_t id : train.ids_of(i, f)) ++counts[static_cast<size_t>(f)][id];
    const double seen1 = knowing_auc(train, eval, counts, 1);
    const double seen5 = knowing_auc(train, eval, counts, 5);

    ration::train::TrainOptions t;
    t.config_path = config;
    t.json = true;
    t.overrides = settings;
    t.overrides.push_back("train.checkpoint_dir=");
    const auto r = ration::train::run_training(t);
    const auto& last = r["eval"].back();
    const double auc = last["auc"].get<double>();
    std::printf("%-32s %8.4f %8.4f %14.4f %14.4f %10.4f\n", v.name.c_str(), auc, *sets.planted_auc, seen1, seen5,
                last["logloss"].get<double>());
    std::fflush(stdout);
    rows.push_back({{"variant", v.name}, {"settings", settings}, {"auc", auc}, {"planted_auc", *sets.planted_auc},
                    {"planted_knowing_seen_auc", seen1}, {"planted_knowing_seen5_auc", seen5},
                    {"logloss", last["logloss"]}, {"eval", r["eval"]}, {"steps", r["steps"]}, {"ps", r["ps"]}});
  }
  ration::bench::write_json(out, {{"bench", "ps_ctr_synthetic"}, {"config", config}, {"runs", rows}});
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
