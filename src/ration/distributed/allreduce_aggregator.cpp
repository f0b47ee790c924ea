// allreduce_aggregator.cpp — every bucket all-reduced through a communication hook (none, fp16, onebit),
// and onebit's coupling to AdamW: the second moment frozen after the fp32 warm-up, the update-space
// denominators handed to the hook (docs/DISTRIBUTED.md, "1-bit compression").
#include <nlohmann/json.hpp>

#include "ration/base/check.h"
#include "ration/distributed/aggregators.h"
#include "ration/optim/adamw.h"

namespace ration::dist {
namespace {

class AllReduceAggregator : public Aggregator {
 public:
  AllReduceAggregator(std::unique_ptr<CommHook> hook, optim::Optimizer* optimizer, const std::string& origin)
      : hook_(std::move(hook)), onebit_(dynamic_cast<OneBitHook*>(hook_.get())) {
    RATION_CHECK(hook_ != nullptr, "the allreduce aggregator needs a communication hook");
    if (!onebit_) return;
    const OneBitOptions& o = onebit_->options();
    const bool freeze = o.second_moment == SecondMoment::Freeze;
    if (!freeze && o.space == CodeSpace::Gradient) return;
    adamw_ = dynamic_cast<optim::AdamW*>(optimizer);
    RATION_CHECK(adamw_ != nullptr, origin,
                 ": dist.onebit_second_moment = \"freeze\" and dist.onebit_space = \"update\" use AdamW's second "
                 "moment; they need optim.name = \"adamw\" (SGD keeps none)");
    if (freeze) adamw_->freeze_second_moment(o.warmup_steps);
  }
  std::string name() const override { return "allreduce"; }
  std::string bucket_traffic() const override { return std::string(hook_->name()) + " all-reduce,"; }
  void init_buckets(const std::vector<BucketLayout>& layouts) override {
    layouts_ = layouts;
    std::vector<std::vector<int64_t>> segments;
    for (const BucketLayout& l : layouts) segments.push_back(l.numels);
    hook_->init(segments);
  }
  void begin_window(const WindowContext& context) override { hook_->begin_window(context); }
  Traffic on_bucket(const World& world, int bucket, at::Tensor& flat) override {
    return hook_->reduce(world, bucket, flat);
  }
  std::string attach(const AggregatorContext& context) override {
    return restore_hook_state(context.world, *hook_, context.resumed);
  }
  // Update space: AdamW's denominators before the window's compressed step.
  void before_backward(int64_t step) override {
    if (!onebit_ || !onebit_->denominators_due(step)) return;
    RATION_ASSERT(adamw_ != nullptr, "dist.onebit_space = \"update\" without an AdamW optimiser");
    onebit_->set_denominators(lay_out_as_buckets(layouts_, adamw_->denominators(), 1.f));
  }
  optim::NamedTensors gather_state(const World& world) override { return gather_hook_state(world, *hook_); }
  // onebit: the residuals (error feedback) and the frozen denominators (update space), one float each.
  int64_t fixed_bytes(int64_t num_parameters) const override {
    if (!onebit_) return 0;
    const OneBitOptions& o = onebit_->options();
    return ((o.feedback == ErrorFeedback::On ? 1 : 0) + (o.space == CodeSpace::Update ? 1 : 0)) * 4 * num_parameters;
  }
  int64_t state_bytes() const override { return hook_->state_bytes(); }
  // onebit: the smallest lambda_j of the last step's code per bucket (the error bound is
  // sqrt(1 - lambda^2) ||v||, docs/DISTRIBUTED.md) and bytes per compressed step apart from the fp32
  // warm-up (dist.compress_warmup), whose steps the whole-run average bytes_sent_per_step includes.
  nlohmann::json report() override {
    if (!onebit_) return nlohmann::json::object();
    const OneBitOptions& o = onebit_->options();
    const OneBitHook::Counts& c = onebit_->counts();
    nlohmann::json d;
    d["error_feedback"] = o.feedback == ErrorFeedback::On;
    d["onebit_lambda"] = onebit_->last_lambda();
    d["onebit"] = {{"warmup_steps", c.warmup_windows},
                   {"compressed_steps", c.compressed_windows},
                   {"bytes_sent_per_compressed_step",
                    c.compressed_windows ? static_cast<double>(c.compressed.payload_bytes) / c.compressed_windows : 0.0},
                   {"second_moment", o.second_moment == SecondMoment::Freeze ? "freeze" : "track"},
                   {"space", o.space == CodeSpace::Update ? "update" : "gradient"},
                   {"residual_bytes", onebit_->residual_bytes()},
                   {"denominator_bytes", onebit_->state_bytes() - onebit_->residual_bytes()}};
    return d;
  }

 private:
  std::unique_ptr<CommHook> hook_;
  OneBitHook* onebit_ = nullptr;   // hook_ when it is onebit
  optim::AdamW* adamw_ = nullptr;  // onebit's frozen moment or update space
  std::vector<BucketLayout> layouts_;
};

}  // namespace

std::unique_ptr<Aggregator> make_allreduce_aggregator(std::unique_ptr<CommHook> hook, optim::Optimizer* optimizer,
                                                      const std::string& origin) {
  return std::make_unique<AllReduceAggregator>(std::move(hook), optimizer, origin);
}

}  // namespace ration::dist
