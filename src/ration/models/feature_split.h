// feature_split.h — the pieces of ctr's feature split (parallel.features = "table"; docs/DISTRIBUTED.md,
// "Feature split"): where each embedding table lives, and how one batch's lookups and their gradients are
// packed into the messages of an all-to-all over the ranks that hold the tables.
// Owns: the placement (whole tables, balanced by rows x dim) and the message layouts, as pure functions of
//       tensors, so that a test can route ids to their owners and back without processes.
// Does not own: the collective (distributed/world.h, World::all_to_all), the tables (ps/), pooling and the
//       model's use of the routed rows (models/ctr.h, ctr_split.cpp).
//
// One training step, D ranks, rank s holding B_s samples, field f owned by rank owner[f]:
//   1. ids:       rank s -> owner[f]: its bags of f (offsets, ids)          pack_id_requests / unpack_id_requests
//   2. rows:      owner[f] -> rank s: the pooled rows of s's samples (B_s, dim)   pack_by_source / unpack_from_owners
//   3. gradients: rank s -> owner[f]: d loss_s / d pooled rows (B_s, dim)    pack_by_owner / unpack_from_sources
// Each message to or from one rank holds every field that rank owns, in field order.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "ration/data/batch.h"

namespace ration::models {

// The owner rank of every table: tables by rows x dim, largest first (ties: the lower field), each to the
// rank holding the fewest rows x dim so far (ties: the lower rank). Every rank computes the same placement.
// rows[f] <= 0 (not declared) counts as one row. Needs at least as many tables as ranks, so that every
// rank holds at least one.
std::vector<int> place_tables(const std::vector<int64_t>& rows, const std::vector<int64_t>& dims, int ranks);
// The fields `rank` owns, ascending.
std::vector<int64_t> owned_fields(const std::vector<int>& owner, int rank);

// Step 1, on the requesting rank: one int64 message per rank r,
//   [B, then for each field r owns, in field order: n_f, offsets (B), ids (n_f)]
// bags: every field's bag of this rank's batch (offsets (B), ids (n_f)); batch = B (0: nothing to look up).
std::vector<at::Tensor> pack_id_requests(const std::vector<data::SparseBag>& bags, int64_t batch,
                                         const std::vector<int>& owner, int ranks);

// One owned field's bags over every requesting rank, in rank order: the samples of rank 0, then rank 1...
struct GlobalBags {
  int64_t field = 0;
  at::Tensor ids;      // (n_0 + n_1 + ...) int64
  at::Tensor offsets;  // (B_0 + B_1 + ...) int64 into ids
};
struct IdRequests {
  std::vector<int64_t> samples;    // B_s of every requesting rank s
  std::vector<GlobalBags> fields;  // the fields this rank owns, ascending
};
// Step 1, on the owner: received[s] is rank s's message; owned as owned_fields() gives it.
IdRequests unpack_id_requests(const std::vector<at::Tensor>& received, const std::vector<int64_t>& owned);

// Step 2, on the owner: each owned field's rows (sum_s B_s, dim), cut into rank s's samples; one float
// message per rank: its rows of every owned field, (B_s, dim) each, in field order.
std::vector<at::Tensor> pack_by_source(const std::vector<at::Tensor>& owned_rows, const std::vector<int64_t>& samples);
// Step 2, on the requester: received[r] from owner r; returns every field's (B, dim) rows.
std::vector<at::Tensor> unpack_from_owners(const std::vector<at::Tensor>& received, const std::vector<int>& owner,
                                           int64_t batch, int64_t dim);

// Step 3, on the requester: every field's (B, dim) rows, one message per owner (its fields, in field order).
std::vector<at::Tensor> pack_by_owner(const std::vector<at::Tensor>& rows, const std::vector<int>& owner, int ranks);
// Step 3, on the owner: per owned field, every rank's rows in rank order (sum_s B_s, dim).
std::vector<at::Tensor> unpack_from_sources(const std::vector<at::Tensor>& received, int64_t owned_count,
                                            const std::vector<int64_t>& samples, int64_t dim);

}  // namespace ration::models
