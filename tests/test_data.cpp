// Datasets and the loader: real Fashion-MNIST files, malformed-file errors, deterministic shuffling and
// exact resume, byte-level text windows and the unigram baseline.
#include <gtest/gtest.h>

#include "test_util.h"
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include "ration/base/check.h"
#include "ration/data/dataset.h"
#include "ration/data/fashion_mnist.h"
#include "ration/data/text.h"

namespace ration::data {
namespace {
namespace fs = std::filesystem;
using ration::testing::expect_error_containing;
using ration::testing::read_file;
using ration::testing::TempDir;




// ---- Fashion-MNIST --------------------------------------------------------------------------------

bool have_fashion_mnist() { return fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz"); }

const FashionMnist& train_set() {
  static const FashionMnist ds(FashionMnist::Split::Train);
  return ds;
}

TEST(Data, FashionMnistRealFiles) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST at " << kFashionMnistDir;
  const FashionMnist& train = train_set();
  const FashionMnist test(FashionMnist::Split::Test);
  ASSERT_EQ(train.size(), 60000);
  ASSERT_EQ(test.size(), 10000);
  EXPECT_EQ(train.raw_images().sizes(), at::IntArrayRef({60000, 28, 28}));
  // Balanced classes 0..9: 6000 each in train, 1000 each in test.
  EXPECT_TRUE(at::equal(at::bincount(train.labels()), at::full({10}, 6000, at::kLong)));
  EXPECT_TRUE(at::equal(at::bincount(test.labels()), at::full({10}, 1000, at::kLong)));

  // Pixel statistics of the whole train split from the histogram of byte values (exact, cheap).
  const at::Tensor hist = at::bincount(train.raw_images().flatten().to(at::kLong), {}, 256).to(at::kDouble);
  const at::Tensor level = at::arange(256, at::kDouble) / 255.0;
  const double n = hist.sum().item<double>();
  const double mean = (hist * level).sum().item<double>() / n;
  const double var = (hist * (level - mean).pow(2)).sum().item<double>() / n;
  EXPECT_NEAR(mean, FashionMnist::kMean, 5e-4);
  EXPECT_NEAR(std::sqrt(var), FashionMnist::kStd, 5e-4);

  const Batch b = train.get({0, 59999, 17});
  EXPECT_EQ(b.input.sizes(), at::IntArrayRef({3, 1, 28, 28}));
  EXPECT_EQ(b.input.dtype(), at::kFloat);
  EXPECT_EQ(b.target.dtype(), at::kLong);
  EXPECT_EQ(b.items, 3);
  EXPECT_EQ(b.target.tensor()[1].item<int64_t>(), train.labels()[59999].item<int64_t>());
  const double raw = train.raw_images()[17][14][10].item<double>();
  EXPECT_NEAR(b.input.tensor()[2][0][14][10].item<double>(), (raw / 255.0 - 0.2860) / 0.3530, 1e-6);
  const at::Tensor all_norm = train.get([] {
    std::vector<int64_t> idx(2000);
    std::iota(idx.begin(), idx.end(), 0);
    return idx;
  }()).input.tensor();
  EXPECT_NEAR(all_norm.mean().item<double>(), 0.0, 0.05);
  EXPECT_NEAR(all_norm.std().item<double>(), 1.0, 0.05);
  expect_error_containing([&] { train.get({60000}); }, {"60000"});
}

void write_gz(const fs::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> idx_header(uint32_t magic, std::vector<uint32_t> dims) {
  std::vector<uint8_t> out;
  dims.insert(dims.begin(), magic);
  for (uint32_t v : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
  }
  return out;
}

// A tiny valid split of `n` images (and `labels` labels) named like the test split.
void write_small_split(const fs::path& dir, uint32_t n, uint32_t labels, uint32_t image_magic = 2051) {
  std::vector<uint8_t> images = idx_header(image_magic, {n, 28, 28});
  images.resize(images.size() + n * 28 * 28, 128);
  write_gz(dir / "t10k-images-idx3-ubyte.gz", images);
  std::vector<uint8_t> lab = idx_header(2049, {labels});
  for (uint32_t i = 0; i < labels; ++i) lab.push_back(static_cast<uint8_t>(i % 10));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", lab);
}

TEST(Data, FashionMnistBadFilesNameTheFile) {
  TempDir dir("fmnist");
  const std::string images = (dir.path / "t10k-images-idx3-ubyte.gz").string();
  const std::string labels = (dir.path / "t10k-labels-idx1-ubyte.gz").string();
  auto load = [&] { FashionMnist ds(FashionMnist::Split::Test, dir.path.string()); };

  expect_error_containing(load, {images, "does not exist"});  // missing

  write_small_split(dir.path, 3, 3);
  FashionMnist ok(FashionMnist::Split::Test, dir.path.string());  // the valid small split loads
  EXPECT_EQ(ok.size(), 3);
  EXPECT_EQ(ok.labels()[2].item<int64_t>(), 2);

  write_small_split(dir.path, 3, 3, /*image_magic=*/2049);
  expect_error_containing(load, {images, "magic number 2049", "expected 2051"});

  write_small_split(dir.path, 3, 4);
  expect_error_containing(load, {images, labels, "3 images", "4 labels"});

  std::vector<uint8_t> truncated = idx_header(2051, {5, 28, 28});
  truncated.resize(truncated.size() + 2 * 28 * 28);
  write_gz(dir.path / "t10k-images-idx3-ubyte.gz", truncated);
  expect_error_containing(load, {images, "truncated", "3920 bytes"});

  std::vector<uint8_t> wrong_side = idx_header(2051, {1, 32, 32});
  wrong_side.resize(wrong_side.size() + 32 * 32);
  write_gz(dir.path / "t10k-images-idx3-ubyte.gz", wrong_side);
  expect_error_containing(load, {images, "32x32", "28x28"});

  write_small_split(dir.path, 2, 2);
  std::ofstream(labels, std::ios::binary) << "not gzip and far too short";  // zlib reads it as raw bytes
  expect_error_containing(load, {labels});

  write_small_split(dir.path, 2, 2);
  std::vector<uint8_t> bad_label = idx_header(2049, {2});
  bad_label.push_back(3);
  bad_label.push_back(10);
  write_gz(labels, bad_label);
  expect_error_containing(load, {labels, "label 10"});
}

// ---- Loader ---------------------------------------------------------------------------------------

// Item i is the number i: batches show exactly which items the loader chose.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Batch get(const std::vector<int64_t>& indices) const override {
    Batch b;
    b.input = Value(at::tensor(indices, at::kLong));
    b.target = b.input;
    b.items = static_cast<int64_t>(indices.size());
    return b;
  }

