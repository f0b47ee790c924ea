// gossip_aggregator.cpp — gossip: no gradient travels; each rank steps on its own mean gradient, then
// averages its parameters with its neighbours': both ring neighbours every step, or one peer per step on
// the time-varying exponential graph with push-sum weights (distributed/topology.h; docs/DISTRIBUTED.md,
// "Gossip"). Synchronous by default: each exchange waits for the peers' parameters of the same step. With
// dist.gossip_async = true the push-sum protocol of distributed/gossip_async.h runs instead (either graph;
// the ring with push-sum thirds): a rank waits for a neighbour only beyond dist.max_staleness steps, and
// finish() drains every message in flight. Every `disagreement_every` steps the ranks' disagreement is
// measured (two all-reduces, not counted as the topology's bytes; under async gossip a barrier of every
// rank, so its default there is 0) and kept for the report. At the end every rank holds the ranks' mean.
#include <nlohmann/json.hpp>

#include "ration/core/trace.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/gossip_async.h"
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
    Traffic traffic;
    if (options_.async) {
      if (!async_) async_ = std::make_unique<AsyncPushSum>(world, options_.graph, options_.max_staleness);
      traffic = async_->exchange(params, step);
      weight_ = async_->weight();
    } else {
      traffic = options_.graph == GossipGraph::Ring ? average_with_ring_neighbours(world, params)
                                                    : push_sum_exponential(world, params, step, weight_);
    }
    if (options_.disagreement_every > 0 && ++exchanges_ % options_.disagreement_every == 0)
      disagreement_.push_back({step, parameter_disagreement(world, params)});
    return traffic;
  }
  // Asynchronous gossip: every message in flight is mixed in (the 'finished' messages are not counted as
  // traffic: they carry no mass).
  // Then the run's final model is the ranks' mean (one all-reduce, as model averaging ends), after the
  // disagreement it removes is measured; its bytes are reported apart from the per-step traffic.
  std::optional<Traffic> finish(const World& world, const std::vector<at::Tensor>& params) override {
    if (async_) {
      async_->finish(params);
      weight_ = async_->weight();
    }
    if (world.size() <= 1) return std::nullopt;
    final_disagreement_ = parameter_disagreement(world, params);
    TraceRegion span("collectives", "collective", "gossip final average");
    final_average_bytes_ = average_parameters(world, params, 1.0).payload_bytes;
    return std::nullopt;
  }
  nlohmann::json report() override {
    nlohmann::json d = {{"gossip_graph", to_string(options_.graph)}, {"push_sum_weight", weight_},
                        {"gossip_async", options_.async}};
    if (async_) {
      const AsyncGossipStats s = async_->stats();
      d["max_staleness"] = options_.max_staleness;
      d["gossip"] = {{"exchanges", s.exchanges}, {"waits", s.waits},        {"wait_ms", s.wait_ms},
                     {"mixed", s.mixed},         {"drained", s.drained},    {"staleness_max", s.staleness_max},
                     {"staleness_mean", s.staleness_mean}};
    }
    nlohmann::json curve = nlohmann::json::array();
    for (const auto& [step, value] : disagreement_) curve.push_back({{"step", step}, {"disagreement", value}});
    d["disagreement"] = curve;
    if (final_average_bytes_ > 0)
      d["final_average"] = {{"disagreement_before", final_disagreement_}, {"bytes", final_average_bytes_}};
    return d;
  }

 private:
  GossipOptions options_;
  double weight_ = 1;  // push-sum weight (exponential graph; both graphs when asynchronous)
  std::unique_ptr<AsyncPushSum> async_;
  int64_t exchanges_ = 0;
  std::vector<std::pair<int64_t, double>> disagreement_;
  double final_disagreement_ = 0;
  int64_t final_average_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Aggregator> make_gossip_aggregator(const GossipOptions& options) {
  return std::make_unique<GossipAggregator>(options);
}

}  // namespace ration::dist
