// averaging_aggregator.cpp — model averaging (local SGD, dist.aggregate = "parameters"): no gradient
// travels; each rank steps on its own mean gradient and every K-th step (and at the end of the run) every
// rank's parameters become their sample-weighted mean (distributed/topology.h's average_parameters;
// docs/DISTRIBUTED.md, "Model averaging").
#include <nlohmann/json.hpp>

#include "ration/core/trace.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/topology.h"

namespace ration::dist {
namespace {

class AveragingAggregator : public Aggregator {
 public:
  explicit AveragingAggregator(int64_t every) : every_(every) {}
  std::string name() const override { return "allreduce"; }
  bool owns_gradient() const override { return true; }
  std::optional<Traffic> after_optimizer(const World& world, const std::vector<at::Tensor>& params, int64_t step,
                                         double window_weight) override {
    weight_since_ += window_weight;
    if (++steps_since_ < every_) return std::nullopt;
    return average_now(world, params);
  }
  std::optional<Traffic> finish(const World& world, const std::vector<at::Tensor>& params) override {
    return average_now(world, params);  // one final model on every rank
  }
  nlohmann::json report() override {
    return {{"aggregate", "parameters"}, {"average_every", every_}, {"averages", averages_}};
  }

 private:
  std::optional<Traffic> average_now(const World& world, const std::vector<at::Tensor>& params) {
    if (steps_since_ == 0 || world.size() <= 1) return std::nullopt;
    TraceRegion span("collectives", "collective", "parameter average");
    const Traffic traffic = average_parameters(world, params, weight_since_);
    steps_since_ = 0;
    weight_since_ = 0;
    ++averages_;
    return traffic;
  }
  int64_t every_;
  int64_t steps_since_ = 0;  // local steps not yet averaged
  double weight_since_ = 0;  // and this rank's share of their samples
  int64_t averages_ = 0;
};

}  // namespace

std::unique_ptr<Aggregator> make_averaging_aggregator(int64_t every) {
  return std::make_unique<AveragingAggregator>(every);
}

}  // namespace ration::dist