 private:
  int64_t n_;
};

std::vector<int64_t> as_vector(const Batch& b) {
  const at::Tensor t = b.input.tensor();
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

TEST(Data, ShuffleOrderIsPinned) {
  // The order is part of the resume contract: changing the generator would silently change what a
  // resumed run sees. Values computed once from the splitmix64 definition (and checked in Python).
  const std::vector<int64_t> expected = {5, 2, 1, 0, 4, 6, 7, 3, 9, 8};
  EXPECT_EQ(shuffle_order(10, 42, 3), expected);
  std::vector<int64_t> sorted = shuffle_order(1000, 1, 0);
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(shuffle_order(1000, 1, 0), shuffle_order(1000, 1, 1));
  EXPECT_NE(shuffle_order(1000, 1, 0), shuffle_order(1000, 2, 0));
}

TEST(Data, LoaderEpochsAndBatches) {
  auto ds = std::make_shared<CountingDataset>(10);
  Loader keep_last(ds, {4, /*shuffle=*/true, /*seed=*/5, /*drop_last=*/false});
  EXPECT_EQ(keep_last.batches_per_epoch(), 3);
  std::vector<int64_t> epoch0;
  std::vector<size_t> sizes;
  while (keep_last.has_next_in_epoch()) {
    const auto v = as_vector(keep_last.next());
    sizes.push_back(v.size());
    epoch0.insert(epoch0.end(), v.begin(), v.end());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 2}));
  EXPECT_EQ(epoch0, shuffle_order(10, 5, 0));
  EXPECT_EQ(keep_last.position(), (LoaderPosition{0, 10}));
  const auto first_of_epoch1 = as_vector(keep_last.next());  // wraps to the next epoch
  EXPECT_EQ(keep_last.position(), (LoaderPosition{1, 4}));
  const auto order1 = shuffle_order(10, 5, 1);
  EXPECT_EQ(first_of_epoch1, std::vector<int64_t>(order1.begin(), order1.begin() + 4));

