// topology.h — who exchanges with whom in data-parallel training: all-reduce (every rank gets the global
// gradient sum), a centralised parameter server (rank 0 sums the gradients, steps, and sends the
// parameters back) or gossip (each rank steps on its own gradient, then averages its parameters with its
// ring neighbours). See docs/DISTRIBUTED.md, "Topologies", and docs/METHODS.md.
// Owns: the Topology and Aggregate names, the server's gradient gather-and-sum, the server's parameter
//       send, the gossip neighbour average and synchronous push-sum step, the push-sum share and de-biasing
//       both gossip variants use (the asynchronous protocol is distributed/gossip_async.h), the weighted
//       parameter average (model averaging), and the exact bytes each of them hands to c10d.
// Does not own: bucketing, weighting and when a bucket leaves (distributed/reducer.h), how an all-reduce bucket
//       is coded (distributed/comm_hook.h), the optimiser.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ration/distributed/comm_hook.h"
#include "ration/distributed/world.h"

namespace ration::dist {

enum class Topology { AllReduce, ParameterServer, Gossip };
const char* to_string(Topology t);
// "allreduce" | "ps" | "gossip"; anything else: ration::Error naming `origin`, dist.topology and the choices.
Topology parse_topology(const std::string& text, const std::string& origin);

// The rank that serves the parameters in Topology::ParameterServer (it trains too).
constexpr int kServerRank = 0;

// Parameter server, one gradient bucket: every worker sends its weighted `flat` to the server, which
// receives them and adds them to its own in rank order (flat becomes the global sum on the server;
// a worker's flat is left as it was). Traffic: a worker sends flat's bytes, the server sends none.
Traffic reduce_to_server(const World& world, int bucket, at::Tensor& flat);

// Parameter server, after the server's optimiser step: the server sends its parameters (packed into one
// buffer) to every worker, which overwrites its own. Traffic: the server sends (N-1) x the parameters'
// bytes, a worker none.
Traffic send_parameters_from_server(const World& world, const std::vector<at::Tensor>& params);

// What the ranks combine (dist.aggregate): their gradients before every optimiser step (full or partial
// aggregation), their parameters every K steps after local steps (model averaging, local SGD: model
// fusion), or nothing while training and their predictions at evaluation (an ensemble of members, each
// trained on its own bootstrap sample, combined by voting; docs/METHODS.md, "Distributed training").
enum class Aggregate { Gradients, Parameters, Ensemble };
const char* to_string(Aggregate a);
// "gradients" | "parameters" | "ensemble"; anything else: ration::Error naming `origin`, dist.aggregate and the choices.
Aggregate parse_aggregate(const std::string& text, const std::string& origin);

// Model averaging: every rank's parameters become the weighted mean over ranks, sum_r w_r p_r / sum_r w_r
// (one all-reduce of the weighted parameters and the weight; `weight` is this rank's share of the samples
// since the last average). Traffic: the parameters' bytes plus one float, all-reduced.
Traffic average_parameters(const World& world, const std::vector<at::Tensor>& params, double weight);

// Gossip, after every rank's own optimiser step: each rank's parameters become the mean of its own and
// its ring neighbours' (rank-1 and rank+1 mod N: weights 1/3 each for N >= 3; for N = 2 the one
// neighbour, weights 1/2, which is the all-ranks average). Traffic: 2 x the parameters' bytes for
// N >= 3, 1 x for N = 2.
Traffic average_with_ring_neighbours(const World& world, const std::vector<at::Tensor>& params);

// Which gossip graph (dist.gossip_graph): the ring (both neighbours every step) or the time-varying
// exponential graph of stochastic gradient push (one peer per step, at distance 2^(step mod ceil(log2 N))).
enum class GossipGraph { Ring, Exponential };
const char* to_string(GossipGraph g);
// "ring" | "exponential"; anything else: ration::Error naming `origin`, dist.gossip_graph and the choices.
GossipGraph parse_gossip_graph(const std::string& text, const std::string& origin);

// Gossip on the exponential graph with push-sum weights, after every rank's own optimiser step of step
// `step`: with d = 2^(step mod ceil(log2 N)), each rank sends half of (w * params, w) to rank + d and keeps
// half, receives the half of rank - d, and its parameters become the de-biased x / w. `weight` is this
// rank's push-sum weight (1 at the start; it stays 1 while every rank sends every step, since each rank
// then has exactly one sender). Traffic: the parameters' bytes plus one float, to one peer.
Traffic push_sum_exponential(const World& world, const std::vector<at::Tensor>& params, int64_t step, double& weight);

// Parameters packed into one (sum of numels) float32 tensor, in order, and written back from one.
at::Tensor pack_parameters(const std::vector<at::Tensor>& params);
void unpack_parameters(const at::Tensor& flat, const std::vector<at::Tensor>& params);
// Push-sum: 1/parts of (weight * flat, weight) as one (numel + 1) float32 tensor (what a rank sends to
// each of parts - 1 peers and keeps itself). Both gossip variants compute their shares with it, so that
// the asynchronous one with max_staleness 0 is the synchronous one bitwise.
at::Tensor push_sum_share(const at::Tensor& flat, double weight, int parts);
// Push-sum: `acc` (numel + 1: the summed shares) de-biased into `params` (x / w); returns w.
double push_sum_debias(const at::Tensor& acc, const std::vector<at::Tensor>& params);

// How far apart the ranks' parameters are: sqrt(mean_r ||p_r - mean p||^2) / ||mean p|| (0 when every rank
// holds the same; two all-reduces, every rank must call it). A diagnostic: its bytes are not a topology's.
double parameter_disagreement(const World& world, const std::vector<at::Tensor>& params);

}  // namespace ration::dist
