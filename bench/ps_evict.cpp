// bench_ps_evict — importance and disabling on the parameter-server store:
//   scoring: push cost per row with importance scoring on vs off (interleaved repetitions, CPU time);
//   rounds:  eviction round time vs table size, and accounted bytes + process RSS before/after a round
//            that disables half the rows;
//   auc:     the ctr model's eval AUC at table caps of 100/50/25/10% of the unconstrained table's bytes
//            for importance, frequency, lru and l2 — on synthetic drifting clicks and on MovieLens (same
//            data order, steps and seeds for every policy) — plus an SVG plot of AUC vs cap.
// Usage: bench_ps_evict [--merge A.json,B.json] [--quick] [--parts scoring,rounds,auc] [--datasets synthetic,movielens]
//                       [--movielens CSV] [--seeds N] [--grace STEPS] [--disabled-share F] [--importance-decay G]
//                       [--readmit-after N] [--headroom F]
//                       [--caps 1,0.5,...] [--policies importance,...]
//                       [--json OUT] [--svg OUT]
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ration/base/check.h"
#include "ration/data/ctr_synthetic.h"
#include "ration/models/ctr.h"
#include "ration/optim/adamw.h"
#include "ration/ps/evict.h"
#include "ration/ps/store.h"
#include "ration/runtime/step_runtime.h"
#include "ration/train/trainer.h"

using Clock = std::chrono::steady_clock;
using namespace ration;

namespace {

using bench::seconds_since;

int64_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

ps::TableOptions table_opts(int64_t dim) {
  ps::TableOptions o;
  o.name = "t";
  o.dim = dim;
  o.optimizer.kind = ps::OptimizerKind::Adagrad;
  return o;
}

// ---- scoring cost -------------------------------------------------------------------------------------
nlohmann::json bench_scoring(bool quick) {
  std::printf("\n== importance scoring cost per pushed row (adagrad, batches of 4096 rows, CPU time) ==\n");
  std::printf("%6s %14s %14s %12s\n", "dim", "off ns/row", "on ns/row", "extra ns/row");
  nlohmann::json out = nlohmann::json::array();
  for (int64_t dim : {16, 64}) {
    ps::Table off(table_opts(dim)), on(table_opts(dim));
    on.set_importance_decay(0.99f);
    const int64_t n = 4096, ids_space = 200000, batches = quick ? 50 : 300;
    std::mt19937_64 rng(1);
    std::vector<uint64_t> ids(static_cast<size_t>(n));
    std::vector<float> g(static_cast<size_t>(n * dim), 0.01f);
    for (ps::Table* t : {&off, &on}) {  // warm: every id exists
      std::vector<uint64_t> all(static_cast<size_t>(ids_space));
      std::iota(all.begin(), all.end(), 0);
      t->find_or_insert(all.data(), ids_space);
    }
    std::vector<double> t_off, t_on;
    for (int rep = 0; rep < 5; ++rep) {
      for (int which = 0; which < 2; ++which) {  // interleaved
        ps::Table& t = which == 0 ? off : on;
        double cpu = 0;
        for (int64_t b = 0; b < batches; ++b) {
          for (auto& id : ids) id = rng() % ids_space;
          const double c0 = bench::cpu_ms_now();
          t.push(ids.data(), n, g.data(), b);
          cpu += bench::cpu_ms_now() - c0;
        }
        (which == 0 ? t_off : t_on).push_back(cpu * 1e6 / static_cast<double>(batches * n));
      }
    }
    const double a = bench::median(t_off), b = bench::median(t_on);
    std::printf("%6lld %14.1f %14.1f %12.1f\n", static_cast<long long>(dim), a, b, b - a);
    out.push_back({{"dim", dim}, {"off_ns_per_row", a}, {"on_ns_per_row", b}, {"extra_ns_per_row", b - a}});
  }
  return out;
}

// ---- eviction rounds ----------------------------------------------------------------------------------
// The round's selection was a full sort of every scored row (O(n log n)); it is now nth_element (O(n)).
// Both are timed here on the same scored rows (interleaved, median of 3), next to the whole round.
struct SelectTimes {
  double sort_s = 0, nth_s = 0;
};
SelectTimes time_selection(ps::Table& t, int64_t step) {
  struct Scored {
    float score;
    uint8_t young;
    uint64_t id;
    ps::Table* table;
  };
  std::vector<ps::ScoredId> s;
  t.score_rows([&](const ps::RowInfo& info, const float*) { return t.importance_at(info, step); }, s);
  std::vector<Scored> base;
  for (const ps::ScoredId& x : s) base.push_back({x.score, 0, x.id, &t});
  const auto keep_first = [](const Scored& a, const Scored& b) {
    if (a.young != b.young) return a.young > b.young;
    return a.score != b.score ? a.score > b.score : a.id < b.id;
  };
  std::vector<double> sort_s, nth_s;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<Scored> a = base, b = base;
    auto t0 = Clock::now();
    std::sort(a.begin(), a.end(), keep_first);
    sort_s.push_back(seconds_since(t0));
    t0 = Clock::now();
    std::nth_element(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(b.size() / 2), b.end(), keep_first);
    nth_s.push_back(seconds_since(t0));
  }
  return {bench::median(sort_s), bench::median(nth_s)};
}