  Loader drop(ds, {4, /*shuffle=*/false, 0, /*drop_last=*/true});
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  EXPECT_EQ(as_vector(drop.next()), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(as_vector(drop.next()), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_FALSE(drop.has_next_in_epoch());
  EXPECT_EQ(as_vector(drop.next()), (std::vector<int64_t>{0, 1, 2, 3}));  // items 8, 9 dropped
  EXPECT_EQ(drop.position().epoch, 1);

  expect_error_containing([&] { Loader(ds, {11, true, 0, true}); }, {"batch_size 11"});
  expect_error_containing([&] { drop.set_position({0, 9}); }, {"index 9"});
}

TEST(Data, LoaderResumesExactly) {
  auto ds = std::make_shared<CountingDataset>(23);
  const LoaderOptions options{5, true, 1234, false};
  Loader original(ds, options);
  for (int i = 0; i < 7; ++i) original.next();  // into the second epoch (5 batches per epoch)
  const LoaderPosition saved = original.position();
  EXPECT_EQ(saved, (LoaderPosition{1, 10}));
  std::vector<std::vector<int64_t>> after;
  for (int i = 0; i < 8; ++i) after.push_back(as_vector(original.next()));

  Loader resumed(ds, options);  // a new process: only the options and the saved position
  resumed.set_position(saved);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(as_vector(resumed.next()), after[static_cast<size_t>(i)]) << "batch " << i;

  Loader other_seed(ds, {5, true, 99, false});
  other_seed.set_position(saved);
  EXPECT_NE(as_vector(other_seed.next()), after[0]);
}

// ---- Local shuffle --------------------------------------------------------------------------------

// A loader for rank `rank` of `count` with Sampling::LocalShuffle.
Loader local_loader(std::shared_ptr<const Dataset> ds, int64_t batch_size, uint64_t seed, bool drop_last, int rank,
                    int count, bool prefetch = false) {
  LoaderOptions o{batch_size, /*shuffle=*/true, seed, drop_last};
  o.sampling = Sampling::LocalShuffle;
  o.shard_rank = rank;
  o.shard_count = count;
  o.prefetch = prefetch;
  return Loader(std::move(ds), o);
}

// The indices one loader hands out over the rest of its current epoch (or the whole next one).
std::vector<int64_t> one_epoch(Loader& loader) {
  std::vector<int64_t> items;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const auto v = as_vector(loader.next());
    items.insert(items.end(), v.begin(), v.end());
  }
  EXPECT_FALSE(loader.has_next_in_epoch());
  return items;
}

TEST(Data, LocalShuffleRanksKeepFixedShards) {
  // The order is pinned like shuffle_order's (values from the splitmix64 definition, checked in Python):
  // 11 items over 3 ranks are the shards [0, 3), [3, 7), [7, 11).
  EXPECT_EQ(local_shuffle_order(11, 42, 3, 0, 3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(local_shuffle_order(11, 42, 3, 1, 3), (std::vector<int64_t>{4, 6, 3, 5}));
  EXPECT_EQ(local_shuffle_order(11, 42, 3, 2, 3), (std::vector<int64_t>{7, 9, 10, 8}));

  // 22 items (not divisible by 3) over 3 ranks: shards [0, 7), [7, 14), [14, 22), in every epoch.
  auto ds = std::make_shared<CountingDataset>(22);
  const std::vector<std::pair<int64_t, int64_t>> shard = {{0, 7}, {7, 14}, {14, 22}};
  for (int r = 0; r < 3; ++r) {
    Loader loader = local_loader(ds, 2, 7, false, r, 3);
    std::vector<std::vector<int64_t>> epochs;
    for (int e = 0; e < 3; ++e) {
      const std::vector<int64_t> items = one_epoch(loader);
      EXPECT_EQ(loader.position().epoch, e);
      for (int64_t i : items) {
        EXPECT_GE(i, shard[r].first) << "rank " << r << " epoch " << e;
        EXPECT_LT(i, shard[r].second) << "rank " << r << " epoch " << e;
      }
      // Batch size 2 and a smallest shard of 7: 4 steps, 8 items' room, so every rank takes its whole shard.
      std::vector<int64_t> sorted = items, whole(static_cast<size_t>(shard[r].second - shard[r].first));
      std::sort(sorted.begin(), sorted.end());
      std::iota(whole.begin(), whole.end(), shard[r].first);
      EXPECT_EQ(sorted, whole) << "rank " << r << " epoch " << e;
      EXPECT_EQ(items, local_shuffle_order(22, 7, e, r, 3));
      epochs.push_back(items);
    }
    EXPECT_NE(epochs[0], epochs[1]) << "rank " << r;  // same shard, new order each epoch
    EXPECT_NE(epochs[1], epochs[2]) << "rank " << r;
  }
  // Epoch 0 and 1 of this seed, as computed in Python.
  EXPECT_EQ(local_shuffle_order(22, 7, 0, 2, 3), (std::vector<int64_t>{20, 14, 17, 15, 19, 21, 16, 18}));
  EXPECT_EQ(local_shuffle_order(22, 7, 1, 2, 3), (std::vector<int64_t>{17, 16, 18, 21, 19, 14, 15, 20}));

  // 20 items: shards of 6, 7, 7; batch size 3 gives 2 steps, so ranks 1 and 2 take 6 of their 7 items.
  // The one left out is the last of the shuffled shard, a different one from epoch to epoch.
  Loader rank1 = local_loader(std::make_shared<CountingDataset>(20), 3, 7, false, 1, 3);
  std::vector<int64_t> left_out;
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> items = one_epoch(rank1);
    ASSERT_EQ(items.size(), 6u);
    std::set<int64_t> seen(items.begin(), items.end());
    EXPECT_EQ(seen.size(), 6u);
    EXPECT_GE(*seen.begin(), 6);
    EXPECT_LT(*seen.rbegin(), 13);
    for (int64_t i = 6; i < 13; ++i)
      if (!seen.count(i)) left_out.push_back(i);
  }
  EXPECT_EQ(left_out, (std::vector<int64_t>{9, 8, 7, 7}));

  expect_error_containing([&] { local_loader(std::make_shared<CountingDataset>(2), 1, 0, false, 0, 3); },
                          {"at least 3 items", "2"});
  expect_error_containing([&] { local_loader(ds, 8, 0, true, 2, 3); }, {"batch_size 8", "shard of 7 items"});
}

TEST(Data, LocalShuffleRanksAreDisjoint) {
  for (const int64_t n : {22, 20}) {  // every item once; 20: the ranks' epochs leave two items out
    auto ds = std::make_shared<CountingDataset>(n);
    for (int e = 0; e < 3; ++e) {
      std::vector<int64_t> all;
      for (int r = 0; r < 3; ++r) {
        Loader loader = local_loader(ds, 3, 11, false, r, 3);
        loader.set_position({e, 0});
        const std::vector<int64_t> items = one_epoch(loader);
        all.insert(all.end(), items.begin(), items.end());
      }
      const std::set<int64_t> distinct(all.begin(), all.end());
      EXPECT_EQ(distinct.size(), all.size()) << "n " << n << " epoch " << e;
      EXPECT_EQ(static_cast<int64_t>(all.size()), n == 22 ? 22 : 18) << "epoch " << e;
    }
  }
}

TEST(Data, LocalShuffleStepsAndGlobalItemsAgree) {
  struct Case {
    int64_t n, batch;
    bool drop_last;
    int64_t batches;
    std::vector<std::vector<size_t>> sizes;  // per step, per rank
  };
  const std::vector<Case> cases = {
      {22, 2, false, 4, {{2, 2, 2}, {2, 2, 2}, {2, 2, 2}, {1, 1, 2}}},  // shards 7, 7, 8
      {20, 3, false, 2, {{3, 3, 3}, {3, 3, 3}}},                        // shards 6, 7, 7: one item left out
      {23, 3, false, 3, {{3, 3, 3}, {3, 3, 3}, {1, 2, 2}}},             // shards 7, 8, 8
      {23, 3, true, 2, {{3, 3, 3}, {3, 3, 3}}},                         // drop_last: 6 of each shard
  };
  for (const Case& c : cases) {
    auto ds = std::make_shared<CountingDataset>(c.n);
    std::vector<Loader> ranks;
    for (int r = 0; r < 3; ++r) ranks.push_back(local_loader(ds, c.batch, 5, c.drop_last, r, 3));
    for (const Loader& l : ranks) EXPECT_EQ(l.batches_per_epoch(), c.batches) << "n " << c.n;
    int64_t epoch_total = 0;
    for (const auto& step : c.sizes)
      for (size_t s : step) epoch_total += static_cast<int64_t>(s);
    for (int e = 0; e < 2; ++e) {
      int64_t index = 0;
      for (size_t k = 0; k < c.sizes.size(); ++k) {
        std::vector<size_t> sizes;
        int64_t sum = 0;
        for (Loader& l : ranks) {
          const size_t got = l.next_indices().size();
          sizes.push_back(got);
          sum += static_cast<int64_t>(got);
        }
        EXPECT_EQ(sizes, c.sizes[k]) << "n " << c.n << " step " << k;
        index += sum;
        for (const Loader& l : ranks) {
          EXPECT_EQ(l.last_global_items(), sum) << "n " << c.n << " step " << k;
          EXPECT_EQ(l.position(), (LoaderPosition{e, index}));
        }
      }
      EXPECT_EQ(index, epoch_total);
      for (const Loader& l : ranks) EXPECT_FALSE(l.has_next_in_epoch());
    }
  }
}

TEST(Data, LocalShuffleResumesExactly) {
  auto ds = std::make_shared<CountingDataset>(23);  // shards 7, 8, 8; 3 steps of batch 3 per epoch
  for (int r = 0; r < 3; ++r) {
    Loader original = local_loader(ds, 3, 1234, false, r, 3);
    for (int i = 0; i < 5; ++i) original.next();  // into the second epoch
    const LoaderPosition saved = original.position();
    EXPECT_EQ(saved, (LoaderPosition{1, 18}));
    std::vector<std::vector<int64_t>> after;
    std::vector<int64_t> global_after;
    for (int i = 0; i < 7; ++i) {
      after.push_back(as_vector(original.next()));
      global_after.push_back(original.last_global_items());
    }
    EXPECT_EQ(global_after, (std::vector<int64_t>{5, 9, 9, 5, 9, 9, 5}));
    const auto order1 = local_shuffle_order(23, 1234, 1, r, 3);
    const auto end = order1.begin() + std::min<int64_t>(9, static_cast<int64_t>(order1.size()));
    EXPECT_EQ(after[0], std::vector<int64_t>(order1.begin() + 6, end));

    for (const bool prefetch : {false, true}) {  // a new process: only the options and the saved position
      Loader resumed = local_loader(ds, 3, 1234, false, r, 3, prefetch);
      resumed.set_position(saved);
      for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(as_vector(resumed.next()), after[static_cast<size_t>(i)]) << "rank " << r << " batch " << i;
        EXPECT_EQ(resumed.last_global_items(), global_after[static_cast<size_t>(i)]);
      }
      EXPECT_EQ(resumed.position(), original.position());
      EXPECT_EQ(resumed.prefetched_batches(), prefetch ? 6 : 0);
    }
  }
  Loader loader = local_loader(ds, 3, 1234, false, 0, 3);
  loader.set_position({0, 23});  // the epoch's end is a boundary
  const auto rank0_epoch1 = local_shuffle_order(23, 1234, 1, 0, 3);
  EXPECT_EQ(as_vector(loader.next()), std::vector<int64_t>(rank0_epoch1.begin(), rank0_epoch1.begin() + 3));
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 9}));
  expect_error_containing([&] { loader.set_position({0, 5}); }, {"index 5", "not a step boundary", "multiple of 9"});
}

