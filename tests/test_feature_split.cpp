// test_feature_split.cpp — ctr's feature split without processes (models/feature_split.h): whole tables placed
// by rows x dim (every table once, every rank at least one, within Graham's bound of the best placement),
// and one step's messages routed by hand (what an all-to-all does: received[o][s] = sent[s][o]): ids reach
// their owners in rank order, pooled rows and gradients come back to the right samples. The same through
// c10d and in training: tests/distributed/fs_worker.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ration/base/check.h"
#include "ration/models/feature_split.h"

namespace ration::testing {
namespace {

using models::GlobalBags;
using models::IdRequests;

// ---- placement -------------------------------------------------------------------------------------------

int64_t largest_load(const std::vector<int>& owner, const std::vector<int64_t>& cost, int ranks) {
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  for (size_t f = 0; f < owner.size(); ++f) load[static_cast<size_t>(owner[f])] += cost[f];
  return *std::max_element(load.begin(), load.end());
}

// The best largest load over every assignment of the tables to ranks (each rank at least one table).
int64_t best_largest_load(const std::vector<int64_t>& cost, int ranks) {
  const size_t n = cost.size();
  std::vector<int> owner(n, 0);
  int64_t best = INT64_MAX;
  for (;;) {
    std::vector<bool> used(static_cast<size_t>(ranks), false);
    for (int o : owner) used[static_cast<size_t>(o)] = true;
    if (std::all_of(used.begin(), used.end(), [](bool u) { return u; }))
      best = std::min(best, largest_load(owner, cost, ranks));
    size_t i = 0;
    while (i < n && ++owner[i] == ranks) owner[i++] = 0;
    if (i == n) return best;
  }
}

TEST(FeatureSplitPlacement, ConfigTablesGoWholeToTheLightestRank) {
  // configs/ctr.toml's cardinalities, dim 16: the million-row table alone on rank 0, the rest on rank 1.
  const std::vector<int64_t> rows = {1000000, 100000, 10000, 1000}, dims(4, 16);
  EXPECT_EQ(models::place_tables(rows, dims, 2), (std::vector<int>{0, 1, 1, 1}));
  // Three ranks: the two largest alone, the two small ones with the lighter of them.
  EXPECT_EQ(models::place_tables(rows, dims, 3), (std::vector<int>{0, 1, 2, 2}));
  // Dims count: a 1000-row table of dim 4096 outweighs a 100000-row table of dim 16.
  EXPECT_EQ(models::place_tables({100000, 1000, 10, 10}, {16, 4096, 16, 16}, 2), (std::vector<int>{1, 0, 1, 1}));
  EXPECT_EQ(models::owned_fields({0, 1, 1, 1}, 1), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_THROW(models::place_tables({10, 10}, {4, 4}, 3), Error);
}

TEST(FeatureSplitPlacement, EveryTablePlacedOnceAndBalancedByRowsTimesDim) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 2 + static_cast<int>(rng() % 3);
    const size_t tables = static_cast<size_t>(ranks) + rng() % 4;
    std::vector<int64_t> rows(tables), dims(tables), cost(tables);
    for (size_t f = 0; f < tables; ++f) {
      rows[f] = 1 + static_cast<int64_t>(rng() % 100000);
      dims[f] = int64_t{8} << (rng() % 4);
      cost[f] = rows[f] * dims[f];
    }
    const std::vector<int> owner = models::place_tables(rows, dims, ranks);
    ASSERT_EQ(owner.size(), tables);
    std::vector<int> held(static_cast<size_t>(ranks), 0);
    for (int o : owner) {
      ASSERT_TRUE(o >= 0 && o < ranks);
      ++held[static_cast<size_t>(o)];
    }
    for (int h : held) EXPECT_GE(h, 1) << "a rank without a table";
    // Largest first onto the lightest rank: within Graham's 4/3 - 1/(3 ranks) of the best placement.
    const double bound = 4.0 / 3.0 - 1.0 / (3.0 * ranks);
    EXPECT_LE(static_cast<double>(largest_load(owner, cost, ranks)),
              bound * static_cast<double>(best_largest_load(cost, ranks)) + 1e-9)
        << "trial " << trial;
  }
}

// ---- routing ---------------------------------------------------------------------------------------------

// Rank `rank`'s bags of `fields` fields for `batch` samples; ids encode (rank, field, sample, position), so a
// misrouted id is recognised.
std::vector<data::SparseBag> bags_of(int rank, int64_t fields, int64_t batch) {
  std::vector<data::SparseBag> bags;
  for (int64_t f = 0; f < fields; ++f) {
    std::vector<int64_t> ids, offsets;
    for (int64_t i = 0; i < batch; ++i) {
      offsets.push_back(static_cast<int64_t>(ids.size()));
      for (int64_t k = 0; k < 1 + (i + f) % 3; ++k) ids.push_back(((rank * 100 + f) * 1000 + i) * 10 + k);
    }
    bags.push_back({at::tensor(ids, at::kLong), at::tensor(offsets, at::kLong)});
  }
  return bags;
}

// A stand-in for pooling: sample i's row is (sum of its ids, its bag size, field + 0.5), dim 3.
at::Tensor pool(const at::Tensor& ids, const at::Tensor& offsets, int64_t field) {
  const int64_t b = offsets.numel();
  at::Tensor out = at::zeros({b, 3}, at::kDouble);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t begin = offsets[i].item<int64_t>(), end = i + 1 < b ? offsets[i + 1].item<int64_t>() : ids.numel();
    out[i][0] = ids.narrow(0, begin, end - begin).sum().item<double>();
    out[i][1] = static_cast<double>(end - begin);
    out[i][2] = static_cast<double>(field) + 0.5;
  }
  return out.to(at::kFloat);
}

