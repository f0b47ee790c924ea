// parallel_layout.h — how a job's N processes split one model: tensor-parallel shards, pipeline stages and
// data-parallel replicas (N = T x P x D), and the process groups that go with them, built once.
// Owns: the [parallel] keys and their validation, the layout (which rank holds which stage, shard and
//       replica; ranks laid out tensor-innermost, then replica, then stage), and ParallelGroups (one c10d
//       subgroup per dimension, the replica's model-parallel group, and the first and last stages' pair
//       for a weight both use). Does not own: what runs over the groups (train/model_parallel_step.h, the
//       models' tensor-parallel forms, ctr's feature split) — see docs/DISTRIBUTED.md, "Model and hybrid
//       parallelism".
//
// [parallel] keys (all optional):
//   tensor         integer >= 1, default 1     processes one layer is split over (attention heads, MLP columns)
//   pipeline       integer >= 1, default 1     consecutive groups of layers (stages), one per process
//   micro_batches  integer >= 1, default pipeline   pieces of each batch the pipeline streams (the batch must
//                                              divide into them)
//   schedule       "1f1b" | "gpipe", default "1f1b"   1f1b: stage s holds at most P - s micro-batches;
//                                              gpipe: every forward, then every backward (all M held)
//   split          "time" | "bytes" | "uniform", default "time"   how the pipeline's units become stages:
//                                              time: the largest share of measured time or of memory is
//                                              smallest; bytes: memory alone (parameters and saved
//                                              activations: the same split on every run); uniform: equal
//                                              unit counts
//   features       "none" | "table", default "none"   "table": the ctr model's embedding tables placed
//                                              whole on the data-parallel ranks, lookups routed by all-to-all
// The rest of the processes are data-parallel replicas: D = N / (T x P), an integer, else an error
// naming the three.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ration/config/config.h"
#include "ration/distributed/world.h"

namespace ration::dist {

enum class PipelineSchedule { OneFOneB, GPipe };
const char* to_string(PipelineSchedule s);  // "1f1b", "gpipe"
enum class PipelineSplit { Time, Bytes, Uniform };
const char* to_string(PipelineSplit s);  // "time", "bytes", "uniform"

struct ParallelSettings {
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t micro_batches = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  PipelineSplit split = PipelineSplit::Time;
  bool feature_split = false;  // parallel.features = "table"
  // Anything but plain data parallelism: the run's steps go through train/model_parallel_step.h.
  bool model_parallel() const { return tensor > 1 || pipeline > 1 || feature_split; }
};
// Reads the [parallel] keys; errors name the file, the key and the expected form.
ParallelSettings read_parallel_settings(Config& cfg);

// Where every rank sits. Coordinates: t (tensor shard, innermost), d (data replica), s (stage, outermost).
struct ParallelLayout {
  int tensor = 1, pipeline = 1, data = 1;
  int rank = 0;
  int tensor_rank = 0, stage = 0, replica = 0;  // this rank's coordinates

  int size() const { return tensor * pipeline * data; }
  int rank_of(int t, int s, int d) const { return (s * data + d) * tensor + t; }
  // The ranks this rank shares each kind of group with (in the group's rank order).
  std::vector<int> tensor_members() const;    // the same stage and replica: t = 0 .. T-1
  std::vector<int> pipeline_members() const;  // the same shard and replica: s = 0 .. P-1
  std::vector<int> data_members() const;      // the same shard and stage: d = 0 .. D-1
  std::vector<int> model_members() const;     // the same replica: every (t, s), t innermost
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pipeline - 1; }
  // "stage 1/2, tensor shard 0/2, replica 1/1" for progress lines and errors.
  std::string describe() const;
  // One line per rank: "rank 3: stage 1, shard 1, replica 0", for the report and the start-up note.
  std::vector<std::string> describe_all() const;
};

// The layout of `world_size` processes for `settings`; this process is `rank`. Throws naming T, P and
// D (and `origin`) when world_size is not a multiple of T x P.
ParallelLayout make_layout(const ParallelSettings& settings, int world_size, int rank, const std::string& origin);

// The process groups of a layout, built once by every rank in the same order (undefined on one process:
// each is then a one-process world).
struct ParallelGroups {
  ParallelLayout layout;
  World everyone;
  World tensor;    // tensor-parallel collectives (one all-reduce per sub-block)
  World pipeline;  // stage-to-stage activations and gradients (point-to-point)
  World data;      // gradient averaging over replicas; ctr's feature-split all-to-all
  World model;     // every rank of this replica (global gradient norms, the step's loss)
  // The first and the last stage of this shard and replica, when they differ (a weight both use, e.g.
  // gpt's tied embedding and lm head, has its gradient summed over this pair); undefined elsewhere.
  World ends;
};
ParallelGroups build_groups(const World& everyone, const ParallelLayout& layout);

}  // namespace ration::dist