TEST(Data, LocalShuffleOneRankIsShuffle) {
  EXPECT_EQ(local_shuffle_order(10, 42, 3, 0, 1), shuffle_order(10, 42, 3));
  EXPECT_EQ(local_shuffle_order(1000, 9, 2, 0, 1), shuffle_order(1000, 9, 2));
  auto ds = std::make_shared<CountingDataset>(23);
  for (const bool drop_last : {false, true}) {
    LoaderOptions shuffle_options{5, true, 77, drop_last};
    Loader shuffle(ds, shuffle_options);
    Loader local = local_loader(ds, 5, 77, drop_last, 0, 1);
    EXPECT_EQ(local.batches_per_epoch(), shuffle.batches_per_epoch());
    EXPECT_EQ(local.batches_per_epoch(), drop_last ? 4 : 5);
    for (int i = 0; i < 12; ++i) {
      EXPECT_EQ(local.next_indices(), shuffle.next_indices()) << "batch " << i;
      EXPECT_EQ(local.last_global_items(), shuffle.last_global_items());
      EXPECT_EQ(local.position(), shuffle.position());
    }
    // Any index resumes as it does for Shuffle (one rank has no step boundaries to keep).
    local.set_position({1, 7});
    shuffle.set_position({1, 7});
    for (int i = 0; i < 6; ++i) EXPECT_EQ(as_vector(local.next()), as_vector(shuffle.next())) << "batch " << i;
    EXPECT_EQ(local.position(), shuffle.position());
  }
}

