// comm_hook.cpp — the three communication hooks and the 1-bit code (see comm_hook.h).
#include "ration/distributed/comm_hook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::dist {
namespace {

int64_t ring_all_reduce_bytes(int64_t bytes, int n) { return n <= 1 ? 0 : 2 * (n - 1) * bytes / n; }

void check_flat(const at::Tensor& flat) {
  RATION_ASSERT(flat.defined() && flat.dim() == 1 && flat.scalar_type() == at::kFloat && flat.is_contiguous(),
                "comm hook given a bucket that is not a contiguous 1-D float32 tensor");
}

}  // namespace

Traffic AllReduceHook::reduce(const World& world, int bucket, at::Tensor& flat) {
  check_flat(flat);
  world.all_reduce_sum(flat);
  const int64_t bytes = flat.numel() * 4;
  return {bytes, ring_all_reduce_bytes(bytes, world.size())};
}

Traffic Fp16Hook::reduce(const World& world, int bucket, at::Tensor& flat) {
  check_flat(flat);
  at::Tensor half = flat.to(at::kHalf);  // (numel) fp16
  world.all_reduce_sum(half);
  flat.copy_(half);
  const int64_t bytes = flat.numel() * 2;
  return {bytes, ring_all_reduce_bytes(bytes, world.size())};
}

// ---- the 1-bit code ------------------------------------------------------------------------------
namespace {

std::vector<int64_t> whole_or(const std::vector<int64_t>& segments, int64_t d) {
  if (segments.empty()) return {d};
  int64_t total = 0;
  for (int64_t n : segments) total += n;
  RATION_ASSERT(total == d, "1-bit code segments sum to ", total, ", the vector has ", d, " elements");
  return segments;
}

}  // namespace

// lambda for a segment of rho = r: the preferred one (lambda0's L2 scale or rho), clamped under a set bound
// eps into [r - s, r + s], s = sqrt(r^2 - 1 + eps^2) (the file comment); -1 when no lambda meets eps. The
// bound is narrowed by 1e-4 of itself so that the float32 scale and decode stay within it.
static double segment_lambda(double r, double lambda0, double max_error) {
  const double preferred = lambda0 > 0 ? std::min(lambda0, 1.9 * r) : r;
  if (max_error <= 0) return preferred;
  const double eps = max_error * (1 - 1e-4);
  const double disc = r * r - 1 + eps * eps;
  if (disc < 0) return -1;
  const double s = std::sqrt(disc);
  return std::clamp(preferred, r - s, r + s);
}

OneBitCode onebit_encode(const at::Tensor& v, const std::vector<int64_t>& segments, double lambda0,
                         double max_error) {
  check_flat(v);
  OneBitCode code;
  code.numel = v.numel();
  code.segments = whole_or(segments, code.numel);
  const int64_t d = code.numel;
  const int64_t padded = (d + 7) / 8 * 8;
  at::Tensor positive = v.ge(0).to(at::kByte);  // (d) 0/1
  if (padded != d) positive = at::cat({positive, at::zeros({padded - d}, positive.options())});
  static const at::Tensor weights = at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, at::kInt);
  code.bits = (positive.view({padded / 8, 8}).to(at::kInt) * weights).sum(1).to(at::kByte);  // (ceil(d/8))
  const at::Tensor v64 = v.to(at::kDouble);
  std::vector<at::Tensor> raw;  // the fp32 segments' values
  int64_t offset = 0;
  for (int64_t n : code.segments) {
    const at::Tensor part = v64.narrow(0, offset, n);
    const double l1 = n > 0 ? part.abs().sum().item<double>() : 0;
    const double l2 = n > 0 ? part.norm().item<double>() : 0;
    float lambda = 0, alpha = 0, rho = 0;
    if (l2 > 0) {
      const double r = l1 / (std::sqrt(static_cast<double>(n)) * l2);
      const double l = segment_lambda(r, lambda0, max_error);
      rho = static_cast<float>(r);
      lambda = l < 0 ? 1.0f : static_cast<float>(l);  // fp32: no error, as lambda = 1
      alpha = l < 0 ? kRawSegment : static_cast<float>(l * l2 / std::sqrt(static_cast<double>(n)));
      if (l < 0) raw.push_back(v.narrow(0, offset, n));
    }
    offset += n;
    code.lambda.push_back(lambda);
    code.rho.push_back(rho);
    code.alpha.push_back(alpha);
  }
  code.raw = raw.empty() ? at::empty({0}, at::kFloat) : at::cat(raw).contiguous();
  return code;
}