// What an all-to-all does: received[o][s] = sent[s][o].
std::vector<std::vector<at::Tensor>> exchange(const std::vector<std::vector<at::Tensor>>& sent) {
  std::vector<std::vector<at::Tensor>> received(sent.size());
  for (size_t o = 0; o < sent.size(); ++o)
    for (size_t s = 0; s < sent.size(); ++s) received[o].push_back(sent[s][o]);
  return received;
}

TEST(FeatureSplitRouting, IdsReachTheirOwnersAndPooledRowsAndGradientsComeBack) {
  const int ranks = 3;
  const int64_t fields = 5;
  const std::vector<int64_t> batch = {4, 0, 3};  // rank 1's shard is empty (a short last batch)
  const std::vector<int> owner = models::place_tables({50, 40, 30, 20, 10}, std::vector<int64_t>(5, 2), ranks);
  std::vector<std::vector<at::Tensor>> sent;
  for (int s = 0; s < ranks; ++s) sent.push_back(models::pack_id_requests(bags_of(s, fields, batch[static_cast<size_t>(s)]), batch[static_cast<size_t>(s)], owner, ranks));
  const auto received = exchange(sent);
  std::vector<IdRequests> asked;
  for (int o = 0; o < ranks; ++o) {
    const std::vector<int64_t> owned = models::owned_fields(owner, o);
    asked.push_back(models::unpack_id_requests(received[static_cast<size_t>(o)], owned));
    EXPECT_EQ(asked.back().samples, batch);
    ASSERT_EQ(asked.back().fields.size(), owned.size());
    for (size_t k = 0; k < owned.size(); ++k) {
      // The owner sees every rank's bags of its field, in rank order, offsets into the concatenation.
      const GlobalBags& g = asked.back().fields[k];
      EXPECT_EQ(g.field, owned[k]);
      std::vector<at::Tensor> ids, offsets;
      int64_t before = 0;
      for (int s = 0; s < ranks; ++s) {
        const data::SparseBag bag = bags_of(s, fields, batch[static_cast<size_t>(s)])[static_cast<size_t>(owned[k])];
        ids.push_back(bag.ids);
        offsets.push_back(bag.offsets + before);
        before += bag.ids.numel();
      }
      EXPECT_TRUE(at::equal(g.ids, at::cat(ids))) << "field " << owned[k];
      EXPECT_TRUE(at::equal(g.offsets, at::cat(offsets))) << "field " << owned[k];
    }
  }
  // Rows back: each owner pools every rank's bags of its fields; each rank gets its own samples' rows.
  std::vector<std::vector<at::Tensor>> replies;
  for (int o = 0; o < ranks; ++o) {
    std::vector<at::Tensor> rows;
    for (const GlobalBags& g : asked[static_cast<size_t>(o)].fields) rows.push_back(pool(g.ids, g.offsets, g.field));
    replies.push_back(models::pack_by_source(rows, asked[static_cast<size_t>(o)].samples));
  }
  const auto back = exchange(replies);
  for (int s = 0; s < ranks; ++s) {
    const std::vector<at::Tensor> rows = models::unpack_from_owners(back[static_cast<size_t>(s)], owner, batch[static_cast<size_t>(s)], 3);
    const std::vector<data::SparseBag> mine = bags_of(s, fields, batch[static_cast<size_t>(s)]);
    ASSERT_EQ(rows.size(), static_cast<size_t>(fields));
    for (int64_t f = 0; f < fields; ++f)
      EXPECT_TRUE(at::equal(rows[static_cast<size_t>(f)], pool(mine[static_cast<size_t>(f)].ids, mine[static_cast<size_t>(f)].offsets, f)))
          << "rank " << s << " field " << f;
  }
  // Gradients: every rank's (B_s, 3) per field go to the owner, concatenated in rank order.
  auto grad_of = [](int s, int64_t f, int64_t b) { return at::arange(b * 3, at::kFloat).view({b, 3}) + 1000 * s + 10 * f; };
  std::vector<std::vector<at::Tensor>> grads;
  for (int s = 0; s < ranks; ++s) {
    std::vector<at::Tensor> g;
    for (int64_t f = 0; f < fields; ++f) g.push_back(grad_of(s, f, batch[static_cast<size_t>(s)]));
    grads.push_back(models::pack_by_owner(g, owner, ranks));
  }
  const auto to_owners = exchange(grads);
  for (int o = 0; o < ranks; ++o) {
    const std::vector<int64_t> owned = models::owned_fields(owner, o);
    const std::vector<at::Tensor> summed = models::unpack_from_sources(to_owners[static_cast<size_t>(o)],
                                                                       static_cast<int64_t>(owned.size()), batch, 3);
    for (size_t k = 0; k < owned.size(); ++k) {
      std::vector<at::Tensor> expected;
      for (int s = 0; s < ranks; ++s) expected.push_back(grad_of(s, owned[k], batch[static_cast<size_t>(s)]));
      EXPECT_TRUE(at::equal(summed[k], at::cat(expected))) << "owner " << o << " field " << owned[k];
    }
  }
}

TEST(FeatureSplitRouting, AMessageOfTheWrongLengthIsRefused) {
  const std::vector<int> owner = {0, 1};
  std::vector<at::Tensor> sent = models::pack_id_requests(bags_of(0, 2, 2), 2, owner, 2);
  // Rank 1 owns field 1 only; told it owns both, the message ends early.
  EXPECT_THROW(models::unpack_id_requests({sent[1], sent[1]}, {0, 1}), Error);
  EXPECT_THROW(models::unpack_from_owners({at::zeros({6}), at::zeros({5})}, owner, 2, 3), Error);
}

}  // namespace
}  // namespace ration::testing
