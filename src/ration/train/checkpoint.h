// checkpoint.h — saving and loading training state: model weights, optimiser state, trainer metadata.
// Owns: the on-disk layout, the directory lock, atomic publication, keep-last-K pruning, integrity and
//       validation on load, and the rule that a step number never names two different sets of weights.
// Does not own: what the trainer records (it passes names) or how the optimiser names its state.
//
// Layout (one writer per DIR, enforced by DIR/.lock):
//   DIR/.lock                    flock'd exclusively by the process writing DIR; holds its pid (text).
//   DIR/ckpt-<step>/model.pt     torch::pickle_save of a c10::Dict<std::string, at::Tensor>: weight name
//                                -> tensor (parameters and buffers); Python's torch.load gives a dict.
//   DIR/ckpt-<step>/trainer.pt   the same format: optimiser entries under their own names ("optim.…"),
//                                "checkpoint.step" (int64), and metadata "meta.<key>" (int64 or float64
//                                scalars for Metadata::ints / Metadata::doubles).
//   DIR/ckpt-<step>/run          optional: one line, the fingerprint of the run that wrote it.
//   DIR/latest                   one line naming the newest checkpoint ("ckpt-<step>").
// Atomicity: both files are written and fsynced inside DIR/.tmp-ckpt-<step>-<pid>-<n>, which is then
// renamed to ckpt-<step>; latest is replaced by writing DIR/.tmp-latest-<step>-<pid>-<n> and renaming it.
// A crash leaves either the old state or the new, plus at worst a .tmp-* entry, which load ignores and
// a later save deletes — only its own, or those of a process that no longer runs. If latest is missing
// (a crash between the two renames), load takes the highest-step ckpt-*. latest only moves forward.
// Integrity: every zip entry of model.pt and trainer.pt is checked against its CRC-32 on load.
// Step numbers: saving step N where ckpt-N already holds different weights is an error (never a
// silent replacement); saving the same weights again is allowed (a deterministic re-run).
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

// An exclusive lock on a checkpoint directory for as long as it lives: flock on DIR/.lock, which holds the
// owner's pid. Creating it creates DIR if needed and proves it is a writable directory, so a bad
// train.checkpoint_dir fails before the first step. Re-entrant within one process (save_checkpoint takes
// it too); a second process gets ration::Error naming the directory and the holder's pid.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  std::string key_;  // the directory's absolute path
};

// Before a run's first step: the checkpoints in `dir` past `first_step` must have been written by a run
// with the same `fingerprint` (they would be replaced, and only identical weights may be). Throws
// naming the first offending checkpoint, with the ways out (resume, another directory). `dir` may not exist.
void check_run_may_write(const std::string& dir, int64_t first_step, const std::string& fingerprint);

struct Checkpoint {
  std::string path;       // the ckpt-<step> directory it was read from
  int64_t step = 0;
  NamedTensors weights;   // model.pt, in saved order (CPU tensors)
  NamedTensors optimizer; // trainer.pt's optimiser entries, in saved order
  Metadata metadata;
  std::string run_fingerprint;  // "" when the checkpoint has no run file
};

// Writes DIR/ckpt-<step> atomically (replacing one of the same step only if it holds the same weights),
// points DIR/latest at it unless latest names a later step, deletes its own and dead processes' .tmp-*
// entries, and keeps only the new checkpoint plus the keep_last - 1 highest-step others. On failure (a
// full disk) it removes its temporary directory before throwing. Returns its path.
// Weight and optimiser names must be unique; optimiser names may not start with "meta." or "checkpoint.".
// `run_fingerprint` (if not empty) is written to the checkpoint's run file (see check_run_may_write).
std::string save_checkpoint(const std::string& dir, int64_t step, const NamedTensors& weights,
                            const NamedTensors& optimizer_state, const Metadata& metadata, int keep_last = 3,
                            const std::string& run_fingerprint = "");

// `path` is a ckpt-<step> directory or a parent DIR (follows DIR/latest). Throws ration::Error naming the
// path on a missing or unreadable file, a file whose bytes fail their CRC-32, or a file that is not a
// name -> tensor dictionary.
Checkpoint load_checkpoint(const std::string& path);

// The checkpoint directory `path` refers to (as load_checkpoint resolves it); throws if none.
std::string resolve_checkpoint(const std::string& path);
// Whether `dir` holds a loadable checkpoint (for "resume if present").
bool has_checkpoint(const std::string& dir);
// The ckpt-<step> directories in `dir`, by increasing step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// Writes `weights` to `path` as a model.pt (the format above: torch.load gives a dict of name -> tensor),
// through a temporary file in the same folder and a rename.
void write_model_file(const std::string& path, const NamedTensors& weights);

// Copies the checkpoint's weights into the model's parameters and buffers (in place, no grad).
// Throws naming every missing or unexpected weight, and any shape mismatch, before changing anything.
void restore_weights(const Checkpoint& checkpoint, const std::vector<std::pair<std::string, Value>>& params,
                     const NamedTensors& buffers = {});

}  // namespace ration::train
