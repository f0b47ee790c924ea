// gossip_aggregator.cpp — gossip: no gradient travels; each rank steps on its own mean gradient, then
// averages its parameters with its neighbours': both ring neighbours every step, or one peer per step on
// the time-varying exponential graph with push-sum weights (distributed/topology.h; docs/DISTRIBUTED.md,
// "Gossip"). Every `disagreement_every` steps the ranks' disagreement is measured (two all-reduces, not
// counted as the topology's bytes) and kept for the report.
#include <nlohmann/json.hpp>

#include "ration/core/trace.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/topology.h"

namespace ration::dist {
namespace {

class GossipAggregator : public Aggregator {
 public:
  explicit GossipAggregator(const GossipOptions& options) : options_(options) {}
  std::string name() const override { return "gossip"; }
  bool owns_gradient() const override { return true; }
  std::optional<Traffic> after_optimizer(const World& world, const std::vector<at::Tensor>& params, int64_t step,
                                         double window_weight) override {
    if (world.size() <= 1) return std::nullopt;
    TraceRegion span("collectives", "collective", "gossip parameters");
    const Traffic traffic = options_.graph == GossipGraph::Ring ? average_with_ring_neighbours(world, params)
                                                                : push_sum_exponential(world, params, step, weight_);
    if (options_.disagreement_every > 0 && ++exchanges_ % options_.disagreement_every == 0)
      disagreement_.push_back({step, parameter_disagreement(world, params)});
    return traffic;
  }
  nlohmann::json report() override {
    nlohmann::json d = {{"gossip_graph", to_string(options_.graph)}, {"push_sum_weight", weight_}};
    nlohmann::json curve = nlohmann::json::array();
    for (const auto& [step, value] : disagreement_) curve.push_back({{"step", step}, {"disagreement", value}});
    d["disagreement"] = curve;
    return d;
  }

 private:
  GossipOptions options_;
  double weight_ = 1;  // push-sum weight (exponential graph)
  int64_t exchanges_ = 0;
  std::vector<std::pair<int64_t, double>> disagreement_;
};

}  // namespace

std::unique_ptr<Aggregator> make_gossip_aggregator(const GossipOptions& options) {
  return std::make_unique<GossipAggregator>(options);
}

}  // namespace ration::dist