at::Tensor onebit_decode(const OneBitCode& code) {
  const int64_t d = code.numel;
  static const at::Tensor shifts = at::arange(8, at::kInt);
  at::Tensor bits = code.bits.to(at::kInt).unsqueeze(1).bitwise_right_shift(shifts).bitwise_and(1);  // (m, 8)
  at::Tensor sign = bits.reshape({-1}).narrow(0, 0, d).to(at::kFloat) * 2 - 1;                        // (d) +-1
  const bool any_raw = code.raw.defined() && code.raw.numel() > 0;
  if (code.segments.size() == 1 && !any_raw) return sign * code.alpha[0];
  const at::Tensor alpha = at::tensor(code.alpha, at::kFloat);                                        // (S)
  const at::Tensor counts = at::tensor(code.segments, at::kLong);                                     // (S)
  at::Tensor out = sign * at::repeat_interleave(alpha, counts, 0, d);                                 // (d)
  if (!any_raw) return out;
  int64_t offset = 0, taken = 0;  // the fp32 segments' values replace their signs
  for (size_t j = 0; j < code.segments.size(); ++j) {
    const int64_t n = code.segments[j];
    if (code.alpha[j] == kRawSegment) {
      out.narrow(0, offset, n).copy_(code.raw.narrow(0, taken, n));
      taken += n;
    }
    offset += n;
  }
  return out;
}

int64_t onebit_wire_bytes(int64_t numel, int64_t segments, int64_t raw_elements) {
  return 4 * segments + (numel + 7) / 8 + 4 * raw_elements;
}

at::Tensor onebit_pack(const OneBitCode& code) {
  const auto s = static_cast<int64_t>(code.segments.size());
  const int64_t raw = code.raw.defined() ? code.raw.numel() : 0;
  at::Tensor out = at::empty({onebit_wire_bytes(code.numel, s, raw)}, at::kByte);
  std::memcpy(out.data_ptr<uint8_t>(), code.alpha.data(), 4 * code.alpha.size());
  if (code.bits.numel() > 0) out.narrow(0, 4 * s, code.bits.numel()).copy_(code.bits);
  if (raw > 0) std::memcpy(out.data_ptr<uint8_t>() + 4 * s + code.bits.numel(), code.raw.data_ptr<float>(), 4 * raw);
  return out;
}

OneBitCode onebit_unpack(const at::Tensor& packed, const std::vector<int64_t>& segments) {
  OneBitCode code;
  code.segments = segments;
  for (int64_t n : segments) code.numel += n;
  const auto s = static_cast<int64_t>(segments.size());
  const at::Tensor c = packed.contiguous();
  RATION_ASSERT(c.numel() >= 4 * s, "1-bit code of ", c.numel(), " bytes for ", s, " segments");
  code.alpha.resize(segments.size());
  std::memcpy(code.alpha.data(), c.data_ptr<uint8_t>(), 4 * segments.size());
  int64_t raw = 0;
  for (size_t j = 0; j < segments.size(); ++j)
    if (code.alpha[j] == kRawSegment) raw += segments[j];
  RATION_ASSERT(c.numel() == onebit_wire_bytes(code.numel, s, raw), "1-bit code of ", c.numel(), " bytes for ",
                code.numel, " elements in ", s, " segments (", raw, " of them in fp32)");
  const int64_t bit_bytes = (code.numel + 7) / 8;
  code.bits = c.narrow(0, 4 * s, bit_bytes);
  code.raw = at::empty({raw}, at::kFloat);
  if (raw > 0) std::memcpy(code.raw.data_ptr<float>(), c.data_ptr<uint8_t>() + 4 * s + bit_bytes, 4 * raw);
  return code;
}

