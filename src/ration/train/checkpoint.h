// checkpoint.h — saving and loading training state: model weights, optimiser state, trainer metadata.
// Owns: the on-disk layout, atomic publication, keep-last-K pruning, and validation on load.
// Does not own: what the trainer records (it passes names) or how the optimiser names its state.
//
// Layout (one writer per DIR):
//   DIR/ckpt-<step>/model.pt     torch::pickle_save of a c10::Dict<std::string, at::Tensor>: weight name
//                                -> tensor (parameters and buffers); Python's torch.load gives a dict.
//   DIR/ckpt-<step>/trainer.pt   the same format: optimiser entries under their own names ("optim.…"),
//                                "checkpoint.step" (int64), and metadata "meta.<key>" (int64 or float64
//                                scalars for Metadata::ints / Metadata::doubles).
//   DIR/latest                   one line naming the newest checkpoint ("ckpt-<step>").
// Atomicity: both files are written and fsynced inside DIR/.tmp-ckpt-<step>-<pid>, which is then renamed
// to ckpt-<step>; latest is replaced by writing DIR/.tmp-latest-<pid> and renaming it. A crash leaves
// either the old state or the new, plus at worst a .tmp-* entry, which load ignores and the next save
// deletes. If latest is missing (a crash between the two renames), load takes the highest-step ckpt-*.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ration/core/value.h"

namespace ration::train {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct Metadata {
  std::map<std::string, int64_t> ints;    // e.g. "epoch", "loader_index", "tokens_seen"
  std::map<std::string, double> doubles;  // e.g. "best_val_loss"
};

struct Checkpoint {
  std::string path;       // the ckpt-<step> directory it was read from
  int64_t step = 0;
  NamedTensors weights;   // model.pt, in saved order (CPU tensors)
  NamedTensors optimizer; // trainer.pt's optimiser entries, in saved order
  Metadata metadata;
};

// Writes DIR/ckpt-<step> atomically (replacing one of the same step), points DIR/latest at it, deletes
// leftover .tmp-* entries, and keeps only the new checkpoint plus the keep_last - 1 highest-step others.
// Returns its path.
// Weight and optimiser names must be unique; optimiser names may not start with "meta." or "checkpoint.".
std::string save_checkpoint(const std::string& dir, int64_t step, const NamedTensors& weights,
                            const NamedTensors& optimizer_state, const Metadata& metadata, int keep_last = 3);

// `path` is a ckpt-<step> directory or a parent DIR (follows DIR/latest). Throws ration::Error naming the
// path on a missing or unreadable file, or a file that is not a name -> tensor dictionary.
Checkpoint load_checkpoint(const std::string& path);

// The checkpoint directory `path` refers to (as load_checkpoint resolves it); throws if none.
std::string resolve_checkpoint(const std::string& path);
// Whether `dir` holds a loadable checkpoint (for "resume if present").
bool has_checkpoint(const std::string& dir);
// The ckpt-<step> directories in `dir`, by increasing step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// Copies the checkpoint's weights into the model's parameters and buffers (in place, no grad).
// Throws naming every missing or unexpected weight, and any shape mismatch, before changing anything.
void restore_weights(const Checkpoint& checkpoint, const std::vector<std::pair<std::string, Value>>& params,
                     const NamedTensors& buffers = {});

}  // namespace ration::train