nlohmann::json bench_rounds(bool quick) {
  std::printf("\n== eviction round (importance, keep half) vs table size (dim 16, adagrad) ==\n");
  std::printf("%10s %10s %12s %12s %14s %14s %12s %12s\n", "rows", "round s", "select: sort", "select: nth",
              "accounted MiB", "after MiB", "RSS MiB", "after MiB");
  nlohmann::json out = nlohmann::json::array();
  std::vector<int64_t> sizes = quick ? std::vector<int64_t>{100000, 300000} : std::vector<int64_t>{100000, 300000, 1000000, 2000000};
  for (int64_t rows : sizes) {
    double seconds = 0;
    SelectTimes sel;
    int64_t b0 = 0, b1 = 0, r0 = 0, r1 = 0;
    {
      ps::EmbeddingStore store;
      ps::Table& t = store.ensure_table(table_opts(16));
      ps::EvictOptions o;
      o.policy = ps::EvictPolicy::Importance;
      o.keep_fraction = 0.5;
      ps::Evictor ev(store, o);
      std::vector<uint64_t> ids(static_cast<size_t>(rows));
      std::iota(ids.begin(), ids.end(), 1);
      std::vector<float> g(static_cast<size_t>(rows * 16));
      std::mt19937 rng(3);
      std::uniform_real_distribution<float> u(-1, 1);
      for (auto& x : g) x = u(rng);
      t.push(ids.data(), rows, g.data(), 1);
      std::vector<float>().swap(g);
      std::vector<uint64_t>().swap(ids);
      sel = time_selection(t, 2);
      b0 = store.stats().bytes;
      r0 = rss_bytes();
      const ps::EvictRound r = ev.run(2);
      seconds = r.seconds;
      b1 = store.stats().bytes;
      r1 = rss_bytes();
    }
    std::printf("%10lld %10.3f %12.3f %12.3f %14.1f %14.1f %12.1f %12.1f\n", static_cast<long long>(rows), seconds,
                sel.sort_s, sel.nth_s, b0 / 1048576.0, b1 / 1048576.0, r0 / 1048576.0, r1 / 1048576.0);
    out.push_back({{"rows", rows}, {"round_s", seconds}, {"select_sort_s", sel.sort_s}, {"select_nth_element_s", sel.nth_s},
                   {"accounted_before", b0}, {"accounted_after", b1}, {"rss_before", r0}, {"rss_after", r1}});
  }
  return out;
}

// ---- AUC vs cap ---------------------------------------------------------------------------------------
struct RunResult {
  double auc = 0, logloss = 0;
  int64_t bytes = 0, rows = 0, disabled = 0;
  int64_t round_bytes = 0;  // accounted bytes right after the last round (new rows grow it until the next)
};