// ---- OneBitHook ----------------------------------------------------------------------------------
std::vector<int64_t> onebit_blocks(int64_t numel, int64_t block) {
  if (block <= 0 || numel <= block) return {numel};
  std::vector<int64_t> out(static_cast<size_t>(numel / block), block);
  if (numel % block) out.push_back(numel % block);
  return out;
}

void OneBitHook::init(const std::vector<std::vector<int64_t>>& bucket_segments) {
  segments_.clear();
  for (const auto& params : bucket_segments) {
    std::vector<int64_t> segs;
    for (int64_t n : params) {
      const std::vector<int64_t> blocks = onebit_blocks(n, options_.block);
      segs.insert(segs.end(), blocks.begin(), blocks.end());
    }
    segments_.push_back(std::move(segs));
  }
  residual_.clear();
  last_lambda_.assign(bucket_segments.size(), 0.f);
  if (options_.feedback == ErrorFeedback::Off) return;
  memory::CategoryGuard optimizer_memory(memory::Category::Optimizer);
  for (const auto& segs : segments_) {
    int64_t n = 0;
    for (int64_t k : segs) n += k;
    residual_.push_back(at::zeros({n}, at::kFloat));
  }
}

void OneBitHook::begin_window(const WindowContext& context) {
  context_ = context;
  ++(warming_up() ? counts_.warmup_windows : counts_.compressed_windows);
  RATION_ASSERT(options_.space == CodeSpace::Gradient || warming_up() || !denominator_.empty(),
                "onebit hook: coding in the update space needs the optimiser's denominators before step ",
                context.step);
}

namespace {

// max(D_i, kDenominatorFloor * mean of D over i's segment): an element whose AdamW second moment is still
// zero (no gradient yet) has D = eps, and its first gradient divided by eps would set its block's scale
// for every other element of the block. Any positive D keeps the bound (docs/DISTRIBUTED.md).
constexpr double kDenominatorFloor = 0.01;

at::Tensor floored_per_segment(const at::Tensor& d, const std::vector<int64_t>& segments) {
  const at::Tensor counts = at::tensor(segments, at::kLong);                               // (S)
  const at::Tensor ends = counts.cumsum(0);                                                // (S)
  const at::Tensor csum = at::cat({at::zeros({1}, at::kDouble), d.to(at::kDouble).cumsum(0)});  // (d + 1)
  const at::Tensor sums = csum.index_select(0, ends) - csum.index_select(0, ends - counts);  // (S)
  const at::Tensor floor = (sums / counts.to(at::kDouble) * kDenominatorFloor).to(at::kFloat);  // (S)
  return at::maximum(d, at::repeat_interleave(floor, counts, 0, d.numel()));               // (d)
}

}  // namespace

bool OneBitHook::denominators_due(int64_t step) const {
  if (options_.space != CodeSpace::Update || step < options_.warmup_steps) return false;
  // A frozen denominator is taken once; a tracked one before every compressed step.
  return options_.second_moment == SecondMoment::Track || denominator_.empty();
}

