// comm_hook.h — how one gradient bucket travels between ranks: the communication-hook interface and its
// three plug-ins (none: fp32 all-reduce; fp16: half-precision all-reduce; onebit: packed sign bits plus
// one scale per block of each parameter through all-gather, with error feedback).
// Owns: CommHook, Traffic (exact bytes handed to c10d), the 1-bit code (encode/decode, pure functions
//       whose error bound docs/DISTRIBUTED.md states and tests check), the error-feedback residuals and
//       their checkpoint entries, onebit's fp32 warm-up (and its byte counts apart from the compressed
//       steps), and the update-space denominators it is given (CodeSpace::Update).
// Does not own: bucketing, weighting or when a bucket is launched (distributed/reducer.h); the process group
//       (distributed/world.h); the optimiser, whose second moment the trainer freezes and whose denominators it
//       hands over (train/trainer.cpp, optim/adamw.h).
//
// Contract of reduce(): every rank calls it for the same bucket index in the same order with a 1-D
// float32 tensor of the same length holding this rank's already-weighted gradient for the bucket; on
// return the tensor holds the sum over ranks (for onebit: the sum of every rank's decoded code). reduce
// blocks; the reducer runs it on its communication thread so that it overlaps backward.
//
// The 1-bit code of v (d elements) is its sign bits and, per segment v_j (d_j elements: one parameter
// of the bucket), alpha_j = lambda_j * ||v_j||_2 / sqrt(d_j) with lambda_j = ||v_j||_1 / (sqrt(d_j) *
// ||v_j||_2) in [1/sqrt(d_j), 1], the lambda that minimises the reconstruction error; then
// ||v_j - C(v_j)||_2 = sqrt(1 - lambda_j^2) ||v_j||_2 and over the bucket
// ||v - C(v)||_2 <= sqrt(1 - min_j lambda_j^2) ||v||_2 <= sqrt(1 - 1/max_j d_j) ||v||_2.
// That lambda_j = rho_j makes alpha_j the mean |v_j| (the classic 1-bit scale). With error feedback the
// hook instead scales by the L2 norm, lambda_j = min(lambda_0, 1.9 rho_j) (lambda_0 = dist.onebit_lambda,
// default 0.95): still a contraction, ||v_j - C(v_j)||^2 = (1 - 2 lambda_j rho_j + lambda_j^2) ||v_j||^2
// <= (1 - min(0.0526 lambda_0^2, 0.19 rho_j^2)) ||v_j||^2, and entries larger than the block's mean are
// sent faster, which keeps the residual small (see docs/DISTRIBUTED.md, "1-bit compression").
// A set bound (dist.onebit_max_error = eps > 0) replaces the contraction by ||v_j - C(v_j)||_2 <=
// eps ||v_j||_2 for every segment: lambda_j is the preferred one clamped into the interval where
// 1 - 2 lambda rho_j + lambda^2 <= eps^2, i.e. [rho_j - s_j, rho_j + s_j], s_j = sqrt(rho_j^2 - 1 + eps^2);
// a segment with rho_j^2 < 1 - eps^2 has no such lambda and is sent in fp32 (error 0, 4 bytes per element).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ration/distributed/world.h"

