// dataset.cpp — deterministic epoch orders and the resumable loader (see dataset.h).
#include "ration/data/dataset.h"

#include <algorithm>
#include <numeric>

#include "ration/base/check.h"

namespace ration::data {
namespace {

// splitmix64: a small, well-mixed generator whose output is fixed by its definition.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) without modulo bias (rejection sampling).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = next();
    while (r >= limit);
    return r % bound;
  }
};

}  // namespace

const char* to_string(Sampling s) {
  switch (s) {
    case Sampling::Shuffle: return "shuffle";
    case Sampling::Bootstrap: return "bootstrap";
    case Sampling::LocalShuffle: return "local_shuffle";
  }
  return "?";
}

std::vector<int64_t> shuffle_order(int64_t n, uint64_t seed, int64_t epoch) {
  RATION_CHECK(n >= 0, "cannot shuffle a negative count ", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 seeder{seed};
  SplitMix64 rng{seeder.next() ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull)};
  rng.next();  // decorrelate neighbouring epochs
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> bootstrap_order(int64_t n, uint64_t seed, int64_t epoch) {
  RATION_CHECK(n > 0, "cannot bootstrap-sample a count of ", n);
  std::vector<int64_t> draws(static_cast<size_t>(n));
  SplitMix64 seeder{seed ^ 0xB0075791ull};
  SplitMix64 rng{seeder.next() ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull)};
  rng.next();
  for (auto& d : draws) d = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
  return draws;
}

std::vector<int64_t> local_shuffle_order(int64_t n, uint64_t seed, int64_t epoch, int shard_rank, int shard_count) {
  RATION_CHECK(shard_count >= 1 && shard_rank >= 0 && shard_rank < shard_count, "local shuffle shard ", shard_rank,
               " of ", shard_count, " is not valid; expected shard_count >= 1 and shard_rank in [0, shard_count)");
  RATION_CHECK(n >= 0, "cannot shuffle a negative count ", n);
  const int64_t begin = shard_rank * n / shard_count, end = (shard_rank + 1) * n / shard_count;
  // Rank 0 keeps the seed itself, so one shard (shard_count = 1) is shuffle_order exactly.
  const uint64_t rank_seed = seed ^ (static_cast<uint64_t>(shard_rank) * 0x9E3779B97F4A7C15ull);
  std::vector<int64_t> order = shuffle_order(end - begin, rank_seed, epoch);
  for (int64_t& i : order) i += begin;
  return order;
}

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  RATION_CHECK(dataset_ != nullptr, "Loader needs a dataset");
  RATION_CHECK(options_.batch_size > 0, "batch_size must be > 0, got ", options_.batch_size);
  RATION_CHECK(options_.shard_count >= 1 && options_.shard_rank >= 0 && options_.shard_rank < options_.shard_count,
               "loader shard ", options_.shard_rank, " of ", options_.shard_count,
               " is not valid; expected shard_count >= 1 and shard_rank in [0, shard_count)");
  RATION_CHECK(dataset_->size() > 0, "Loader given an empty dataset");
  RATION_CHECK(!local() || shard_size(0) > 0, "local shuffle over ", options_.shard_count, " ranks needs at least ",
               options_.shard_count, " items (one per rank's shard), but the dataset has ", dataset_->size(),
               "; hint: use fewer ranks or sampling = shuffle");
  RATION_CHECK(!local() || batches_per_epoch() > 0, "batch_size ", options_.batch_size,
               " exceeds the smallest rank's local-shuffle shard of ", shard_size(0), " items (", dataset_->size(),
               " items over ", options_.shard_count, " ranks) with drop_last, so an epoch has no batch; hint: lower "
               "batch_size");
  RATION_CHECK(batches_per_epoch() > 0, "batch_size ", options_.batch_size, " exceeds the dataset's ",
               dataset_->size(), " items with drop_last, so an epoch has no batch; hint: lower batch_size");
}

bool Loader::local() const { return options_.shuffle && options_.sampling == Sampling::LocalShuffle; }

// floor((r+1)n/N) - floor(rn/N) is floor(n/N) or floor(n/N) + 1, and rank 0's is floor(n/N): shard_size(0)
// is the smallest shard.
int64_t Loader::shard_size(int rank) const {
  const int64_t n = dataset_->size(), count = options_.shard_count;
  return (rank + 1) * n / count - rank * n / count;
}

int64_t Loader::local_items(int rank) const {
  return std::min(batches_per_epoch() * options_.batch_size, shard_size(rank));
}

int64_t Loader::epoch_items() const {
  if (local()) {
    int64_t items = 0;
    for (int r = 0; r < options_.shard_count; ++r) items += local_items(r);
    return items;
  }
  const int64_t n = dataset_->size();
  const int64_t global = options_.batch_size * options_.shard_count;
  return options_.drop_last ? n / global * global : n;
}

int64_t Loader::batches_per_epoch() const {
  if (local()) {
    const int64_t smallest = shard_size(0), b = options_.batch_size;
    return options_.drop_last ? smallest / b : (smallest + b - 1) / b;
  }
  const int64_t n = dataset_->size();
  const int64_t global = options_.batch_size * options_.shard_count;
  return options_.drop_last ? n / global : (n + global - 1) / global;
}

