// aggregator_factory.h — which aggregator a run's [dist] keys choose, and whether they combine.
// Owns: the table of aggregators (one row each: dist.topology, dist.aggregate, the parameter server's
//       mode, whether dist.compress may be other than "none", the builder), its checks (errors name the
//       config and the keys) and make_aggregator. Does not own: reading the keys
//       (distributed/data_parallel.h), the aggregators themselves (distributed/aggregators.h).
#pragma once
#include <memory>
#include <string>

#include "ration/distributed/aggregator.h"
#include "ration/distributed/data_parallel.h"

namespace ration::dist {

// What a run's loop must know of its aggregator besides the interface: `members` — each rank trains a
// model of its own on its own sample of the whole training set (bootstrap, its own seed; no shards), and
// evaluation combines the members' predictions.
struct AggregationTraits {
  bool members = false;
};
AggregationTraits aggregation_traits(const DataParallelSettings& settings, const std::string& origin);

// Throws ration::Error naming `origin` and the keys when the settings' topology, aggregate, parameter
// server mode and compression have no row in the table.
void check_aggregation(const DataParallelSettings& settings, const std::string& origin);
// The aggregator of the settings' row (checked as above). `optimizer`: the run's (onebit's AdamW
// coupling); may be null when the row does not need it.
std::unique_ptr<Aggregator> make_aggregator(const DataParallelSettings& settings, optim::Optimizer* optimizer,
                                            const std::string& origin);

}  // namespace ration::dist