void OneBitHook::set_denominators(const std::vector<at::Tensor>& per_bucket) {
  RATION_ASSERT(per_bucket.size() == segments_.size(), "onebit hook: ", per_bucket.size(),
                " denominators for ", segments_.size(), " buckets");
  memory::CategoryGuard optimizer_memory(memory::Category::Optimizer);
  denominator_.clear();
  for (size_t b = 0; b < per_bucket.size(); ++b) {
    int64_t n = 0;
    for (int64_t k : segments_[b]) n += k;
    const at::Tensor& d = per_bucket[b];
    RATION_ASSERT(d.defined() && d.numel() == n && d.scalar_type() == at::kFloat,
                  "onebit hook: denominator of bucket ", b, " is not a (", n, ") float32 tensor");
    RATION_ASSERT(d.gt(0).all().item<bool>(), "onebit hook: denominator of bucket ", b, " is not positive");
    denominator_.push_back(floored_per_segment(d.reshape({-1}), segments_[b]));
  }
}

void OneBitHook::import_residuals(const std::vector<at::Tensor>& residuals) {
  RATION_CHECK(residuals.size() == residual_.size(), "checkpoint holds ", residuals.size(),
               " onebit error-feedback residuals, this run has ", residual_.size(),
               " buckets (same model, dist.bucket_bytes, dist.first_bucket_bytes and dist.error_feedback expected)");
  for (size_t b = 0; b < residual_.size(); ++b) {
    RATION_CHECK(residuals[b].numel() == residual_[b].numel(), "checkpoint's onebit residual of bucket ", b, " has ",
                 residuals[b].numel(), " elements, this run's bucket has ", residual_[b].numel());
    residual_[b].copy_(residuals[b].reshape({-1}));
  }
}

Traffic OneBitHook::reduce(const World& world, int bucket, at::Tensor& flat) {
  check_flat(flat);
  const auto b = static_cast<size_t>(bucket);
  RATION_ASSERT(b < segments_.size(), "onebit hook: bucket ", bucket, " was not declared in init()");
  if (warming_up()) return AllReduceHook().reduce(world, bucket, flat);
  const bool feedback = options_.feedback == ErrorFeedback::On;
  if (feedback) flat.add_(residual_[b]);  // v = g + e
  // Update space: code u = v / D; the decoded vector is D * C(u), and the residual v - D * C(u).
  const at::Tensor* denom = denominator_.empty() ? nullptr : &denominator_[b];
  const at::Tensor coded = denom ? flat.div(*denom) : flat;             // (d) float32
  const OneBitCode mine = onebit_encode(coded, segments_[b], options_.lambda, options_.max_error);
  last_lambda_[b] = *std::min_element(mine.lambda.begin(), mine.lambda.end());
  if (feedback) {
    at::Tensor sent = onebit_decode(mine);                               // (d) C(u) or C(v)
    if (denom) sent.mul_(*denom);
    at::sub_out(residual_[b], flat, sent);                               // e = v - sent
  }
  at::Tensor packed = onebit_pack(mine);                                // (4 S + ceil(d/8) [+ 4 raw]) uint8
  // Under a set bound codes differ in length (segments in fp32): every rank's length first, then codes
  // padded to the longest.
  std::vector<int64_t> lengths(static_cast<size_t>(world.size()), packed.numel());
  if (options_.max_error > 0) {
    const at::Tensor all = world.all_gather(at::full({1}, packed.numel(), at::kLong));  // (N) int64
    for (int r = 0; r < world.size(); ++r) lengths[static_cast<size_t>(r)] = all[r].item<int64_t>();
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    if (longest > packed.numel()) packed = at::cat({packed, at::zeros({longest - packed.numel()}, at::kByte)});
  }
  const at::Tensor gathered = world.all_gather(packed);                 // (N * unit) uint8
  const int64_t unit = packed.numel();
  flat.zero_();
  for (int r = 0; r < world.size(); ++r)
    flat.add_(onebit_decode(onebit_unpack(gathered.narrow(0, r * unit, lengths[static_cast<size_t>(r)]), segments_[b])));
  if (denom) flat.mul_(*denom);                                         // sum_r D * C(u_r)
  const int64_t length_bytes = options_.max_error > 0 ? 8 : 0;  // the length's all-gather
  const Traffic sent{unit + length_bytes, static_cast<int64_t>(world.size() - 1) * (unit + length_bytes)};
  counts_.compressed += sent;
  return sent;
}

