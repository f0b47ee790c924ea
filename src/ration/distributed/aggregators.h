// aggregators.h — the builders of the aggregators (distributed/aggregator.h), one implementation file
// each; the factory (distributed/aggregator_factory.cpp) and the reducer's all-reduce constructor call them.
// Owns: nothing but these declarations. Does not own: which combination of [dist] keys picks which
//       builder (the factory's table).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ration/distributed/aggregator.h"
#include "ration/distributed/comm_hook.h"
#include "ration/distributed/ps_aggregation.h"
#include "ration/distributed/topology.h"

namespace ration::dist {

// allreduce_aggregator.cpp: every bucket all-reduced through `hook` (none, fp16, onebit). With onebit's
// frozen second moment or update-space code, `optimizer` must be AdamW (its second moment is frozen here;
// its denominators are handed to the hook); otherwise it may be null.
std::unique_ptr<Aggregator> make_allreduce_aggregator(std::unique_ptr<CommHook> hook,
                                                      optim::Optimizer* optimizer = nullptr,
                                                      const std::string& origin = "");
// ps_sync_aggregator.cpp: rank 0 sums every rank's gradient, steps, and sends its parameters back.
std::unique_ptr<Aggregator> make_sync_ps_aggregator();
// ps_partial_aggregator.cpp: backup workers or bounded asynchrony on a server copy of the model on rank 0.
std::unique_ptr<Aggregator> make_partial_ps_aggregator(const PsAggregationOptions& options);
// ps_group_aggregator.cpp: dist.servers = `servers` dedicated server processes hold the dense parameters
// (each server some whole parameters, balanced by size), with `options`' rule (sync, backup workers,
// bounded asynchrony). The aggregator is a worker's side; serve_parameter_shard is a server's: it serves
// until every worker has finished, sends worker 0 its final state and returns its report fragment.
// context.everyone is the whole job: workers are its ranks [0, N), servers [N, N + servers).
std::unique_ptr<Aggregator> make_ps_group_aggregator(const PsAggregationOptions& options, int servers);
nlohmann::json serve_parameter_shard(const AggregatorContext& context, const PsAggregationOptions& options,
                                     int servers);
// gossip_aggregator.cpp: each rank steps on its own gradient, then averages with its neighbours
// (synchronously, or with `async` by the push-sum protocol of distributed/gossip_async.h).
struct GossipOptions {
  GossipGraph graph = GossipGraph::Ring;
  int64_t disagreement_every = 0;  // measure the ranks' disagreement every this many steps (0: never)
  bool async = false;              // dist.gossip_async: wait for a neighbour only beyond max_staleness steps
  int64_t max_staleness = 1;       // dist.max_staleness (async only)
};
std::unique_ptr<Aggregator> make_gossip_aggregator(const GossipOptions& options = {});
// averaging_aggregator.cpp: local steps, parameters averaged (weighted) every `every` steps.
std::unique_ptr<Aggregator> make_averaging_aggregator(int64_t every);
// ensemble_aggregator.cpp: no exchange; each rank trains its own member (checkpoints hold every member).
std::unique_ptr<Aggregator> make_ensemble_aggregator();

}  // namespace ration::dist