// Trains the ctr model in data order (a stream: later samples drift) and evaluates on the later samples.
RunResult train_once(const std::string& toml, const ps::EvictOptions& evict, int64_t epochs) {
  train::Setup setup = train::build_setup(Config::from_string(toml, "bench_ps_evict"));
  auto* model = dynamic_cast<models::Ctr*>(setup.model.get());
  RATION_CHECK(model != nullptr, "bench_ps_evict: the config must build a ctr model");
  if (evict.active())
    for (int s = 0; s < model->client().num_shards(); ++s) model->client().embedded_shard(s).set_eviction(evict);
  optim::AdamWOptions ao;
  ao.lr = 0.003;
  ao.weight_decay = 0;
  optim::AdamW opt(model->named_parameters(), ao);
  // The trainer's step owner: the model's step hook pushes the embedding gradients after backward, with
  // the step number the eviction rounds are scheduled by (steps 1, 2, ...).
  train::StepRuntime runtime;
  train::StepOptions so;
  so.optimizer = &opt;
  const int64_t n = setup.train_set->size(), bs = setup.batch_size;
  int64_t step = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t b = 0; b + bs <= n; b += bs) {
      std::vector<int64_t> idx(static_cast<size_t>(bs));
      std::iota(idx.begin(), idx.end(), b);
      const data::Batch batch = setup.train_set->get(idx);
      so.step = ++step;
      runtime.run_step(*model, batch, so);
    }
  }
  RunResult r;
  std::vector<float> scores, labels;
  double loss = 0;
  const int64_t m = setup.eval_set->size();
  for (int64_t b = 0; b < m; b += 1000) {
    std::vector<int64_t> idx;
    for (int64_t i = b; i < std::min(m, b + 1000); ++i) idx.push_back(i);
    const models::EvalStats s = model->evaluate(setup.eval_set->get(idx));
    scores.insert(scores.end(), s.scores.begin(), s.scores.end());
    labels.insert(labels.end(), s.labels.begin(), s.labels.end());
    loss += s.loss_sum;
  }
  r.auc = data::roc_auc(scores, labels);
  r.logloss = loss / static_cast<double>(m);
  for (int s = 0; s < model->client().num_shards(); ++s) {
    const ps::StoreStats st = model->client().embedded_shard(s).store().stats();
    r.bytes += st.bytes;
    r.rows += st.rows;
    for (const auto& [name, tb] : st.tables) r.disabled += tb.disabled;
    if (ps::Evictor* ev = model->client().embedded_shard(s).evictor()) r.round_bytes += ev->last_round().bytes_after;
  }
  return r;
}

std::string synthetic_toml(uint64_t seed) {
  std::ostringstream s;
  s << "[model]\ntype='ctr'\nembedding_dim=8\nbottom=[16]\ntop=[32, 16]\nbag_mode='mean'\n"
    << "[data]\nkind='synthetic_ctr'\ncardinalities=[50000, 10000, 1000, 100]\nbag_min=[1, 1, 1, 1]\n"
    << "bag_max=[1, 3, 2, 1]\nnum_dense=4\ntrain_samples=40000\neval_samples=5000\nclick_rate=0.25\n"
    << "weight_scale=1.5\ndrift=0.5\nzipf_alpha=1.1\nseed=" << seed << "\n"
    << "[ps]\nshards=1\nlr=0.05\noptimizer='adagrad'\nprefetch=false\n[train]\nbatch_size=256\nthreads=1\nseed=" << seed << "\n";
  return s.str();
}

std::string movielens_toml(const std::string& csv, uint64_t seed) {
  std::ostringstream s;
  s << "[model]\ntype='ctr'\nembedding_dim=16\nbottom=[16]\ntop=[64, 32]\nbag_mode='mean'\n"
    << "[data]\nkind='movielens'\nfile='" << csv << "'\ntrain_fraction=0.8\n"
    << "[ps]\nshards=1\nlr=0.02\noptimizer='adagrad'\ninit_scale=0.01\nprefetch=false\n[train]\nbatch_size=512\nthreads=1\nseed=" << seed << "\n";
  return s.str();
}

const std::vector<std::string> kPolicies = {"importance", "frequency", "lru", "l2"};
const std::vector<double> kCaps = {1.0, 0.5, 0.25, 0.1};
// Settings every policy shares (--grace, --disabled-share, --importance-decay, --readmit-after,
// --headroom, --caps, --policies: for exploring; the
// recorded runs use the defaults of ps::EvictOptions and every cap and policy).
struct AucSettings {
  ps::EvictOptions shared;
  std::vector<double> caps = kCaps;
  std::vector<std::string> policies = kPolicies;
};
AucSettings g_auc;

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double sd_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

