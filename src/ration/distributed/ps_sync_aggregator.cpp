// ps_sync_aggregator.cpp — the synchronous parameter server: every bucket goes to rank 0, which sums it
// with its own (rank order), steps like every rank, and sends its parameters to every worker after the
// step (distributed/topology.h's exchanges; docs/DISTRIBUTED.md, "Topologies").
#include "ration/core/trace.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/topology.h"

namespace ration::dist {
namespace {

class SyncPsAggregator : public Aggregator {
 public:
  std::string name() const override { return "ps"; }
  Traffic on_bucket(const World& world, int bucket, at::Tensor& flat) override {
    return reduce_to_server(world, bucket, flat);
  }
  std::optional<Traffic> after_optimizer(const World& world, const std::vector<at::Tensor>& params, int64_t step,
                                         double window_weight) override {
    if (world.size() <= 1) return std::nullopt;
    TraceRegion span("collectives", "collective", "ps parameters");
    return send_parameters_from_server(world, params);
  }
};

}  // namespace

std::unique_ptr<Aggregator> make_sync_ps_aggregator() { return std::make_unique<SyncPsAggregator>(); }

}  // namespace ration::dist