namespace ration::dist {

// Bytes one rank handed to c10d for one bucket. payload: the size of the buffers this rank contributed
// (exact). wire: what a ring algorithm sends per rank for that payload (all-reduce of M bytes:
// 2 (N-1)/N M; all-gather of an m-byte shard: (N-1) m), the figure link-speed projections use.
struct Traffic {
  int64_t payload_bytes = 0;
  int64_t wire_bytes = 0;
  Traffic& operator+=(const Traffic& o) {
    payload_bytes += o.payload_bytes;
    wire_bytes += o.wire_bytes;
    return *this;
  }
};

// What a hook may know about the synchronisation it is about to serve: the optimiser step it belongs to
// (0 when the caller does not say).
struct WindowContext {
  int64_t step = 0;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual const char* name() const = 0;
  // Once, before the first reduce: every bucket's segments (the element counts of its parameters, in
  // bucket order); hooks with per-bucket state size it here.
  virtual void init(const std::vector<std::vector<int64_t>>& bucket_segments) {}
  // Before the first reduce of every synchronisation, on the caller's thread while no reduce runs.
  virtual void begin_window(const WindowContext& context) {}
  // See the file comment. Throws CollectiveError when a collective fails.
  virtual Traffic reduce(const World& world, int bucket, at::Tensor& flat) = 0;
  // Bytes of state the hook keeps between steps (error-feedback residuals).
  virtual int64_t state_bytes() const { return 0; }
};

// fp32 all-reduce of the bucket.
class AllReduceHook : public CommHook {
 public:
  const char* name() const override { return "none"; }
  Traffic reduce(const World& world, int bucket, at::Tensor& flat) override;
};

// The bucket cast to fp16, all-reduced (summed in fp16), cast back.
class Fp16Hook : public CommHook {
 public:
  const char* name() const override { return "fp16"; }
  Traffic reduce(const World& world, int bucket, at::Tensor& flat) override;
};

// ---- the 1-bit code ------------------------------------------------------------------------------
struct OneBitCode {
  std::vector<int64_t> segments;  // d_j, summing to d
  std::vector<float> alpha;       // per segment: lambda_j * ||v_j||_2 / sqrt(d_j)  (= ||v_j||_1 / d_j);
                                  // kRawSegment: the segment is sent in fp32 (its values in `raw`)
  std::vector<float> lambda;      // per segment: the lambda_j used (rho_j unless lambda_0 > 0); 0 if v_j = 0;
                                  // 1 for a segment sent in fp32 (no error)
  std::vector<float> rho;         // per segment: ||v_j||_1 / (sqrt(d_j) ||v_j||_2) in [1/sqrt(d_j), 1]; 0 if v_j = 0
  at::Tensor bits;                // (ceil(d / 8)) uint8: bit k of byte i is 1 when v[8 i + k] >= 0
  at::Tensor raw;                 // (sum of the raw segments' d_j) float32, in segment order; may be empty
  int64_t numel = 0;              // d
};
// The alpha that marks a segment sent in fp32 (a real alpha is >= 0).
constexpr float kRawSegment = -1.0f;
// v: 1-D float32; segments: element counts summing to v.numel() (empty: one segment, the whole of v).
// lambda0 = 0: lambda_j = rho_j (the error-minimising, mean-|v| scale); lambda0 in (0, 1): the L2 scale
// lambda_j = min(lambda0, 1.9 rho_j). max_error = eps in (0, 1): every segment's error is within eps of its norm
// (the file comment); 0: no set bound.
OneBitCode onebit_encode(const at::Tensor& v, const std::vector<int64_t>& segments = {}, double lambda0 = 0,
                         double max_error = 0);
at::Tensor onebit_decode(const OneBitCode& code);  // (d) float32: alpha_j * (+1 / -1)
// The bytes one code occupies on the wire: 4 per segment (alpha) + ceil(d / 8) + 4 per element of the
// segments sent in fp32.
int64_t onebit_wire_bytes(int64_t numel, int64_t segments = 1, int64_t raw_elements = 0);
// Packs a code into that many bytes / reads one back (the all-gather's unit).
at::Tensor onebit_pack(const OneBitCode& code);
OneBitCode onebit_unpack(const at::Tensor& packed, const std::vector<int64_t>& segments);

enum class ErrorFeedback { Off, On };
// What the optimiser's second moment (AdamW's v) does once the 1-bit code starts: Track (it keeps
// averaging the squared decoded gradients, which the code inflates) or Freeze (it keeps its value from
// the last fp32 warm-up step, as 1-bit Adam does; requires a warm-up). See docs/DISTRIBUTED.md.
enum class SecondMoment { Track, Freeze };
// Which vector the 1-bit code approximates. Gradient: v = g + e itself. Update: u = v / D, where D is
// the optimiser's AdamW denominator sqrt(v_hat) + eps before this step (frozen or tracked; the same on
// every rank: every rank holds the same optimiser state), so the code's error is spread evenly in the
// space of the update the optimiser applies; each rank sends C(u) and every rank sums D * C(u_r).
enum class CodeSpace { Gradient, Update };

struct OneBitOptions {
  ErrorFeedback feedback = ErrorFeedback::On;
  // Elements per scale: a parameter of d_j elements is coded as ceil(d_j / block) segments, each with its
  // own alpha (0: one segment per parameter). Smaller blocks raise lambda (a tighter contraction, a
  // smaller residual) at 4 bytes per block; 1024 keeps the code >= 31x smaller than fp32.
  int64_t block = 1024;
  // Synchronisations (optimiser steps) reduced in fp32 before the 1-bit code starts, as PowerSGD's
  // start_iter and 1-bit Adam's warm-up: the early, large and fast-changing gradients are not
  // compressed, and the residual starts when the gradients have settled. `ration train` defaults it to
  // the learning-rate warm-up (distributed/data_parallel.h).
  int64_t warmup_steps = 0;
  // lambda_0 of the L2 scale (0: the mean-|v| scale, lambda_j = rho_j); see the file comment.
  double lambda = 0.95;
  // The set bound eps of dist.onebit_max_error: ||v_j - C(v_j)||_2 <= eps ||v_j||_2 per segment, segments
  // that one scale cannot code that well sent in fp32 (0: no set bound, the contraction above).
  double max_error = 0;
  // The optimiser's second moment during compressed steps (applied by the trainer, which owns it).
  SecondMoment second_moment = SecondMoment::Track;
  CodeSpace space = CodeSpace::Gradient;
};

// Each rank sends the 1-bit code of (its gradient + its residual), all-gathered; every rank sums the
// decoded codes. With ErrorFeedback::On the residual v - C(v) is kept per bucket for the next step.
class OneBitHook : public CommHook {
 public:
  explicit OneBitHook(OneBitOptions options) : options_(options) {}
  const char* name() const override { return "onebit"; }
  void init(const std::vector<std::vector<int64_t>>& bucket_segments) override;
  void begin_window(const WindowContext& context) override;
  Traffic reduce(const World& world, int bucket, at::Tensor& flat) override;
  int64_t state_bytes() const override;  // residuals + denominators
  int64_t residual_bytes() const;
  const OneBitOptions& options() const { return options_; }
  // Synchronisations in the fp32 warm-up and compressed ones, and the bytes handed to c10d by the latter.
  struct Counts {
    int64_t warmup_windows = 0;
    int64_t compressed_windows = 0;
    Traffic compressed;
  };
  const Counts& counts() const { return counts_; }
  // The smallest lambda_j of this rank's last code per bucket (its error bound; reports and tests).
  const std::vector<float>& last_lambda() const { return last_lambda_; }
  // Whether this synchronisation is still in the fp32 warm-up.
  bool warming_up() const { return context_.step < options_.warmup_steps; }
  // The error-feedback residuals, one (numel) float32 tensor per bucket (empty without feedback): the
  // state a checkpoint keeps so a resumed run continues the same curve. import_residuals checks shapes.
  const std::vector<at::Tensor>& residuals() const { return residual_; }
  void import_residuals(const std::vector<at::Tensor>& residuals);
  // Per bucket, the segments the code uses (parameters split into blocks).
  const std::vector<std::vector<int64_t>>& code_segments() const { return segments_; }
  // CodeSpace::Update: whether the denominators are to be given for the synchronisation of optimiser
  // step `step` (frozen: the first compressed one, or the first after a resume; tracked: every
  // compressed one). set_denominators takes one positive (numel) float32 tensor per bucket, identical on
  // every rank, floors it at 1% of each segment's mean and keeps it (optimizer memory, in state_bytes()).
  bool denominators_due(int64_t step) const;
  void set_denominators(const std::vector<at::Tensor>& per_bucket);
  const std::vector<at::Tensor>& denominators() const { return denominator_; }