nlohmann::json bench_auc(const std::string& dataset, const std::function<std::string(uint64_t)>& toml, int64_t epochs,
                         int seeds, int64_t evict_every) {
  std::printf("\n== %s: eval AUC vs table cap (fraction of the unconstrained table's bytes), mean of %d seed(s) ==\n",
              dataset.c_str(), seeds);
  nlohmann::json out;
  std::map<std::string, std::map<double, std::vector<double>>> auc;
  std::vector<double> base;
  std::vector<int64_t> base_bytes;
  std::map<std::string, std::map<double, std::vector<double>>> bytes, round_bytes;
  for (int s = 0; s < seeds; ++s) {
    const std::string cfg = toml(static_cast<uint64_t>(s + 1));
    const RunResult full = train_once(cfg, ps::EvictOptions{}, epochs);
    std::printf("  seed %d unconstrained AUC %.4f  %.1f MiB\n", s + 1, full.auc, static_cast<double>(full.bytes) / 1048576.0);
    base.push_back(full.auc);
    base_bytes.push_back(full.bytes);
    for (double cap : g_auc.caps) {
      for (const std::string& p : g_auc.policies) {  // every policy at this cap, back to back
        ps::EvictOptions o = g_auc.shared;
        o.policy = ps::evict_policy_from_name(p, "bench");
        o.max_bytes = static_cast<int64_t>(cap * static_cast<double>(full.bytes));
        o.evict_every = evict_every;
        const RunResult r = train_once(cfg, o, epochs);
        std::printf("  seed %d cap %3.0f%% %-10s AUC %.4f  %.2f MiB at the end, %.2f MiB after the last round (cap %.2f)  %lld disabled\n",
                    s + 1, cap * 100, p.c_str(), r.auc, static_cast<double>(r.bytes) / 1048576.0,
                    static_cast<double>(r.round_bytes) / 1048576.0, static_cast<double>(o.max_bytes) / 1048576.0,
                    static_cast<long long>(r.disabled));
        auc[p][cap].push_back(r.auc);
        bytes[p][cap].push_back(static_cast<double>(r.bytes));
        round_bytes[p][cap].push_back(static_cast<double>(r.round_bytes));
      }
    }
  }
  const double base_auc = mean_of(base);
  std::printf("unconstrained: AUC %.4f +- %.4f (sd over seeds), table %.1f MiB\n", base_auc, sd_of(base),
              static_cast<double>(base_bytes[0]) / 1048576.0);
  std::printf("%-11s", "policy");
  for (double cap : g_auc.caps) std::printf("       cap %3.0f%%   ", cap * 100);
  std::printf("\n");
  for (const std::string& p : g_auc.policies) {
    std::printf("%-11s", p.c_str());
    for (double cap : g_auc.caps) std::printf("   %.4f +- %.4f", mean_of(auc[p][cap]), sd_of(auc[p][cap]));
    std::printf("\n");
    for (double cap : g_auc.caps)
      out["policies"][p].push_back({{"cap", cap}, {"auc", mean_of(auc[p][cap])}, {"auc_sd", sd_of(auc[p][cap])},
                                    {"auc_per_seed", auc[p][cap]}, {"final_bytes", mean_of(bytes[p][cap])},
                                    {"bytes_after_last_round", mean_of(round_bytes[p][cap])}});
  }
  // Paired differences (importance minus each baseline, per seed): the comparison without seed noise.
  if (std::find(g_auc.policies.begin(), g_auc.policies.end(), "importance") != g_auc.policies.end()) {
    std::printf("importance minus baseline, per seed paired (mean +- sd):\n");
    for (const std::string& p : g_auc.policies) {
      if (p == "importance") continue;
      std::printf("  vs %-10s", p.c_str());
      for (double cap : g_auc.caps) {
        std::vector<double> d;
        for (size_t i = 0; i < auc[p][cap].size(); ++i) d.push_back(auc["importance"][cap][i] - auc[p][cap][i]);
        std::printf("   %+.4f +- %.4f", mean_of(d), sd_of(d));
        out["paired_importance_minus"][p].push_back({{"cap", cap}, {"mean", mean_of(d)}, {"sd", sd_of(d)}});
      }
      std::printf("\n");
    }
  }
  out["unconstrained_auc_sd"] = sd_of(base);
  out["grace_steps"] = g_auc.shared.grace_steps;
  out["disabled_share"] = g_auc.shared.disabled_share;
  out["unconstrained_auc"] = base_auc;
  out["unconstrained_auc_per_seed"] = base;
  out["unconstrained_bytes"] = base_bytes;
  out["seeds"] = seeds;
  out["epochs"] = epochs;
  out["evict_every"] = evict_every;
  return out;
}

