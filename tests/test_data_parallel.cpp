// test_data_parallel.cpp — the single-process parts of data parallelism: the 1-bit code and its error
// bound (random and real gradients), exact byte counts, loader shards (shuffle and bootstrap), gradient
// accumulation over dist.sync_every micro-batches, bucket layout, and the config fingerprint.
// The multi-process parts (c10d, `ration train` at N ranks) are in tests/distributed/dp_worker.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "ration/data/dataset.h"
#include "ration/distributed/comm_hook.h"
#include "ration/distributed/data_parallel.h"
#include "ration/distributed/reducer.h"
#include "ration/ops/ops.h"
#include "ration/optim/adamw.h"
#include "ration/train/trainer.h"

namespace ration::dist {
namespace {

// The [dist] settings of a run.toml holding `dist` (TOML lines of the [dist] table), and the error
// message they raise ("no error" when they are accepted).
DataParallelSettings dist_settings(const std::string& dist) {
  Config cfg = Config::from_string("[dist]\n" + dist, "run.toml");
  return read_data_parallel_settings(cfg);
}
std::string dist_settings_error(const std::string& dist) {
  try {
    (void)dist_settings(dist);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// ||v - C(v)|| must equal sqrt(1 - lambda^2) ||v|| and stay below sqrt(1 - 1/d) ||v||.
void expect_bound(const at::Tensor& v, const std::string& what) {
  const OneBitCode code = onebit_encode(v);
  const at::Tensor decoded = onebit_decode(code);
  const int64_t d = v.numel();
  const double norm = v.norm().item<double>();
  const double err = (v.to(at::kDouble) - decoded.to(at::kDouble)).norm().item<double>();
  ASSERT_EQ(code.lambda.size(), 1u);
  const double lambda = code.lambda[0];
  EXPECT_GE(lambda, 1.0 / std::sqrt(static_cast<double>(d)) - 1e-6) << what;
  EXPECT_LE(lambda, 1.0 + 1e-6) << what;
  EXPECT_NEAR(err, std::sqrt(std::max(0.0, 1 - lambda * lambda)) * norm, 1e-3 * norm + 1e-6) << what;
  EXPECT_LE(err, std::sqrt(1.0 - 1.0 / static_cast<double>(d)) * norm * (1 + 1e-5) + 1e-12) << what;
  // The scale is L2-based: alpha = lambda ||v|| / sqrt(d), which is ||v||_1 / d.
  EXPECT_NEAR(code.alpha[0], lambda * norm / std::sqrt(static_cast<double>(d)), 1e-5 * std::abs(code.alpha[0]) + 1e-12)
      << what;
}

// The per-segment code's error is sqrt(sum_j (1 - lambda_j^2) ||v_j||^2) exactly; returns that (+ slack).
double expect_segmented_bound_is_tighter(const at::Tensor& v, const OneBitCode& code) {
  double sum = 0;
  int64_t offset = 0;
  for (size_t j = 0; j < code.segments.size(); ++j) {
    const double nj = v.narrow(0, offset, code.segments[j]).to(at::kDouble).norm().item<double>();
    sum += (1 - static_cast<double>(code.lambda[j]) * code.lambda[j]) * nj * nj;
    offset += code.segments[j];
  }
  return std::sqrt(std::max(sum, 0.0)) * (1 + 1e-4) + 1e-9;
}

TEST(OneBitCode, ErrorBoundOnRandomVectors) {
  at::manual_seed(5);
  for (int64_t d : {1, 7, 8, 9, 100, 1001, 65536}) {
    expect_bound(at::randn({d}), "normal d=" + std::to_string(d));
    expect_bound(at::randn({d}).pow(3), "heavy-tailed d=" + std::to_string(d));
    at::Tensor sparse = at::zeros({d});
    sparse[d / 2] = 3.0;
    expect_bound(sparse, "one-hot d=" + std::to_string(d));
    expect_bound(at::full({d}, -0.25f), "constant d=" + std::to_string(d));
  }
  // The worst case is attained: a one-hot vector has lambda = 1/sqrt(d).
  at::Tensor one_hot = at::zeros({100});
  one_hot[3] = 1.0;
  EXPECT_NEAR(onebit_encode(one_hot).lambda[0], 0.1, 1e-6);
  // A zero bucket is sent as zeros.
  EXPECT_TRUE(at::equal(onebit_decode(onebit_encode(at::zeros({13}))), at::zeros({13})));
}

TEST(OneBitCode, ErrorBoundOnRealGradientsAndThirtyTimesFewerBytes) {
  train::Setup setup = train::build_setup(
      train::load_config(std::string(RATION_SOURCE_DIR) + "/configs/gpt.toml",
                         {"train.threads=1", "model.n_layer=2", "model.n_embd=64", "model.block_size=32"}));
  auto params = setup.model->named_parameters();
  setup.model->loss(train::sample_batch(setup, 8, 1)).backward();
  // The buckets of the reducer's layout (first 1 MiB, then 25 MiB), and every parameter alone.
  Reducer reducer(World::init_single(), params, std::make_unique<AllReduceHook>(), {});
  int64_t none_bytes = 0, onebit_bytes = 0;
  for (const auto& layout : reducer.buckets()) {
    std::vector<at::Tensor> parts;
    for (const auto& name : layout.names) {
      for (const auto& [n, p] : params)
        if (n == name) parts.push_back(p.grad().reshape({-1}));
    }
    const at::Tensor v = at::cat(parts);
    expect_bound(v, "gpt bucket of " + std::to_string(layout.numel) + " as one segment");
    // The hook's code: one scale per parameter; the bucket's error is within sqrt(1 - min lambda_j^2) ||v||.
    const OneBitCode code = onebit_encode(v, layout.numels);
    ASSERT_EQ(code.lambda.size(), layout.numels.size());
    const double min_lambda = *std::min_element(code.lambda.begin(), code.lambda.end());
    const double err = (v.to(at::kDouble) - onebit_decode(code).to(at::kDouble)).norm().item<double>();
    EXPECT_LE(err, std::sqrt(1 - min_lambda * min_lambda) * v.norm().item<double>() * (1 + 1e-5));
    EXPECT_LE(err, expect_segmented_bound_is_tighter(v, code));
    none_bytes += 4 * layout.numel;
    onebit_bytes += onebit_wire_bytes(layout.numel, static_cast<int64_t>(layout.numels.size()));
  }
  for (const auto& [name, p] : params) expect_bound(p.grad().reshape({-1}), name);
  EXPECT_EQ(none_bytes, 4 * setup.model->num_parameters());
  EXPECT_GE(static_cast<double>(none_bytes) / static_cast<double>(onebit_bytes), 30.0);
  // Pack / unpack is lossless.
  const OneBitCode code = onebit_encode(params[0].second.grad().reshape({-1}));
  const OneBitCode back = onebit_unpack(onebit_pack(code), code.segments);
  EXPECT_EQ(back.alpha, code.alpha);
  EXPECT_TRUE(at::equal(back.bits, code.bits));
}

// The hook's default code: every parameter in blocks of dist.onebit_block = 1024 elements, one scale each.
// A finer partition with the optimal scale per part never codes worse (the coarse scale restricted to a
// block is one of the scales the block could choose), and 4 bytes per 1024 elements keep >= 30x.
TEST(OneBitCode, BlocksOfTheDefaultSizeCodeNoWorseAndKeepThirtyTimesFewerBytes) {
  train::Setup setup = train::build_setup(
      train::load_config(std::string(RATION_SOURCE_DIR) + "/configs/gpt.toml", {"train.threads=1"}));
  auto params = setup.model->named_parameters();
  setup.model->loss(train::sample_batch(setup, 4, 1)).backward();
  Reducer reducer(World::init_single(), params, std::make_unique<AllReduceHook>(), {});
  OneBitHook hook(OneBitOptions{});
  ASSERT_EQ(hook.options().block, 1024);
  std::vector<std::vector<int64_t>> per_param;
  for (const auto& layout : reducer.buckets()) per_param.push_back(layout.numels);
  hook.init(per_param);
  int64_t none_bytes = 0, onebit_bytes = 0;
  size_t more_segments = 0;
  for (size_t b = 0; b < reducer.buckets().size(); ++b) {
    const auto& layout = reducer.buckets()[b];
    std::vector<at::Tensor> parts;
    for (const auto& name : layout.names) {
      for (const auto& [n, p] : params)
        if (n == name) parts.push_back(p.grad().reshape({-1}));
    }
    const at::Tensor v = at::cat(parts).to(at::kDouble).to(at::kFloat);
    const std::vector<int64_t>& blocks = hook.code_segments()[b];
    for (int64_t n : blocks) EXPECT_LE(n, 1024);
    more_segments += blocks.size() - layout.numels.size();
    auto error_of = [&](const std::vector<int64_t>& segs) {
      return (v.to(at::kDouble) - onebit_decode(onebit_encode(v, segs)).to(at::kDouble)).norm().item<double>();
    };
    EXPECT_LE(error_of(blocks), error_of(layout.numels) * (1 + 1e-6)) << "bucket " << b;
    none_bytes += 4 * layout.numel;
    onebit_bytes += onebit_wire_bytes(layout.numel, static_cast<int64_t>(blocks.size()));
  }
  EXPECT_GT(more_segments, 0u) << "the default gpt has parameters larger than one block";
  EXPECT_GE(static_cast<double>(none_bytes) / static_cast<double>(onebit_bytes), 30.0);
}

// The set bound (dist.onebit_max_error = eps): on real gradients, every block the hook codes is within eps
// of its norm, through the hook's own reduce (encode, pack, all-gather, unpack, decode) and its residual;
// a small eps sends the blocks no scale can code that well in fp32 and the bytes say how many. Without
// the bound the same blocks' errors exceed eps (the contraction alone does not bound them by a constant).
TEST(OneBitCode, SetErrorBoundHoldsOnRealGradientsThroughTheHook) {
  train::Setup setup = train::build_setup(
      train::load_config(std::string(RATION_SOURCE_DIR) + "/configs/gpt.toml",
                         {"train.threads=1", "model.n_layer=2", "model.n_embd=64", "model.block_size=32"}));
  auto params = setup.model->named_parameters();
  setup.model->loss(train::sample_batch(setup, 8, 1)).backward();
  Reducer reducer(World::init_single(), params, std::make_unique<AllReduceHook>(), {});
  std::vector<std::vector<int64_t>> per_param;
  for (const auto& layout : reducer.buckets()) per_param.push_back(layout.numels);
  EXPECT_EQ(dist_settings("compress = \"onebit\"\nonebit_max_error = 0.3\n").onebit.max_error, 0.3);
  EXPECT_NE(dist_settings_error("onebit_max_error = 1.5\n").find("dist.onebit_max_error must be a number in [0, 1)"),
            std::string::npos);
  for (const double eps : {0.9, 0.6, 0.3}) {
    SCOPED_TRACE("eps " + std::to_string(eps));
    OneBitOptions bounded;
    bounded.max_error = eps;
    OneBitHook hook(bounded), plain(OneBitOptions{});
    hook.init(per_param);
    plain.init(per_param);
    int64_t over_without = 0, raw_blocks = 0, blocks = 0, expected_payload = 0;
    Traffic traffic;
    for (size_t b = 0; b < reducer.buckets().size(); ++b) {
      const auto& layout = reducer.buckets()[b];
      std::vector<at::Tensor> parts;
      for (const auto& name : layout.names)
        for (const auto& [n, p] : params)
          if (n == name) parts.push_back(p.grad().reshape({-1}));
      const at::Tensor v = at::cat(parts).contiguous();
      at::Tensor reduced = v.clone(), unbounded = v.clone();
      const Traffic sent = hook.reduce(World::init_single(), static_cast<int>(b), reduced);
      traffic += sent;
      plain.reduce(World::init_single(), static_cast<int>(b), unbounded);
      // The residual is exactly what was not sent.
      EXPECT_TRUE(at::allclose(hook.residuals()[b], v - reduced, 1e-5, 1e-7)) << "bucket " << b;
      const OneBitCode code = onebit_encode(v, hook.code_segments()[b], bounded.lambda, eps);
      int64_t offset = 0;
      for (size_t j = 0; j < code.segments.size(); ++j) {
        const int64_t n = code.segments[j];
        const at::Tensor vj = v.narrow(0, offset, n).to(at::kDouble);
        const double norm = vj.norm().item<double>();
        const double err = (vj - reduced.narrow(0, offset, n).to(at::kDouble)).norm().item<double>();
        const double err_plain = (vj - unbounded.narrow(0, offset, n).to(at::kDouble)).norm().item<double>();
        EXPECT_LE(err, eps * norm + 1e-12) << "bucket " << b << " block " << j;
        if (err_plain > eps * norm) ++over_without;
        if (code.alpha[j] == kRawSegment) {
          ++raw_blocks;
          EXPECT_EQ(err, 0.0) << "a block sent in fp32 is exact";
          EXPECT_LT(code.rho[j] * code.rho[j], 1 - eps * eps + 1e-6) << "fp32 only where no scale meets eps";
        }
        offset += n;
        ++blocks;
      }
      const int64_t wire = onebit_wire_bytes(v.numel(), static_cast<int64_t>(code.segments.size()), code.raw.numel());
      EXPECT_EQ(onebit_pack(code).numel(), wire);
      EXPECT_EQ(sent.payload_bytes, wire + 8) << "bucket " << b << ": " << code.segments.size() << " blocks, "
                                              << code.raw.numel() << " elements in fp32, " << v.numel() << " in all";
      expected_payload += wire + 8;  // the code and its length
    }
    EXPECT_EQ(traffic.payload_bytes, expected_payload);
    EXPECT_GT(over_without, 0) << "the contraction alone met eps on every block: the bound was not exercised";
    // Real gradients are heavy-tailed (rho_j well below the Gaussian's 0.8): one scale codes a block within
    // 0.9 of its norm almost always, within 0.3 rarely.
    if (eps <= 0.3) EXPECT_GT(raw_blocks, blocks / 2) << "a tight bound sends most blocks in fp32";
    if (eps >= 0.9) EXPECT_LT(raw_blocks, blocks / 4) << "a loose bound codes most blocks in 1 bit";
  }
}

// The classic example of docs/METHODS.md: the mean-|v| scale maps [1, 2, 3] and [2, 2, 2] to the same code
// 2 [1, 1, 1] and [1, -2, 3] to 2 [1, -1, 1]; the L2 scale with lambda_0 = 0.95 tells the first two apart
// (2.05 and 1.90).
TEST(OneBitCode, MethodsExampleCollidesUnderTheMeanScaleOnly) {
  const at::Tensor a = at::tensor({1.f, 2.f, 3.f}), b = at::tensor({2.f, 2.f, 2.f}), c = at::tensor({1.f, -2.f, 3.f});
  EXPECT_TRUE(at::allclose(onebit_decode(onebit_encode(a)), at::full({3}, 2.f)));
  EXPECT_TRUE(at::allclose(onebit_decode(onebit_encode(b)), at::full({3}, 2.f)));
  EXPECT_TRUE(at::allclose(onebit_decode(onebit_encode(c)), at::tensor({2.f, -2.f, 2.f})));
  EXPECT_NEAR(onebit_encode(a, {}, 0.95).alpha[0], 0.95 * std::sqrt(14.0 / 3.0), 1e-5);
  EXPECT_NEAR(onebit_encode(b, {}, 0.95).alpha[0], 1.90, 1e-5);
}

// ---- loader shards ---------------------------------------------------------------------------------
class Indices : public data::Dataset {
 public:
  explicit Indices(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  data::Batch get(const std::vector<int64_t>& idx) const override {
    data::Batch b;
    b.input = Value(at::tensor(idx, at::kLong));
    b.items = static_cast<int64_t>(idx.size());
    return b;
  }

 private:
  int64_t n_;
};

// The update-space code (dist.onebit_space = "update"): the rank codes u = v / D with D the optimiser's
// frozen AdamW denominator and the sum over ranks is D * C(u). Its error bound is the gradient-space one
// in the D-weighted norm: ||(v - D C(v/D)) / D|| = ||u - C(u)|| <= sqrt(1 - 2 lambda rho + lambda^2) ||u||
// per segment (lambda, rho those of u). Checked on random and heavy-tailed vectors with a D spread over
// four orders of magnitude, as AdamW denominators are; in that norm (the one the update is measured in)
// the update-space code beats the gradient-space code, in the plain norm it may not.
TEST(OneBitCode, UpdateSpaceBoundHoldsInTheDenominatorNorm) {
  at::manual_seed(21);
  const std::vector<int64_t> segments = onebit_blocks(5000, 1024);
  for (int kind = 0; kind < 2; ++kind) {
    const at::Tensor scale = at::pow(10.0, at::rand({5000}) * 4 - 5);  // D in [1e-5, 1e-1]
    const at::Tensor noise = kind == 0 ? at::randn({5000}) : at::randn({5000}).pow(3);
    const at::Tensor v = noise * scale;                                 // gradients scaled like D
    const at::Tensor u = v / scale;
    const OneBitCode code = onebit_encode(u, segments, 0.95);
    const at::Tensor sent = onebit_decode(code) * scale;                // D * C(u)
    const at::Tensor werr = ((v - sent) / scale).to(at::kDouble);       // D^-1 (v - sent)
    int64_t offset = 0;
    for (size_t j = 0; j < segments.size(); ++j) {
      const double uj = u.narrow(0, offset, segments[j]).to(at::kDouble).norm().item<double>();
      const double l = code.lambda[j], r = code.rho[j];
      const double ej = werr.narrow(0, offset, segments[j]).norm().item<double>();
      EXPECT_NEAR(ej, std::sqrt(1 - 2 * l * r + l * l) * uj, 1e-4 * uj) << "kind " << kind << " segment " << j;
      EXPECT_LT(ej, uj) << "a contraction in the D-weighted norm";
      offset += segments[j];
    }
    // The gradient-space code of the same v, measured in the same D-weighted norm, is worse.
    const at::Tensor plain = onebit_decode(onebit_encode(v, segments, 0.95));
    const double plain_err = ((v - plain) / scale).norm().item<double>();
    EXPECT_LT(werr.norm().item<double>(), 0.5 * plain_err) << "kind " << kind;
    // Same bytes: the code is the same size whatever it approximates.
    EXPECT_EQ(onebit_pack(code).numel(), onebit_wire_bytes(5000, static_cast<int64_t>(segments.size())));
  }
}

// AdamW with its second moment frozen after step K (dist.onebit_second_moment = "freeze"): from step
// K + 1 on, v and the bias correction stay those of step K while m and the parameter keep updating;
// checked against the rule computed independently in float64; denominators() is the denom of step K.
TEST(OneBitSecondMoment, FrozenAdamWKeepsTheDenominatorOfItsLastWarmupStep) {
  const int64_t K = 3;
  optim::AdamWOptions o;
  o.lr = 0.01;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  at::manual_seed(31);
  const at::Tensor init = at::randn({4, 6}, at::kDouble);
  optim::NamedParams params = {{"w", parameter(init.clone(), "w")}};
  optim::AdamW adamw(params, o);
  adamw.freeze_second_moment(K);
  at::Tensor p = init.clone(), m = at::zeros_like(init), v = at::zeros_like(init), frozen_denom;
  for (int64_t t = 1; t <= 7; ++t) {
    const at::Tensor g = at::randn({4, 6}, at::kDouble) * (t <= K ? 1.0 : 5.0);  // large later: v would move
    params[0].second.grad() = g.clone();
    adamw.step();
    p = p * (1 - o.lr * o.weight_decay);
    m = o.beta1 * m + (1 - o.beta1) * g;
    if (t <= K) v = o.beta2 * v + (1 - o.beta2) * g * g;
    const double tv = static_cast<double>(std::min(t, K));
    const at::Tensor denom = v.sqrt() / std::sqrt(1 - std::pow(o.beta2, tv)) + o.eps;
    if (t == K) frozen_denom = denom;
    p = p - o.lr / (1 - std::pow(o.beta1, static_cast<double>(t))) * m / denom;
    EXPECT_LE((params[0].second.tensor() - p).abs().max().item<double>(), 1e-12) << "step " << t;
    if (t >= K) {
      const optim::NamedTensors d = adamw.denominators();
      ASSERT_EQ(d.size(), 1u);
      EXPECT_LE((d[0].second - frozen_denom).abs().max().item<double>(), 1e-14) << "step " << t;
    }
  }
  for (const auto& [name, t] : adamw.export_state()) {
    if (name == "optim.w.exp_avg_sq") {
      EXPECT_LE((t - v).abs().max().item<double>(), 1e-14) << "v stayed that of step K";
    }
  }
}

TEST(DataParallelConfig, OneBitWarmupSecondMomentAndSpaceKeys) {
  const std::string onebit = "compress = \"onebit\"\n";
  auto settings = [&](const std::string& dist) { return dist_settings(onebit + dist); };
  auto error_of = [&](const std::string& dist) { return dist_settings_error(onebit + dist); };
  EXPECT_EQ(settings("").onebit.second_moment, SecondMoment::Track);
  EXPECT_EQ(settings("").onebit.space, CodeSpace::Gradient);
  const OneBitOptions o = settings("compress_warmup = 20\nonebit_second_moment = \"freeze\"\nonebit_space = \"update\"\n").onebit;
  EXPECT_EQ(o.second_moment, SecondMoment::Freeze);
  EXPECT_EQ(o.space, CodeSpace::Update);
  EXPECT_EQ(o.warmup_steps, 20);
  const std::string no_warmup = error_of("onebit_second_moment = \"freeze\"\n");
  EXPECT_NE(no_warmup.find("run.toml: dist.onebit_second_moment = \"freeze\""), std::string::npos) << no_warmup;
  EXPECT_NE(no_warmup.find("dist.compress_warmup >= 1"), std::string::npos) << no_warmup;
  EXPECT_EQ(settings("onebit_space = \"update\"\n").onebit.space, CodeSpace::Update) << "with v tracked too";
  // The fp32 warm-up defaults to the learning-rate warm-up; 0 codes from the first step.
  auto with_optim = [](const std::string& text) {
    Config cfg = Config::from_string(text, "run.toml");
    return read_data_parallel_settings(cfg).onebit.warmup_steps;
  };
  EXPECT_EQ(with_optim("[optim]\nwarmup_steps = 7\n[dist]\ncompress = \"onebit\"\n"), 7);
  EXPECT_EQ(with_optim("[optim]\nwarmup_steps = 7\n[dist]\ncompress = \"onebit\"\ncompress_warmup = 0\n"), 0);
  EXPECT_EQ(with_optim("[dist]\ncompress = \"onebit\"\n"), 0);
  const std::string bad = error_of("onebit_space = \"weights\"\n");
  EXPECT_NE(bad.find("dist.onebit_space"), std::string::npos) << bad;
}

TEST(DataParallelLoader, ShardsPartitionTheGlobalBatch) {
  auto set = std::make_shared<Indices>(37);
  for (data::Sampling sampling : {data::Sampling::Shuffle, data::Sampling::Bootstrap}) {
    data::LoaderOptions whole_options{12, true, 9, false};
    whole_options.sampling = sampling;
    data::Loader whole(set, whole_options);
    std::vector<data::Loader> shards;
    for (int r = 0; r < 3; ++r) {
      data::LoaderOptions o{4, true, 9, false};
      o.sampling = sampling;
      o.shard_rank = r;
      o.shard_count = 3;
      shards.emplace_back(set, o);
    }
    EXPECT_EQ(shards[0].batches_per_epoch(), whole.batches_per_epoch());
    for (int step = 0; step < 8; ++step) {
      const std::vector<int64_t> expected = whole.next_indices();
      std::vector<int64_t> joined;
      std::vector<size_t> sizes;
      for (auto& s : shards) {
        const auto part = s.next_indices();
        EXPECT_EQ(s.last_global_items(), static_cast<int64_t>(expected.size()));
        sizes.push_back(part.size());
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, expected) << "step " << step;
      // A short last batch (37 = 3 * 12 + 1) is split as evenly as possible: 1, 0, 0.
      if (expected.size() == 1) EXPECT_EQ(sizes, (std::vector<size_t>{1, 0, 0}));
    }
  }
  // Bootstrap draws with replacement: an epoch repeats some items and misses others, and is pinned by the seed.
  const std::vector<int64_t> draws = data::bootstrap_order(1000, 4, 0);
  EXPECT_LT(std::set<int64_t>(draws.begin(), draws.end()).size(), 900u);
  EXPECT_EQ(draws, data::bootstrap_order(1000, 4, 0));
  EXPECT_NE(draws, data::bootstrap_order(1000, 4, 1));
}

// ---- accumulation and buckets (one process) --------------------------------------------------------
TEST(DataParallelReducer, SyncEveryAccumulatesTheWeightedMean) {
  at::manual_seed(2);
  Value w = parameter(at::randn({3, 5}), "w"), b = parameter(at::randn({3}), "b");
  const at::Tensor x = at::randn({7, 5});
  const at::Tensor y = at::tensor({0, 1, 2, 0, 1, 2, 0}, at::kLong);
  auto loss_of = [&](int64_t from, int64_t to) {
    return ops::cross_entropy(ops::linear(Value(x.slice(0, from, to)), w, b), Value(y.slice(0, from, to)));
  };
  loss_of(0, 7).backward();
  const at::Tensor dw = w.grad().clone(), db = b.grad().clone();
  w.impl()->grad = at::Tensor();
  b.impl()->grad = at::Tensor();
  ReducerOptions ro;
  ro.sync_every = 2;
  ro.first_bucket_bytes = 4;  // one parameter per bucket
  Reducer reducer(World::init_single(), {{"w", w}, {"b", b}}, std::make_unique<AllReduceHook>(), ro);
  ASSERT_EQ(reducer.buckets().size(), 2u);
  EXPECT_EQ(reducer.buckets()[0].names, std::vector<std::string>{"b"});
  for (int round = 0; round < 2; ++round) {  // twice: the second window starts clean
    reducer.prepare_backward(4.0 / 7);
    loss_of(0, 4).backward();
    EXPECT_FALSE(reducer.window_complete());
    reducer.prepare_backward(3.0 / 7);
    loss_of(4, 7).backward();
    ASSERT_TRUE(reducer.window_complete());
    reducer.finalize();
    EXPECT_TRUE(at::allclose(w.grad(), dw, 1e-6, 1e-7)) << round;
    EXPECT_TRUE(at::allclose(b.grad(), db, 1e-6, 1e-7)) << round;
  }
  EXPECT_EQ(reducer.stats().synchronizations, 2);
  EXPECT_THROW(reducer.prepare_backward(1.5), Error);
}

TEST(DataParallelConfig, FingerprintIgnoresPerHostKeysOnly) {
  std::map<std::string, std::string> a = {{"optim.lr", "0.001"}, {"train.threads", "1"}, {"data.dir", "/a"}};
  std::map<std::string, std::string> b = {{"optim.lr", "0.001"}, {"train.threads", "2"}, {"data.dir", "/b"}};
  std::map<std::string, std::string> c = {{"optim.lr", "0.002"}, {"train.threads", "1"}, {"data.dir", "/a"}};
  EXPECT_EQ(config_fingerprint(a), config_fingerprint(b));
  EXPECT_NE(config_fingerprint(a), config_fingerprint(c));
  Config cfg = Config::from_string("[dist]\ncompress = \"twobit\"\n", "bad.toml");
  try {
    (void)read_data_parallel_settings(cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.toml: key 'dist.compress' must be one of"), std::string::npos) << e.what();
  }
}

// dist.topology: the three names, anything else named with the choices; compression with allreduce only.
TEST(DataParallelConfig, TopologyKeyIsValidated) {
  auto settings = [](const std::string& dist) { return dist_settings(dist); };
  auto error_of = [](const std::string& dist) { return dist_settings_error(dist); };
  EXPECT_EQ(settings("").topology, Topology::AllReduce);
  EXPECT_EQ(settings("topology = \"ps\"\n").topology, Topology::ParameterServer);
  EXPECT_EQ(settings("topology = \"gossip\"\n").topology, Topology::Gossip);
  EXPECT_EQ(settings("topology = \"allreduce\"\ncompress = \"onebit\"\n").compress, "onebit");
  EXPECT_NE(error_of("topology = \"ring\"\n").find("run.toml: dist.topology must be one of \"allreduce\", \"ps\", \"gossip\"; got \"ring\""),
            std::string::npos)
      << error_of("topology = \"ring\"\n");
  for (const char* t : {"ps", "gossip"}) {
    const std::string e = error_of(std::string("topology = \"") + t + "\"\ncompress = \"fp16\"\n");
    EXPECT_NE(e.find(std::string("run.toml: dist.topology = \"") + t + "\""), std::string::npos) << e;
    EXPECT_NE(e.find("dist.compress must be \"none\""), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace ration::dist
