// data_parallel.h — what `ration train` needs to run as one rank of a data-parallel job: the [dist]
// config keys, joining the world from the launcher's environment, the start-up agreement (same config
// everywhere, rank 0's parameters everywhere) and global sums and gathers of per-rank figures
// (evaluation, loss, AUC scores).
// Owns: DataParallelSettings and their validation, the config fingerprint, parameter broadcast,
//       all_reduce_doubles, all_gather_floats. Does not own: gradient synchronisation (distributed/reducer.h),
//       the data shard (data/dataset.h), the training loop (train/trainer.cpp).
//
// [dist] keys (all optional; they matter only when WORLD_SIZE > 1, except sync_every):
//   bucket_bytes        size, default 25MiB       cap of each gradient bucket (the first: first_bucket_bytes)
//   first_bucket_bytes  size, default 1MiB
//   sync_every          integer >= 1, default 1   backward passes (micro-batches) per synchronisation
//   topology            "allreduce" | "ps" | "gossip" (default "allreduce"; distributed/topology.h)
//   compress            "none" | "fp16" | "onebit" (default "none"; with topology "allreduce" only)
//   error_feedback      bool, default true        onebit: keep the residual per bucket
//   onebit_block        integer >= 0, default 1024 onebit: elements per scale (0: one per parameter)
//   onebit_lambda       number in [0, 1), 0.95    onebit: lambda_0 of the L2 scale (0: mean-|v| scale)
//   onebit_max_error    number in [0, 1), 0       onebit: set bound ||v_j - C(v_j)|| <= e ||v_j|| per block (0: none)
//   compress_warmup     integer >= 0, default optim.warmup_steps   onebit: optimiser steps reduced in fp32 first
//   onebit_second_moment "track" | "freeze"      onebit: AdamW's v after the warm-up (freeze: as at its end)
//   onebit_space        "gradient" | "update"     onebit: code g + e, or (g + e) / AdamW's denominator
//   timeout_s           integer >= 1, default 60  rendezvous and every collective; a lost rank is named
//                                                 within about this long
//   backup_workers      integer >= 0, default 0   topology "ps": each round aggregates the first N-k pushes
//   sync                "sync" | "async"          topology "ps": "async" applies each push as it arrives
//   max_staleness       integer >= 0, default 1   async: a worker runs at most this many pushes ahead; with
//                                                 gossip_async: steps a neighbour's message may lag
//   aggregate           "gradients" | "parameters"  "parameters": local steps, parameters averaged every
//                                                 sync_every steps (model averaging; allreduce only)
//   gossip_graph        "ring" | "exponential"    topology "gossip": both ring neighbours every step, or one
//                                                 peer per step at distance 2^(step mod ceil(log2 N)), push-sum
//   gossip_async        bool, default false       topology "gossip": push-sum without waiting for a neighbour
//                                                 beyond max_staleness steps (distributed/gossip_async.h)
//   disagreement_every  integer >= 0, default 10  topology "gossip": measure the ranks' disagreement every
//                                                 this many steps for the report (0: never); default 0 with
//                                                 gossip_async (the measurement is a barrier of every rank)
//   servers             integer >= 0, default 0 (or RATION_PS_SERVERS)  topology "ps": dedicated server
//                                                 processes holding the dense parameters, started by
//                                                 `ration launch --servers S` (ranks [N, N + S))
//   weights             array of numbers > 0, one per rank (default: none)   each rank's share of every
//                                                 step is weights[r] / sum(weights) instead of its share of
//                                                 the step's samples
//   debug_delay_ms      integer >= 0, default 0   test aid: rank debug_delay_rank sleeps this long per step
//   debug_delay_rank    integer, default -1       (-1: none)
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ration/core/value.h"
#include "ration/distributed/comm_hook.h"
#include "ration/distributed/ps_aggregation.h"
#include "ration/distributed/aggregators.h"
#include "ration/distributed/reducer.h"
#include "ration/distributed/topology.h"
#include "ration/distributed/world.h"
#include "ration/config/config.h"