// AUC vs cap, one panel per dataset.
void write_svg(const std::string& path, const nlohmann::json& results) {
  const std::map<std::string, std::string> color = {
      {"importance", "#d62728"}, {"frequency", "#1f77b4"}, {"lru", "#2ca02c"}, {"l2", "#9467bd"}};
  std::ostringstream s;
  const int pw = 420, ph = 300, ml = 60, mt = 40, mb = 50;
  int panels = 0;
  for (auto it = results.begin(); it != results.end(); ++it) ++panels;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << pw * panels + 20 << "' height='" << ph + 40
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  int k = 0;
  for (auto it = results.begin(); it != results.end(); ++it, ++k) {
    const nlohmann::json& d = it.value();
    double lo = d["unconstrained_auc"].get<double>(), hi = lo;
    for (const std::string& p : kPolicies)
      if (d["policies"].contains(p))
        for (const auto& e : d["policies"][p]) {
          const double sd = e.value("auc_sd", 0.0);
          lo = std::min(lo, e["auc"].get<double>() - sd);
          hi = std::max(hi, e["auc"].get<double>() + sd);
        }
    lo -= 0.005;
    hi += 0.005;
    const int x0 = k * pw + ml, x1 = k * pw + pw - 20, y0 = mt, y1 = ph - mb + mt - 20;
    auto X = [&](double cap) { return x0 + (x1 - x0) * (std::log10(cap) + 1.0) / 1.0; };  // 10%..100%, log
    auto Y = [&](double a) { return y1 - (y1 - y0) * (a - lo) / (hi - lo); };
    s << "<text x='" << (x0 + x1) / 2 << "' y='20' text-anchor='middle' font-weight='bold'>" << it.key() << "</text>\n";
    s << "<line x1='" << x0 << "' y1='" << y1 << "' x2='" << x1 << "' y2='" << y1 << "' stroke='black'/>\n";
    s << "<line x1='" << x0 << "' y1='" << y0 << "' x2='" << x0 << "' y2='" << y1 << "' stroke='black'/>\n";
    for (double cap : kCaps)
      s << "<text x='" << X(cap) << "' y='" << y1 + 16 << "' text-anchor='middle'>" << cap * 100 << "%</text>\n";
    s << "<text x='" << (x0 + x1) / 2 << "' y='" << y1 + 34 << "' text-anchor='middle'>table cap (of unconstrained bytes, log)</text>\n";
    for (int t = 0; t <= 4; ++t) {
      const double a = lo + (hi - lo) * t / 4;
      s << "<text x='" << x0 - 6 << "' y='" << Y(a) + 4 << "' text-anchor='end'>" << std::round(a * 1000) / 1000 << "</text>\n";
    }
    s << "<line x1='" << x0 << "' y1='" << Y(d["unconstrained_auc"].get<double>()) << "' x2='" << x1 << "' y2='"
      << Y(d["unconstrained_auc"].get<double>()) << "' stroke='gray' stroke-dasharray='4,3'/>\n";
    int li = 0;
    for (const std::string& p : kPolicies) {
      if (!d["policies"].contains(p)) continue;
      // Error bars: +- one standard deviation over seeds (slightly offset per policy to stay visible).
      for (const auto& e : d["policies"][p]) {
        const double sd = e.value("auc_sd", 0.0), x = X(e["cap"].get<double>()) + (li - 1.5) * 3;
        if (sd > 0)
          s << "<line x1='" << x << "' y1='" << Y(e["auc"].get<double>() - sd) << "' x2='" << x << "' y2='"
            << Y(e["auc"].get<double>() + sd) << "' stroke='" << color.at(p) << "' stroke-opacity='0.6'/>\n";
      }
      s << "<polyline fill='none' stroke='" << color.at(p) << "' stroke-width='2' points='";
      for (const auto& e : d["policies"][p]) s << X(e["cap"].get<double>()) << "," << Y(e["auc"].get<double>()) << " ";
      s << "'/>\n";
      for (const auto& e : d["policies"][p])
        s << "<circle cx='" << X(e["cap"].get<double>()) << "' cy='" << Y(e["auc"].get<double>()) << "' r='3' fill='"
          << color.at(p) << "'/>\n";
      s << "<text x='" << x1 - 90 << "' y='" << y1 - 70 + 14 * li << "' fill='" << color.at(p) << "'>" << p << "</text>\n";
      ++li;
    }
    s << "<text x='" << x1 - 90 << "' y='" << y1 - 70 + 14 * li << "' fill='gray'>unconstrained</text>\n";
  }
  s << "</svg>\n";
  std::ofstream(path) << s.str();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string parts = "scoring,rounds,auc", json_path = "bench/results/ps_evict.json", svg_path = "bench/results/ps_evict_auc.svg";
  std::string movielens = "data/movielens.csv";
  int seeds = 1;
  std::string datasets = "synthetic,movielens";
  std::string merge;  // "A.json,B.json": combine the auc results of separate runs into one JSON and plot
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      RATION_CHECK(i + 1 < argc, "bench_ps_evict: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--quick") quick = true;
    else if (a == "--parts") parts = next();
    else if (a == "--json") json_path = next();
    else if (a == "--svg") svg_path = next();
    else if (a == "--movielens") movielens = next();
    else if (a == "--seeds") seeds = std::stoi(next());
    else if (a == "--datasets") datasets = next();
    else if (a == "--merge") merge = next();
    else if (a == "--grace") g_auc.shared.grace_steps = std::stoll(next());
    else if (a == "--disabled-share") g_auc.shared.disabled_share = std::stod(next());
    else if (a == "--importance-decay") g_auc.shared.importance_decay = std::stod(next());
    else if (a == "--readmit-after") g_auc.shared.readmit_after = std::stoll(next());
    else if (a == "--headroom") g_auc.shared.headroom = std::stod(next());
    else if (a == "--caps" || a == "--policies") {
      if (a == "--caps") g_auc.caps = bench::numbers<double>(next());
      else g_auc.policies = bench::split(next(), ',');
    }
    else RATION_CHECK(false, "bench_ps_evict: unknown argument '", a, "'; valid: --quick --parts --json --svg --movielens --seeds --datasets --merge --grace --disabled-share --importance-decay --readmit-after --headroom --caps --policies");
  }
  if (!merge.empty()) {
    nlohmann::json out, curves;
    for (const std::string& f : bench::split(merge, ',')) {
      std::ifstream in(f);
      RATION_CHECK(in.good(), "bench_ps_evict --merge: cannot read '", f, "'");
      nlohmann::json j = nlohmann::json::parse(in);
      for (auto it = j["auc"].begin(); it != j["auc"].end(); ++it) curves[it.key()] = it.value();
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it.key() != "auc") out[it.key()] = it.value();
    }
    out["auc"] = curves;
    write_svg(svg_path, curves);
    bench::write_json(json_path, out);
    std::printf("merged into %s and %s\n", json_path.c_str(), svg_path.c_str());
    return 0;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when the output is a file
  std::printf("bench_ps_evict (machine shared with other jobs: timings are noisy)\n");
  nlohmann::json out;
  if (parts.find("scoring") != std::string::npos) out["scoring"] = bench_scoring(quick);
  if (parts.find("rounds") != std::string::npos) out["rounds"] = bench_rounds(quick);
  if (parts.find("auc") != std::string::npos) {
    nlohmann::json curves;
    if (datasets.find("synthetic") != std::string::npos)
      curves["synthetic drifting clicks"] = bench_auc("synthetic drifting clicks", synthetic_toml, 1, quick ? 1 : seeds, 10);
    if (datasets.find("movielens") == std::string::npos) {
    } else if (std::ifstream(movielens).good()) {
      curves["MovieLens (dslabs)"] =
          bench_auc("MovieLens (dslabs)", [&](uint64_t s) { return movielens_toml(movielens, s); }, 1, quick ? 1 : seeds, 10);
    } else {
      std::printf("\n(MovieLens skipped: %s not found; create it with scripts/movielens.sh)\n", movielens.c_str());
    }
    out["auc"] = curves;
    write_svg(svg_path, curves);
    std::printf("\nplot: %s\n", svg_path.c_str());
  }
  bench::write_json(json_path, out);
  std::printf("json: %s\n", json_path.c_str());
  return 0;
}
