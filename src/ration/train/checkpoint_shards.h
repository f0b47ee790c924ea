// checkpoint_shards.h — checkpoints of a model split over processes (tensor shards, pipeline stages):
// one checkpoint directory per shard plus a manifest, merged on demand into one model.pt that loads with
// torch.load (docs/DISTRIBUTED.md, "Model and hybrid parallelism").
// Owns: the layout below, writing the manifest, the shard a process resumes from, and the merge.
// Does not own: one shard's checkpoint format (train/checkpoint.h: each shard directory is an ordinary
//       checkpoint directory, written and locked by one process).
//
// Layout of train.checkpoint_dir = DIR with parallel.tensor = T, parallel.pipeline = P:
//   DIR/manifest.json            {"format": "ration-shards-1", "model", "tensor", "pipeline", "shards":
//                                [{"dir", "stage", "tensor_rank"}...], "split_dims": {name: dim, ...},
//                                "tied": [names the first and last stage both hold], "first_unit": [the
//                                pipeline split's boundaries: a resumed run splits the same way],
//                                "split_parts": {name: parts, ...} (weights of several parts, each split
//                                separately; optional)}; atomic.
//   DIR/shard-s<S>-t<T>/         the checkpoints of stage S, tensor shard T (written by replica 0's process)
// The merge takes every shard's checkpoint of one step: a weight split over the tensor group is its shards
// concatenated along its split dimension in tensor-rank order, part by part for a weight of several parts
// (dist::merge_tensor_shards); any other weight is taken from the first
// shard that holds it (a tied weight is equal on both stages).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ration/train/checkpoint.h"

namespace ration::train {

std::string shard_dir_name(int stage, int tensor_rank);  // "shard-s1-t0"

struct ShardManifest {
  std::string model;
  int tensor = 1, pipeline = 1;
  std::map<std::string, int64_t> split_dims;  // weights split over the tensor group -> their dimension
  std::vector<std::string> tied;
  std::vector<int64_t> first_unit;  // the pipeline's split (PipelineSplit::first_unit), kept on resume
  // Split weights made of several parts split separately (gpt's attn.qkv: q, k and v each by heads) ->
  // the number of parts (Model::tensor_split_parts); absent: 1.
  std::map<std::string, int64_t> split_parts;
};
void write_shard_manifest(const std::string& dir, const ShardManifest& manifest);
// Throws naming the file when it is missing or malformed.
ShardManifest read_shard_manifest(const std::string& dir);
// Whether `dir` holds a manifest (a run of a split model).
bool has_shard_manifest(const std::string& dir);

// The whole model's weights at `step` (the shards' newest common step when unset), in the first shard's
// order then the others'. Throws naming a missing shard, a step some shard lacks, or shards that disagree.
NamedTensors merge_checkpoint_shards(const std::string& dir, std::optional<int64_t> step = std::nullopt);

}  // namespace ration::train
