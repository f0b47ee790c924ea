// aggregator_factory.cpp — the table of aggregators and its checks (see aggregator_factory.h).
#include "ration/distributed/aggregator_factory.h"

#include <functional>
#include <vector>

#include "ration/base/check.h"
#include "ration/distributed/aggregators.h"

namespace ration::dist {
namespace {

using Builder = std::function<std::unique_ptr<Aggregator>(const DataParallelSettings&, optim::Optimizer*,
                                                          const std::string& origin)>;
struct Row {
  Topology topology;
  Aggregate aggregate;
  PsAggregation mode;
  bool compresses;   // dist.compress may be "fp16" or "onebit"
  bool servers;      // dist.servers > 0: dedicated parameter servers
  const char* what;  // the row as the user names it, for messages
  Builder build;
  AggregationTraits traits = {};
};

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {Topology::AllReduce, Aggregate::Gradients, PsAggregation::Synchronous, true, false, "dist.topology = \"allreduce\"",
       [](const DataParallelSettings& s, optim::Optimizer* optimizer, const std::string& origin) {
         return make_allreduce_aggregator(make_comm_hook(s.compress, s.onebit, origin), optimizer, origin);
       }},
      {Topology::AllReduce, Aggregate::Parameters, PsAggregation::Synchronous, false, false,
       "dist.aggregate = \"parameters\" (model averaging)",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_averaging_aggregator(s.average_every);
       }},
      {Topology::ParameterServer, Aggregate::Gradients, PsAggregation::Synchronous, false, false, "dist.topology = \"ps\"",
       [](const DataParallelSettings&, optim::Optimizer*, const std::string&) { return make_sync_ps_aggregator(); }},
      {Topology::ParameterServer, Aggregate::Gradients, PsAggregation::BackupWorkers, false, false,
       "dist.topology = \"ps\" with dist.backup_workers",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_partial_ps_aggregator(s.ps);
       }},
      {Topology::ParameterServer, Aggregate::Gradients, PsAggregation::BoundedAsync, false, false,
       "dist.topology = \"ps\" with dist.sync = \"async\"",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_partial_ps_aggregator(s.ps);
       }},
      {Topology::ParameterServer, Aggregate::Gradients, PsAggregation::Synchronous, false, true,
       "dist.topology = \"ps\" with dist.servers",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_ps_group_aggregator(s.ps, static_cast<int>(s.servers));
       }},
      {Topology::ParameterServer, Aggregate::Gradients, PsAggregation::BackupWorkers, false, true,
       "dist.topology = \"ps\" with dist.servers and dist.backup_workers",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_ps_group_aggregator(s.ps, static_cast<int>(s.servers));
       }},
      {Topology::ParameterServer, Aggregate::Gradients, PsAggregation::BoundedAsync, false, true,
       "dist.topology = \"ps\" with dist.servers and dist.sync = \"async\"",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_ps_group_aggregator(s.ps, static_cast<int>(s.servers));
       }},
      {Topology::AllReduce, Aggregate::Ensemble, PsAggregation::Synchronous, false, false,
       "dist.aggregate = \"ensemble\"",
       [](const DataParallelSettings&, optim::Optimizer*, const std::string&) { return make_ensemble_aggregator(); },
       {/*members=*/true}},
      {Topology::Gossip, Aggregate::Gradients, PsAggregation::Synchronous, false, false, "dist.topology = \"gossip\"",
       [](const DataParallelSettings& s, optim::Optimizer*, const std::string&) {
         return make_gossip_aggregator(s.gossip);
       }},
  };
  return rows;
}

std::string combinations() {
  std::string out;
  for (const Row& r : table()) out += std::string(out.empty() ? "" : "; ") + r.what;
  return out;
}

const Row& row_of(const DataParallelSettings& s, const std::string& origin) {
  const char* mode = s.ps.mode == PsAggregation::BoundedAsync ? "dist.sync = \"async\"" : "dist.backup_workers > 0";
  RATION_CHECK(s.ps.mode == PsAggregation::Synchronous || s.topology == Topology::ParameterServer, origin, ": ", mode,
               " needs dist.topology = \"ps\" (the server is where a late gradient can be dropped or a push applied "
               "on its own; \"allreduce\" and \"gossip\" sum every rank in every collective), got dist.topology = \"",
               to_string(s.topology), "\"");
  RATION_CHECK(s.servers == 0 || (s.topology == Topology::ParameterServer && s.aggregate == Aggregate::Gradients),
               origin, ": dist.servers = ", s.servers, " starts dedicated parameter servers; it needs dist.topology = "
               "\"ps\" (and dist.aggregate = \"gradients\"), got dist.topology = \"", to_string(s.topology), "\"");
  for (const Row& r : table()) {
    if (r.topology != s.topology || r.aggregate != s.aggregate || r.mode != s.ps.mode || r.servers != (s.servers > 0))
      continue;
    RATION_CHECK(r.compresses || s.compress == "none", origin, ": ", r.what, " sends fp32 gradients or parameters; "
                 "dist.compress must be \"none\" with it (compression applies to dist.topology = \"allreduce\" with "
                 "dist.aggregate = \"gradients\" only), got \"", s.compress, "\"");
    RATION_CHECK(r.topology == Topology::Gossip || !s.gossip.async, origin, ": dist.gossip_async = true applies to "
                 "dist.topology = \"gossip\" only (asynchrony for \"ps\" is dist.sync = \"async\"), got dist.topology = \"",
                 to_string(s.topology), "\"", s.aggregate != Aggregate::Gradients ? " with dist.aggregate = \"" +
                 std::string(to_string(s.aggregate)) + "\"" : std::string());
    RATION_CHECK(r.topology == Topology::Gossip || s.gossip.graph == GossipGraph::Ring, origin,
                 ": dist.gossip_graph = \"", to_string(s.gossip.graph), "\" applies to dist.topology = \"gossip\" only, "
                 "got dist.topology = \"", to_string(s.topology), "\"");
    return r;
  }
  throw Error(detail::str(origin, ": dist.topology = \"", to_string(s.topology), "\" and dist.aggregate = \"",
                          to_string(s.aggregate), "\" (", to_string(s.ps.mode), ") do not combine; the aggregators are: ",
                          combinations()));
}

}  // namespace

AggregationTraits aggregation_traits(const DataParallelSettings& settings, const std::string& origin) {
  return row_of(settings, origin).traits;
}

void check_aggregation(const DataParallelSettings& settings, const std::string& origin) {
  (void)row_of(settings, origin);
}

std::unique_ptr<Aggregator> make_aggregator(const DataParallelSettings& settings, optim::Optimizer* optimizer,
                                            const std::string& origin) {
  return row_of(settings, origin).build(settings, optimizer, origin);
}

}  // namespace ration::dist
