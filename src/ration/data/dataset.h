// dataset.h — the dataset interface and the loader that walks it in deterministic, resumable order.
// Owns: Dataset (size(), get(indices) -> Batch), Loader (shuffled-or-sequential epochs, batching,
//       drop_last, data-parallel shards), and LoaderPosition, the two integers that make a resume exact.
// Order: epoch e visits the permutation shuffle_order(size, seed, e) (or 0..size-1 unshuffled), a pure
// function of (seed, epoch) computed with our own generator (splitmix64 + Fisher-Yates), so it does not
// change with the libtorch version or the platform's <random>. Sampling::Bootstrap replaces the
// permutation by size draws with replacement, bootstrap_order(size, seed, e), also a pure function.
// Shards (data parallel): with shard_count = N the loader walks global batches of N * batch_size items
// of that order; the shard_rank-th rank takes its contiguous part (the batch split as evenly as
// possible, so a short last batch gives some ranks one item fewer). The position counts global items,
// so the ranks' shards together are exactly the one-process batch of N * batch_size, and a checkpoint
// resumes with any N.
// Prefetch (LoaderOptions::prefetch): after next() hands out a batch, the following one is prepared on a
// background thread while the caller's step runs. Datasets make batches as Category::Data (host data,
// outside the device budget) either way, so measured device peaks and memory plans do not change.
// Orders and positions are the same with and without prefetch; set_position and
// next_indices discard a prepared batch.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "ration/data/batch.h"

namespace ration::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // One batch of the items at `indices` (each in [0, size())), in that order.
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
};

// Where a loader stands: the epoch, and how many items of that epoch's order it has handed out.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t index = 0;
  bool operator==(const LoaderPosition& o) const { return epoch == o.epoch && index == o.index; }
};

// A permutation of 0..n-1 determined by (seed, epoch).
std::vector<int64_t> shuffle_order(int64_t n, uint64_t seed, int64_t epoch);
// n draws from 0..n-1 with replacement, determined by (seed, epoch).
std::vector<int64_t> bootstrap_order(int64_t n, uint64_t seed, int64_t epoch);

// How a shuffled epoch is drawn: a permutation, or a bootstrap sample (with replacement).
enum class Sampling { Shuffle, Bootstrap };

struct LoaderOptions {
  int64_t batch_size = 32;      // per shard (per rank); the global batch is shard_count * batch_size
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // true: the epoch ends before a short last (global) batch
  Sampling sampling = Sampling::Shuffle;  // used when shuffle is true
  int shard_rank = 0;                     // this rank, in [0, shard_count)
  int shard_count = 1;                    // ranks sharing each global batch
  bool prefetch = false;                  // prepare the next batch on a thread while the step runs
};

class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(Loader&&) = default;
  Loader& operator=(Loader&&) = default;

  // The next batch; when the current epoch is exhausted, moves to the next epoch first.
  Batch next();
  // The indices next() would fetch (advancing the position just as next() does), without fetching.
  std::vector<int64_t> next_indices();
  // Whether the current epoch has another batch (for one pass over an evaluation set).
  bool has_next_in_epoch() const;
  // Batches in one epoch (respecting drop_last); global batches when sharded.
  int64_t batches_per_epoch() const;
  // Items of the last global batch handed out (this shard's batch is its share of them; the weight of
  // its gradient is its items / these).
  int64_t last_global_items() const { return last_global_items_; }

  LoaderPosition position() const { return position_; }
  // Resume: the next batch will be the one that followed `position` when it was taken.
  void set_position(LoaderPosition position);
  // Batches next() took from the background thread (prefetch), for tests and reports.
  int64_t prefetched_batches() const { return prefetched_; }


 private:
  int64_t epoch_items() const;  // items handed out per epoch
  const std::vector<int64_t>& order();  // of position_.epoch (cached)

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  LoaderPosition position_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;  // (size) permutation (or bootstrap draws) for cached_epoch_
  int64_t last_global_items_ = 0;

  // The batch being prepared in the background: where the loader stood before it and after it.
  struct Prefetch {
    LoaderPosition before, after;
    int64_t global_items = 0;
    std::future<Batch> batch;
  };
  void start_prefetch();
  void discard_prefetch();
  std::optional<Prefetch> pending_;
  int64_t prefetched_ = 0;
};

}  // namespace ration::data