int64_t OneBitHook::residual_bytes() const {
  int64_t total = 0;
  for (const auto& r : residual_) total += r.numel() * 4;
  return total;
}

int64_t OneBitHook::state_bytes() const {
  int64_t total = residual_bytes();
  for (const auto& d : denominator_) total += d.numel() * 4;
  return total;
}

// ---- hook state in checkpoints -----------------------------------------------------------------
namespace {

const char kResidualPrefix[] = "dist.onebit_residual.rank";

std::string residual_name(int rank, size_t bucket) {
  return kResidualPrefix + std::to_string(rank) + ".bucket" + std::to_string(bucket);
}
// Every aggregator's checkpoint entries start with "dist." (onebit's residuals, ensemble members).
bool is_hook_state(const std::string& name) { return name.rfind("dist.", 0) == 0; }

}  // namespace

NamedTensors gather_hook_state(const World& world, const CommHook& hook) {
  const auto* onebit = dynamic_cast<const OneBitHook*>(&hook);
  if (!onebit || onebit->residuals().empty()) return {};
  NamedTensors out;
  const std::vector<at::Tensor>& mine = onebit->residuals();
  for (size_t b = 0; b < mine.size(); ++b) {
    const at::Tensor all = world.all_gather(mine[b]);  // (N * numel) float32, rank order
    if (world.rank() != 0) continue;
    for (int r = 0; r < world.size(); ++r)
      out.emplace_back(residual_name(r, b), all.narrow(0, r * mine[b].numel(), mine[b].numel()).clone());
  }
  return out;
}

NamedTensors without_hook_state(const NamedTensors& entries) {
  NamedTensors out;
  for (const auto& e : entries)
    if (!is_hook_state(e.first)) out.push_back(e);
  return out;
}

std::string restore_hook_state(const World& world, CommHook& hook, const NamedTensors& entries) {
  auto* onebit = dynamic_cast<OneBitHook*>(&hook);
  std::map<std::string, at::Tensor> saved;
  int saved_ranks = 0;
  for (const auto& [name, t] : entries) {
    if (name.rfind(kResidualPrefix, 0) != 0) continue;
    saved[name] = t;
    if (name.rfind(kResidualPrefix, 0) == 0)
      saved_ranks = std::max(saved_ranks, 1 + std::stoi(name.substr(sizeof(kResidualPrefix) - 1)));
  }
  if (saved.empty() || !onebit || onebit->residuals().empty()) return std::string();
  if (saved_ranks != world.size())
    return "onebit error-feedback residuals were saved by " + std::to_string(saved_ranks) + " ranks, this run has " +
           std::to_string(world.size()) + ": they restart at zero";
  std::vector<at::Tensor> mine;
  for (size_t b = 0; b < onebit->residuals().size(); ++b) {
    const auto it = saved.find(residual_name(world.rank(), b));
    RATION_CHECK(it != saved.end(), "checkpoint lacks ", residual_name(world.rank(), b),
                 " (saved with other dist.bucket_bytes / dist.first_bucket_bytes?)");
    mine.push_back(it->second);
  }
  onebit->import_residuals(mine);
  return std::string();
}

std::unique_ptr<CommHook> make_comm_hook(const std::string& name, const OneBitOptions& onebit,
                                         const std::string& origin) {
  if (name == "none") return std::make_unique<AllReduceHook>();
  if (name == "fp16") return std::make_unique<Fp16Hook>();
  if (name == "onebit") return std::make_unique<OneBitHook>(onebit);
  RATION_CHECK(false, origin, ": key 'dist.compress' must be one of \"none\", \"fp16\", \"onebit\", got \"", name, "\"");
}

}  // namespace ration::dist