 private:
  OneBitOptions options_;
  std::vector<std::vector<int64_t>> segments_;
  std::vector<at::Tensor> residual_;  // per bucket: (numel) float32, counted as optimizer memory
  std::vector<at::Tensor> denominator_;  // CodeSpace::Update: per bucket (numel) float32 D, else empty
  std::vector<float> last_lambda_;
  WindowContext context_;
  Counts counts_;
};

// The segments of a parameter of `numel` elements coded with `block` elements per scale (0: one).
std::vector<int64_t> onebit_blocks(int64_t numel, int64_t block);

// ---- hook state in checkpoints -----------------------------------------------------------------
// Entries of a checkpoint's optimiser file that hold communication-hook state (each rank's onebit
// residuals: "dist.onebit_residual.rank<r>.bucket<b>").
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
// Collective (every rank calls it): rank 0 receives every rank's residuals as named entries; other ranks
// get nothing. Empty on every rank when the hook keeps no state.
NamedTensors gather_hook_state(const World& world, const CommHook& hook);
// The entries that are not hook or aggregator state ("dist." entries): what the optimiser imports.
NamedTensors without_hook_state(const NamedTensors& entries);
// This rank takes its residuals from `entries` when they were saved by the same number of ranks; returns
// a note for the user when the checkpoint's state cannot be used (residuals then start at zero).
std::string restore_hook_state(const World& world, CommHook& hook, const NamedTensors& entries);

// "none" | "fp16" | "onebit" (with `onebit`'s options). Throws naming `origin` and the key otherwise.
std::unique_ptr<CommHook> make_comm_hook(const std::string& name, const OneBitOptions& onebit,
                                         const std::string& origin);

}  // namespace ration::dist
