// launch.h — `ration launch`: start this node's ranks of a data-parallel job, as torchrun does.
// Owns: the per-rank environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
//       MASTER_PORT; on one node RATION_STORE_FILE, a file in a private directory of the launcher's, so the
//       rendezvous opens no network socket; RATION_PS_SERVERS), the child processes, their output (each
//       line prefixed "[rank k] "), forwarding SIGINT/SIGTERM, and the rule "one rank fails -> the job fails": the others get a grace period to
//       notice and name the lost rank themselves, then SIGTERM, then SIGKILL.
// Does not own: what the ranks run (normally `ration train`, which joins the world from those
//       variables: distributed/data_parallel.h) or the rendezvous itself (distributed/world.h).
//
// Exit status: 0 when every rank exited 0; 1 when one failed (the first failure is named: rank, exit
// code or signal); 2 for a usage error. Ranks die with the launcher (PR_SET_PDEATHSIG).
#pragma once
#include <string>
#include <vector>

namespace ration::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  // Dedicated parameter servers (dist.servers), started on node 0 after its workers: ranks
  // [nnodes * nproc_per_node, + servers). Every process gets RATION_PS_SERVERS=servers.
  int servers = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;           // 0: pick a free port (one node only)
  double grace_s = 15;               // after the first failure, before SIGTERM to the rest
  // Without it, -n may not exceed what this machine can run (max_ranks_per_node): a typo such as -n 1000
  // would otherwise fork until memory runs out.
  bool oversubscribe = false;
  std::string program;               // executable for every rank (default: this executable)
  std::vector<std::string> command;  // its arguments, e.g. {"train", "configs/cnn.toml"}
};

// The most ranks this machine runs without --oversubscribe: 4 per core, and one per 256 MiB of memory.
int max_ranks_per_node();
// Validates `options` (throws ration::Error naming the flag) and runs the job; returns the exit status.
// A SIGINT / SIGTERM while the ranks are being started stops the starting: the ranks started get it.
int launch(const LaunchOptions& options);

}  // namespace ration::dist