namespace ration::dist {

struct DataParallelSettings {
  ReducerOptions reducer;         // bucket sizes, sync_every
  // Which aggregator (distributed/aggregator_factory.h): who exchanges with whom, what is combined.
  Topology topology = Topology::AllReduce;
  Aggregate aggregate = Aggregate::Gradients;
  int64_t average_every = 1;      // Aggregate::Parameters: local steps between averages
  // dist.gossip_graph, dist.disagreement_every, dist.gossip_async, dist.max_staleness (topology "gossip").
  GossipOptions gossip;
  // dist.weights: one per rank, each > 0 (empty: every rank weighs its share of the step's samples).
  std::vector<double> weights;
  std::string compress = "none";
  OneBitOptions onebit;  // error_feedback, onebit_block, compress_warmup
  int64_t timeout_s = 60;
  PsAggregationOptions ps;        // backup_workers, sync, max_staleness (distributed/ps_aggregation.h)
  int64_t servers = 0;            // dist.servers: dedicated parameter servers (distributed/aggregators.h)
  int64_t debug_delay_ms = 0;     // test aid: one rank made slow, deterministically
  int64_t debug_delay_rank = -1;
};
DataParallelSettings read_data_parallel_settings(Config& cfg);

// True when the environment names a world (WORLD_SIZE is set), as torchrun and `ration launch` do.
bool environment_names_a_world();
// The world from the environment (timeout from the settings unless RATION_DIST_TIMEOUT_S is set), or a
// one-process world when WORLD_SIZE is not set.
World join_world(const DataParallelSettings& settings);

// The job's processes by role. With dist.servers = S (`ration launch --servers S` sets RATION_PS_SERVERS=S
// in every process) ranks [0, N) of the world are workers and [N, N + S) dedicated parameter servers;
// otherwise every rank is a worker. Workers call it together (they open their own process group).
struct JobRoles {
  World everyone;   // the whole job
  World workers;    // on a worker: the workers' process group (everyone without servers); on a server: one
                    // process of its own
  int workers_count = 1;
  int server = -1;  // on a server: its index in [0, S); -1 on a worker
};
JobRoles split_roles(const World& everyone, int64_t servers, const std::string& origin);

// A 64-bit fingerprint of the effective configuration, leaving out keys that may differ per host
// (train.threads, data.dir, data.files, train.checkpoint_dir, offload.*, memory.*).
uint64_t config_fingerprint(const std::map<std::string, std::string>& effective);
// All-gathers the fingerprint; throws ration::Error naming the ranks whose configuration differs from
// rank 0's (same on every rank, so every rank stops).
void check_same_config(const World& world, const std::map<std::string, std::string>& effective,
                       const std::string& origin);

// All-gathers named numbers every rank must agree on (the run's total steps, the step it starts from);
// throws ration::Error naming the first that differs, every rank's value and the ranks that differ from
// rank 0 (the same on every rank, so every rank stops before a collective could go out of step).
void check_same_numbers(const World& world, const std::vector<std::pair<std::string, int64_t>>& named,
                        const std::string& origin);

// Every rank's parameters and buffers become rank 0's (in order; shapes must match).
void broadcast_from_rank0(const World& world, const std::vector<std::pair<std::string, Value>>& params,
                          const std::vector<std::pair<std::string, at::Tensor>>& buffers);

// Element-wise sums over ranks of a few doubles (float64 all-reduce; identity on one process).
std::vector<double> all_reduce_doubles(const World& world, const std::vector<double>& values);

// Every rank's `values` (of any length, possibly 0), concatenated in rank order, on every rank (two
// all-gathers: the lengths, then the values padded to the longest). Global metrics that are not sums
// (AUC) are computed from these.
std::vector<float> all_gather_floats(const World& world, const std::vector<float>& values);

}  // namespace ration::dist