// ---- Text -----------------------------------------------------------------------------------------

TEST(Data, TextCorpusSplitAndWindows) {
  const std::string bytes = read_file(kDefaultTextFile);
  ASSERT_GT(bytes.size(), 10000u);
  const TextCorpus corpus;
  const auto n = static_cast<int64_t>(bytes.size());
  const int64_t n_val = n / 10;
  EXPECT_EQ(corpus.total_bytes(), n);
  EXPECT_EQ(corpus.val().numel(), n_val);
  EXPECT_EQ(corpus.train().numel(), n - n_val);
  EXPECT_EQ(corpus.train()[0].item<int64_t>(), static_cast<uint8_t>(bytes[0]));
  EXPECT_EQ(corpus.val()[0].item<int64_t>(), static_cast<uint8_t>(bytes[static_cast<size_t>(n - n_val)]));
  EXPECT_EQ(corpus.val()[n_val - 1].item<int64_t>(), static_cast<uint8_t>(bytes.back()));

  const int64_t t = 16;
  const TextWindows train(corpus.train(), t);
  EXPECT_EQ(train.size(), corpus.train().numel() - t);
  const Batch b = train.get({0, 100, train.size() - 1});
  EXPECT_EQ(b.input.sizes(), at::IntArrayRef({3, t}));
  EXPECT_EQ(b.target.sizes(), at::IntArrayRef({3, t}));
  EXPECT_EQ(b.input.dtype(), at::kLong);
  EXPECT_EQ(b.items, 3 * t);
  const at::Tensor train_long = corpus.train().to(at::kLong);
  EXPECT_TRUE(at::equal(b.input.tensor()[1], train_long.slice(0, 100, 100 + t)));
  EXPECT_TRUE(at::equal(b.target.tensor()[1], train_long.slice(0, 101, 101 + t)));
  EXPECT_TRUE(at::equal(b.target.tensor()[2], train_long.slice(0, train.size(), train.size() + t)));  // last byte
  EXPECT_TRUE(at::equal(b.target.tensor().slice(1, 0, t - 1), b.input.tensor().slice(1, 1, t)));

  // Evaluation windows: non-overlapping, covering the split once.
  const TextWindows val(corpus.val(), t, /*stride=*/t);
  EXPECT_EQ(val.size(), (n_val - t - 1) / t + 1);
  EXPECT_EQ(val.offset_of(3), 3 * t);
  const Batch vb = val.get({1});
  EXPECT_TRUE(at::equal(vb.input.tensor()[0], corpus.val().to(at::kLong).slice(0, t, 2 * t)));

  // Random offsets drawn deterministically: a shuffling loader over stride-1 windows.
  auto shared = std::make_shared<TextWindows>(corpus.train(), t);
  Loader a(shared, {4, true, 3, true});
  Loader c(shared, {4, true, 3, true});
  const Batch ba = a.next();
  EXPECT_TRUE(at::equal(ba.input.tensor(), c.next().input.tensor()));
  const auto order = shuffle_order(shared->size(), 3, 0);
  EXPECT_TRUE(at::equal(ba.input.tensor()[2], train_long.slice(0, order[2], order[2] + t)));

  expect_error_containing([&] { TextWindows(corpus.val(), n_val); }, {"block size"});
  expect_error_containing([&] { train.get({train.size()}); }, {"outside"});
}