bool Loader::has_next_in_epoch() const { return position_.index < epoch_items(); }

Loader::~Loader() { discard_prefetch(); }

void Loader::set_position(LoaderPosition position) {
  discard_prefetch();
  RATION_CHECK(position.epoch >= 0 && position.index >= 0 && position.index <= epoch_items(),
               "loader position (epoch ", position.epoch, ", index ", position.index, ") is outside an epoch of ",
               epoch_items(), " items; hint: was it saved with another dataset or batch size?");
  // LocalShuffle: every step but the last hands out N * batch_size global items, so a position is a step
  // boundary or the epoch's end (with one rank, any index is an offset into the one shard, as for Shuffle).
  const int64_t step_items = options_.batch_size * options_.shard_count;
  RATION_CHECK(!local() || options_.shard_count == 1 || position.index % step_items == 0 ||
                   position.index == epoch_items(),
               "loader position (epoch ", position.epoch, ", index ", position.index,
               ") is not a step boundary of local shuffle over ", options_.shard_count, " ranks of batch_size ",
               options_.batch_size, " (a multiple of ", step_items, ", or the epoch's end at ", epoch_items(),
               "); hint: resume a local-shuffle run with the shard count and batch size it was saved with");
  position_ = position;
}

const std::vector<int64_t>& Loader::order() {
  if (cached_epoch_ != position_.epoch) {
    if (local()) {
      order_ = local_shuffle_order(dataset_->size(), options_.seed, position_.epoch, options_.shard_rank,
                                   options_.shard_count);
    } else if (options_.shuffle && options_.sampling == Sampling::Bootstrap) {
      order_ = bootstrap_order(dataset_->size(), options_.seed, position_.epoch);
    } else if (options_.shuffle) {
      order_ = shuffle_order(dataset_->size(), options_.seed, position_.epoch);
    } else {
      order_.resize(static_cast<size_t>(dataset_->size()));
      std::iota(order_.begin(), order_.end(), 0);
    }
    cached_epoch_ = position_.epoch;
  }
  return order_;
}

std::vector<int64_t> Loader::next_indices() {
  discard_prefetch();
  if (!has_next_in_epoch()) position_ = {position_.epoch + 1, 0};
  const std::vector<int64_t>& ord = order();
  if (local()) return next_local_indices(ord);
  const int64_t n = options_.shard_count, r = options_.shard_rank;
  const int64_t end = std::min(position_.index + options_.batch_size * n, epoch_items());
  // This shard's contiguous part of the global batch [index, end), split as evenly as possible.
  const int64_t global = end - position_.index, base = global / n, extra = global % n;
  const int64_t begin = position_.index + r * base + std::min(r, extra);
  const int64_t count = base + (r < extra ? 1 : 0);
  std::vector<int64_t> indices(ord.begin() + begin, ord.begin() + begin + count);
  position_.index = end;
  last_global_items_ = global;
  return indices;
}

std::vector<int64_t> Loader::next_local_indices(const std::vector<int64_t>& ord) {
  // Every rank stands at the same offset of its own epoch: k steps of batch_size (plus, with one rank,
  // the index's remainder, which set_position allows there only).
  const int64_t b = options_.batch_size, step_items = b * options_.shard_count;
  const int64_t offset = position_.index / step_items * b + position_.index % step_items;
  auto take = [&](int rank) { return std::clamp<int64_t>(local_items(rank) - offset, 0, b); };
  int64_t global = 0;
  for (int r = 0; r < options_.shard_count; ++r) global += take(r);
  const int64_t count = take(options_.shard_rank);
  RATION_ASSERT(count > 0, "local shuffle rank ", options_.shard_rank, " has no item at epoch offset ", offset);
  std::vector<int64_t> indices(ord.begin() + offset, ord.begin() + offset + count);
  position_.index += global;
  last_global_items_ = global;
  return indices;
}

Batch Loader::next() {
  Batch batch;
  if (pending_ && pending_->before == position_) {
    batch = pending_->batch.get();  // rethrows the dataset's error, if any
    position_ = pending_->after;
    last_global_items_ = pending_->global_items;
    pending_.reset();
    ++prefetched_;
  } else {
    batch = dataset_->get(next_indices());
  }
  if (options_.prefetch) start_prefetch();
  return batch;
}

void Loader::start_prefetch() {
  discard_prefetch();
  Prefetch p;
  p.before = position_;
  const int64_t items = last_global_items_;
  std::vector<int64_t> indices = next_indices();  // advances position_ as next() would
  p.after = position_;
  p.global_items = last_global_items_;
  position_ = p.before;
  last_global_items_ = items;
  std::shared_ptr<const Dataset> dataset = dataset_;
  p.batch = std::async(std::launch::async, [dataset, indices = std::move(indices)] { return dataset->get(indices); });
  pending_ = std::move(p);
}

void Loader::discard_prefetch() {
  if (!pending_) return;
  try {
    pending_->batch.wait();
  } catch (...) {
  }
  pending_.reset();  // its error, if any, resurfaces when next() fetches the batch itself
}

}  // namespace ration::data
