// world.h — the set of cooperating processes and the collectives between them, over PyTorch's c10d.
// Owns: World (rank, size, the c10d process group: Gloo for CPU tensors, NCCL under RATION_CUDA),
//       rendezvous from the environment (TCPStore or FileStore), the blocking collective helpers every
//       distributed feature builds on (all-reduce, all-gather, all-to-all, broadcast, barrier), and
//       C10dReplicaGroup (core/saved_value.h's ReplicaGroup over this world).
// Does not own: the autograd graph (core/) or any training policy (tensor / data parallel live beside it).
//
// Rendezvous (World::init), in the usual torch.distributed names:
//   RANK           this process, an integer in [0, WORLD_SIZE)
//   WORLD_SIZE     number of processes, an integer >= 1
//   MASTER_ADDR    host of rank 0, which serves the TCPStore (e.g. 127.0.0.1)
//   MASTER_PORT    its port, an integer in [1, 65535]
//   RATION_STORE_FILE=/path   when set, a FileStore at /path replaces MASTER_ADDR/MASTER_PORT
//                             (every rank must see the same file; use a fresh path per run)
// Optional: RATION_DIST_BACKEND=gloo|nccl (default gloo; nccl needs -DRATION_CUDA=ON),
//           RATION_DIST_TIMEOUT_S (seconds, default 300) for rendezvous and every collective,
//           GLOO_SOCKET_IFNAME to bind Gloo to one network interface.
//
// Collectives are blocking and must be called by every rank in the same order with tensors of the same
// shape and dtype (c10d's contract). World is a cheap shared handle: copies share one process group, so
// autograd closures may capture it by value.
#pragma once
#include <ATen/ATen.h>
#include <torch/version.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ration/base/check.h"
#include "ration/core/saved_value.h"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ration::dist {

// The c10d object that runs collectives. In torch 1.13 ProcessGroupGloo/NCCL derive from ProcessGroup;
// from torch 2.0 they derive from Backend (ProcessGroup became a dispatching wrapper).
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

// A collective that failed (a peer exited, was killed, or timed out). Distinct from other errors so that
// callers can diagnose which rank was lost (distributed/liveness.h) before reporting.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

enum class Backend { Gloo, Nccl };
const char* to_string(Backend b);

struct WorldOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // rendezvous and each collective
};

class World {
 public:
  // Rendezvous from the process environment (see the file comment). Throws ration::Error naming the
  // variable and its expected form when one is missing or malformed.
  static World init(const WorldOptions& options = {});
  // Same, reading variables from `env` instead of the process environment (tests, embedding).
  static World init_from(const std::map<std::string, std::string>& env, const WorldOptions& options = {});
  // One process, rank 0 of 1, no environment needed; collectives are identities (no store, no sockets).
  static World init_single();

  World() = default;  // not a world: defined() is false
  bool defined() const { return state_ != nullptr; }
  int rank() const;
  int size() const;
  Backend backend() const;
  // Where this world's collectives expect tensors: CPU for Gloo, this rank's GPU for NCCL.
  at::Device device() const;
  // The c10d process group; null for init_single().
  const c10::intrusive_ptr<Collectives>& process_group() const;
  // The rendezvous store (TCPStore served by rank 0, or FileStore); null for init_single().
  const c10::intrusive_ptr<c10d::Store>& store() const;

  // In place: t becomes the element-wise sum of every rank's t.
  void all_reduce_sum(at::Tensor& t) const;
  // Every rank's t (same shape everywhere) flattened and concatenated in rank order:
  // 1-D, size() * t.numel() elements, t's dtype.
  at::Tensor all_gather(const at::Tensor& t) const;
  // In place: every rank's t becomes root's t.
  void broadcast(at::Tensor& t, int root = 0) const;
  // Returns once every rank has called it.
  void barrier() const;
  // Point-to-point: issues every send (tensor to rank) and every receive (into tensor, from rank), then
  // waits for all of them, so two ranks may send to each other in the same call without deadlock. The
  // peer must issue the matching receive / send with the same tag, shape and dtype.
  using PeerTensors = std::vector<std::pair<int, at::Tensor>>;
  void send_recv(const PeerTensors& sends, const PeerTensors& recvs, int tag) const;
  // All-to-all of pieces of any length: pieces[r] (1-D, one dtype for all) goes to rank r, this rank's own
  // piece included; returns what every rank sent to this one, in rank order (1-D, the pieces' dtype; empty
  // pieces allowed). Two c10d alltoall_base calls: the lengths (one int64 per pair), then the pieces
  // concatenated, each padded by one element so that no split is empty. Every rank calls it in the same
  // order with pieces of the same dtype.
  std::vector<at::Tensor> all_to_all(const std::vector<at::Tensor>& pieces) const;

  // A second process group over the same ranks and rendezvous store (key prefix "ration/<name>"), with
  // this world's backend and timeout: traffic on it never pairs with this world's collectives, so one
  // thread may use it while another issues collectives here. Every rank must call it, in the same order,
  // with the same name (store keys "ration/<name>/<how many channels this world opened before>"). A
  // one-process world returns another one-process world.
  World open_channel(const std::string& name) const;
  // A process group of some of this world's ranks (`members`, distinct, in the order that gives their
  // ranks in the group), over the same store, backend and timeout. Only members call it, each with the same
  // name and members, in the same order among the subgroups of that name (store keys
  // "ration/sub/<name>/<how many of that name this process opened before>"). Throws when this rank is not
  // a member.
  World subgroup(const std::string& name, const std::vector<int>& members) const;

  // This world as a memory ReplicaGroup (one shared instance per world).
  std::shared_ptr<ReplicaGroup> replica_group() const;

 private:
  struct State;
  World open_group(const std::string& key, const std::string& name, int rank, int size) const;
  std::shared_ptr<State> state_;
  const State& state() const;
};

// ReplicaGroup over a World: all_gather of 1-D uint8 shards, concatenated in rank order. With NCCL the
// shard travels through the world's GPU and the result comes back on the shard's device.
class C10dReplicaGroup : public ReplicaGroup {
 public:
  explicit C10dReplicaGroup(World world);
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  at::Tensor all_gather(const at::Tensor& shard) override;

 private:
  World world_;
};

}  // namespace ration::dist