TEST(Data, TextFilesConcatenateAndEntropy) {
  TempDir dir("text");
  const std::string a = (dir.path / "a.txt").string();
  const std::string b = (dir.path / "b.txt").string();
  std::ofstream(a, std::ios::binary) << std::string(40, 'x') << std::string(40, 'y');
  std::ofstream(b, std::ios::binary) << std::string(20, 'z');
  const TextCorpus corpus({a, b}, 0.2);
  EXPECT_EQ(corpus.total_bytes(), 100);
  EXPECT_EQ(corpus.train().numel(), 80);                 // all of a: 40 'x' + 40 'y'
  EXPECT_EQ(corpus.val()[0].item<int64_t>(), int64_t{'z'});  // b is the validation split
  EXPECT_NEAR(corpus.unigram_entropy(/*bits=*/true), 1.0, 1e-12);
  EXPECT_NEAR(corpus.unigram_entropy(/*bits=*/false), std::log(2.0), 1e-12);

  const double gpl_bits = TextCorpus().unigram_entropy();
  EXPECT_GT(gpl_bits, 4.0);  // English prose: about 4.5 bits per byte
  EXPECT_LT(gpl_bits, 5.0);

  const std::string missing = (dir.path / "missing.txt").string();
  expect_error_containing([&] { TextCorpus({a, missing}); }, {missing});
}

}  // namespace
}  // namespace ration::data
