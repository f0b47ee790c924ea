// topology.cpp — parameter-server and gossip exchanges over c10d point-to-point (see topology.h).
#include "ration/distributed/topology.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "ration/base/check.h"

namespace ration::dist {
namespace {

constexpr int kParameterTag = 1 << 20;  // above every bucket index (bucket tags are the index)

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

at::Tensor pack_parameters(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  flat.reserve(params.size());
  for (const at::Tensor& p : params) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

void unpack_parameters(const at::Tensor& flat, const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& p : params) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

at::Tensor push_sum_share(const at::Tensor& flat, double weight, int parts) {
  at::NoGradGuard no_grad;
  const int64_t numel = flat.numel();
  at::Tensor share = at::empty({numel + 1}, at::kFloat);  // (P + 1): w x / parts, then w / parts
  share.narrow(0, 0, numel).copy_(flat).mul_(weight / parts);
  share[numel] = static_cast<float>(weight / parts);
  return share;
}

double push_sum_debias(const at::Tensor& acc, const std::vector<at::Tensor>& params) {
  const int64_t numel = acc.numel() - 1;
  const double weight = acc[numel].item<double>();
  unpack_parameters(acc.narrow(0, 0, numel).div(weight), params);
  return weight;
}

const char* to_string(Topology t) {
  switch (t) {
    case Topology::AllReduce: return "allreduce";
    case Topology::ParameterServer: return "ps";
    case Topology::Gossip: return "gossip";
  }
  return "?";
}

Topology parse_topology(const std::string& text, const std::string& origin) {
  for (Topology t : {Topology::AllReduce, Topology::ParameterServer, Topology::Gossip})
    if (text == to_string(t)) return t;
  throw Error(detail::str(origin, ": dist.topology must be one of \"allreduce\", \"ps\", \"gossip\"; got \"", text,
                          "\""));
}

const char* to_string(Aggregate a) {
  switch (a) {
    case Aggregate::Gradients: return "gradients";
    case Aggregate::Parameters: return "parameters";
    case Aggregate::Ensemble: return "ensemble";
  }
  return "?";
}

Aggregate parse_aggregate(const std::string& text, const std::string& origin) {
  for (Aggregate a : {Aggregate::Gradients, Aggregate::Parameters, Aggregate::Ensemble})
    if (text == to_string(a)) return a;
  throw Error(detail::str(origin, ": dist.aggregate must be one of \"gradients\", \"parameters\", \"ensemble\"; got \"", text,
                          "\""));
}

Traffic average_parameters(const World& world, const std::vector<at::Tensor>& params, double weight) {
  if (world.size() <= 1) return {};
  at::NoGradGuard no_grad;
  const at::Tensor mine = pack_parameters(params);
  at::Tensor flat = at::empty({mine.numel() + 1}, at::kFloat);  // (P + 1) w * params, then w
  flat.narrow(0, 0, mine.numel()).copy_(mine).mul_(weight);
  flat[mine.numel()] = static_cast<float>(weight);
  world.all_reduce_sum(flat);
  const float total = flat[mine.numel()].item<float>();
  at::Tensor mean = flat.narrow(0, 0, mine.numel());
  if (total > 0) mean.div_(total);
  unpack_parameters(mean, params);
  Traffic traffic;
  traffic.payload_bytes = bytes_of(flat);
  traffic.wire_bytes = 2 * (world.size() - 1) * bytes_of(flat) / world.size();
  return traffic;
}

Traffic reduce_to_server(const World& world, int bucket, at::Tensor& flat) {
  const int n = world.size();
  if (n <= 1) return {};
  Traffic traffic;
  if (world.rank() != kServerRank) {
    world.send_recv({{kServerRank, flat}}, {}, bucket);
    traffic.payload_bytes = traffic.wire_bytes = bytes_of(flat);
    return traffic;
  }
  World::PeerTensors from_workers;
  for (int r = 0; r < n; ++r)
    if (r != kServerRank) from_workers.emplace_back(r, at::empty_like(flat));
  world.send_recv({}, from_workers, bucket);
  at::NoGradGuard no_grad;
  for (const auto& [rank, g] : from_workers) flat.add_(g);  // rank order: deterministic
  return traffic;
}

Traffic send_parameters_from_server(const World& world, const std::vector<at::Tensor>& params) {
  const int n = world.size();
  if (n <= 1) return {};
  Traffic traffic;
  if (world.rank() == kServerRank) {
    const at::Tensor flat = pack_parameters(params);
    World::PeerTensors to_workers;
    for (int r = 0; r < n; ++r)
      if (r != kServerRank) to_workers.emplace_back(r, flat);
    world.send_recv(to_workers, {}, kParameterTag);
    traffic.payload_bytes = traffic.wire_bytes = bytes_of(flat) * (n - 1);
    return traffic;
  }
  int64_t numel = 0;
  for (const at::Tensor& p : params) numel += p.numel();
  at::Tensor flat = at::empty({numel}, at::kFloat);
  world.send_recv({}, {{kServerRank, flat}}, kParameterTag);
  unpack_parameters(flat, params);
  return traffic;
}

Traffic average_with_ring_neighbours(const World& world, const std::vector<at::Tensor>& params) {
  const int n = world.size();
  if (n <= 1) return {};
  const int rank = world.rank();
  const at::Tensor mine = pack_parameters(params);
  const int left = (rank + n - 1) % n, right = (rank + 1) % n;
  World::PeerTensors sends{{right, mine}}, recvs{{left, at::empty_like(mine)}};
  if (n > 2) {
    sends.emplace_back(left, mine);
    recvs.emplace_back(right, at::empty_like(mine));
  }
  // Two tags: to the right neighbour and to the left one, so that for N >= 3 each receive pairs with the
  // right send even though both neighbours send the same shape.
  world.send_recv({sends[0]}, {recvs[0]}, kParameterTag + 1);
  if (n > 2) world.send_recv({sends[1]}, {recvs[1]}, kParameterTag + 2);
  at::Tensor mean = mine.clone();
  for (const auto& [peer, t] : recvs) mean.add_(t);
  mean.div_(static_cast<double>(recvs.size() + 1));
  unpack_parameters(mean, params);
  Traffic traffic;
  traffic.payload_bytes = traffic.wire_bytes = bytes_of(mine) * static_cast<int64_t>(sends.size());
  return traffic;
}

const char* to_string(GossipGraph g) { return g == GossipGraph::Ring ? "ring" : "exponential"; }

GossipGraph parse_gossip_graph(const std::string& text, const std::string& origin) {
  for (GossipGraph g : {GossipGraph::Ring, GossipGraph::Exponential})
    if (text == to_string(g)) return g;
  throw Error(detail::str(origin, ": dist.gossip_graph must be one of \"ring\", \"exponential\"; got \"", text, "\""));
}

Traffic push_sum_exponential(const World& world, const std::vector<at::Tensor>& params, int64_t step, double& weight) {
  const int n = world.size();
  if (n <= 1) return {};
  int distances = 0;  // ceil(log2 n): the distances 1, 2, 4, ... below n
  while ((1 << distances) < n) ++distances;
  const int d = 1 << static_cast<int>(step % distances);
  const int to = (world.rank() + d) % n, from = (world.rank() - d % n + n) % n;
  at::NoGradGuard no_grad;
  at::Tensor half = push_sum_share(pack_parameters(params), weight, 2);
  at::Tensor received = at::empty_like(half);
  world.send_recv({{to, half}}, {{from, received}}, kParameterTag + 3);
  half.add_(received);  // this rank's kept half plus the sender's
  weight = push_sum_debias(half, params);
  Traffic traffic;
  traffic.payload_bytes = traffic.wire_bytes = bytes_of(half);
  return traffic;
}

double parameter_disagreement(const World& world, const std::vector<at::Tensor>& params) {
  if (world.size() <= 1) return 0;
  at::NoGradGuard no_grad;
  const at::Tensor mine = pack_parameters(params).to(at::kDouble);
  at::Tensor mean = mine.clone();
  world.all_reduce_sum(mean);
  mean.div_(world.size());
  at::Tensor sq = (mine - mean).pow(2).sum().reshape({1});
  world.all_reduce_sum(sq);
  const double norm = mean.norm().item<double>();
  const double rms = std::sqrt(sq.item<double>() / world.size());
  return norm > 0 ? rms / norm : rms;
}

}  // namespace ration::dist
