// dataset.h — the dataset interface and the loader that walks it in deterministic, resumable order.
// Owns: Dataset (size(), get(indices) -> Batch), Loader (shuffled-or-sequential epochs, batching,
//       drop_last, data-parallel shards), and LoaderPosition, the two integers that make a resume exact.
// Order: epoch e visits the permutation shuffle_order(size, seed, e) (or 0..size-1 unshuffled), a pure
// function of (seed, epoch) computed with our own generator (splitmix64 + Fisher-Yates), so it does not
// change with the libtorch version or the platform's <random>.
// Sampling (LoaderOptions::sampling, used when shuffle is true; unshuffled loaders walk 0..size-1):
//   Shuffle      one global permutation per epoch, shuffle_order(size, seed, e).
//   Bootstrap    size draws with replacement instead, bootstrap_order(size, seed, e), also a pure function.
//   LocalShuffle each rank keeps a fixed shard for the whole run and shuffles only that shard per epoch
//                (no global permutation is formed); see "Local shuffle" below.
// Shards (data parallel, Shuffle and Bootstrap): with shard_count = N the loader walks global batches of
// N * batch_size items of that order; the shard_rank-th rank takes its contiguous part (the batch split
// as evenly as possible, so a short last batch gives some ranks one item fewer). The position counts
// global items, so the ranks' shards together are exactly the one-process batch of N * batch_size, and
// a checkpoint resumes with any N.
// Local shuffle: rank r owns the index range [r*n/N, (r+1)*n/N) (integer division, so the N shards
// partition 0..n-1 and their sizes differ by at most one) and in epoch e walks
// local_shuffle_order(n, seed, e, r, N): its shard permuted by shuffle_order(shard size, seed with r
// mixed in (rank 0: seed itself), e), a pure function of (seed, epoch, rank). Ranks run collectives
// every step, so every rank takes the same number of steps: batches_per_epoch() comes from the smallest
// shard (drop_last: floor(min_shard / batch_size), otherwise ceil(min_shard / batch_size)), and a
// rank's epoch is the first min(batches_per_epoch * batch_size, its shard size) items of its shuffled
// shard. A larger shard (one item more than the smallest) may so leave one item out of an epoch; it is
// the last of that epoch's shuffled shard, so a different item each epoch, none left out systematically.
// Every step but the last is batch_size items on every rank; in the last, a rank takes what is left of
// its epoch (at least one item).
// last_global_items() is the sum of the ranks' items at that step, computed from the shard sizes
// without communication, so a rank's gradient weight is still its share of the global step's samples.
// The position counts global items as for the other modes (index k * N * batch_size after k steps, the
// sum of the ranks' epoch items at the end of an epoch), so set_position resumes exactly with the same
// shard_count and batch_size; an index that is not a step boundary of this N is refused. With
// shard_count = 1 the one shard is the whole set and LocalShuffle is Shuffle exactly (same order, same
// positions).
// Prefetch (LoaderOptions::prefetch): after next() hands out a batch, the following one is prepared on a
// background thread while the caller's step runs. Datasets make batches as Category::Data (host data,
// outside the device budget) either way, so measured device peaks and memory plans do not change.
// Orders and positions are the same with and without prefetch (in every sampling mode); set_position and
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
// Rank shard_rank's fixed shard [shard_rank*n/shard_count, (shard_rank+1)*n/shard_count), permuted for
// `epoch`; determined by (seed, epoch, shard_rank). With shard_count = 1 it is shuffle_order(n, seed, epoch).
std::vector<int64_t> local_shuffle_order(int64_t n, uint64_t seed, int64_t epoch, int shard_rank, int shard_count);

// How a shuffled epoch is drawn: a global permutation, a bootstrap sample (with replacement), or a
// permutation of each rank's own fixed shard (see the file comment).
enum class Sampling { Shuffle, Bootstrap, LocalShuffle };
// "shuffle" | "bootstrap" | "local_shuffle" (the data.sampling key's names).
const char* to_string(Sampling s);

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
  // Batches in one epoch (respecting drop_last); global batches when sharded, the same on every rank
  // (LocalShuffle: from the smallest shard).
  int64_t batches_per_epoch() const;
  // Items of the last global batch handed out, over all ranks (this shard's batch is its share of them;
  // the weight of its gradient is its items / these).
  int64_t last_global_items() const { return last_global_items_; }

  LoaderPosition position() const { return position_; }
  // Resume: the next batch will be the one that followed `position` when it was taken.
  void set_position(LoaderPosition position);
  // Batches next() took from the background thread (prefetch), for tests and reports.
  int64_t prefetched_batches() const { return prefetched_; }


 private:
  int64_t epoch_items() const;  // global items handed out per epoch (all ranks)
  bool local() const;           // LocalShuffle in effect (shuffle on)
  int64_t shard_size(int rank) const;  // LocalShuffle: items in `rank`'s fixed shard
  int64_t local_items(int rank) const;  // LocalShuffle: items `rank` takes per epoch
  const std::vector<int64_t>& order();  // of position_.epoch (cached; this rank's shard for LocalShuffle)
  std::vector<int64_t> next_local_indices(const std::vector<int64_t>& ord);  // next_indices for LocalShuffle

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  LoaderPosition position_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;  // for cached_epoch_: permutation, bootstrap draws, or this rank's shuffled shard
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
