// feature_split.cpp — placement and message layouts of ctr's feature split (see feature_split.h).
#include "ration/models/feature_split.h"

#include <algorithm>
#include <numeric>

#include "ration/base/check.h"

namespace ration::models {

std::vector<int> place_tables(const std::vector<int64_t>& rows, const std::vector<int64_t>& dims, int ranks) {
  RATION_CHECK(rows.size() == dims.size(), "place_tables: ", rows.size(), " row counts for ", dims.size(), " tables");
  RATION_CHECK(ranks >= 1 && static_cast<int64_t>(rows.size()) >= ranks, "cannot place ", rows.size(),
               " tables whole on ", ranks, " ranks: every rank needs at least one");
  std::vector<int64_t> cost(rows.size());
  for (size_t f = 0; f < rows.size(); ++f) cost[f] = std::max<int64_t>(rows[f], 1) * dims[f];
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(rows.size(), 0);
  for (size_t f : order) {
    const auto lightest = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = static_cast<int>(lightest);
    load[lightest] += cost[f];
  }
  return owner;
}

std::vector<int64_t> owned_fields(const std::vector<int>& owner, int rank) {
  std::vector<int64_t> fields;
  for (size_t f = 0; f < owner.size(); ++f)
    if (owner[f] == rank) fields.push_back(static_cast<int64_t>(f));
  return fields;
}

std::vector<at::Tensor> pack_id_requests(const std::vector<data::SparseBag>& bags, int64_t batch,
                                         const std::vector<int>& owner, int ranks) {
  RATION_CHECK(bags.size() == owner.size(), "feature split: ", bags.size(), " fields in the batch, ", owner.size(),
               " tables placed");
  std::vector<std::vector<at::Tensor>> parts(static_cast<size_t>(ranks));
  for (auto& p : parts) p.push_back(at::full({1}, batch, at::kLong));
  for (size_t f = 0; f < bags.size(); ++f) {
    const at::Tensor ids = bags[f].ids.to(at::kLong).reshape({-1});
    const at::Tensor offsets = bags[f].offsets.to(at::kLong).reshape({-1});
    RATION_CHECK(offsets.numel() == batch, "feature split: field ", f, " has ", offsets.numel(), " bags for ", batch,
                 " samples");
    auto& p = parts[static_cast<size_t>(owner[f])];
    p.push_back(at::full({1}, ids.numel(), at::kLong));
    p.push_back(offsets);
    p.push_back(ids);
  }
  std::vector<at::Tensor> out;
  for (auto& p : parts) out.push_back(at::cat(p));
  return out;
}

IdRequests unpack_id_requests(const std::vector<at::Tensor>& received, const std::vector<int64_t>& owned) {
  IdRequests r;
  std::vector<std::vector<at::Tensor>> ids(owned.size()), offsets(owned.size());
  std::vector<int64_t> ids_before(owned.size(), 0);  // per owned field: ids of the ranks before
  for (size_t s = 0; s < received.size(); ++s) {
    const at::Tensor& m = received[s];
    RATION_CHECK(m.numel() >= 1, "feature split: an empty id request from rank ", s);
    const int64_t* p = m.data_ptr<int64_t>();
    const int64_t batch = p[0];
    int64_t at = 1;
    r.samples.push_back(batch);
    for (size_t k = 0; k < owned.size(); ++k) {
      RATION_CHECK(at + 1 + batch <= m.numel(), "feature split: rank ", s, "'s id request ends early (field ", owned[k], ")");
      const int64_t n = p[at];
      RATION_CHECK(n >= 0 && at + 1 + batch + n <= m.numel(), "feature split: rank ", s, "'s id request ends early");
      offsets[k].push_back(m.narrow(0, at + 1, batch) + ids_before[k]);
      ids[k].push_back(m.narrow(0, at + 1 + batch, n));
      ids_before[k] += n;
      at += 1 + batch + n;
    }
    RATION_CHECK(at == m.numel(), "feature split: rank ", s, "'s id request has ", m.numel() - at,
                 " elements more than the fields this rank owns (do the ranks agree on the placement?)");
  }
  for (size_t k = 0; k < owned.size(); ++k) {
    GlobalBags g;
    g.field = owned[k];
    g.ids = ids[k].empty() ? at::empty({0}, at::kLong) : at::cat(ids[k]);
    g.offsets = offsets[k].empty() ? at::empty({0}, at::kLong) : at::cat(offsets[k]);
    r.fields.push_back(std::move(g));
  }
  return r;
}

std::vector<at::Tensor> pack_by_source(const std::vector<at::Tensor>& owned_rows, const std::vector<int64_t>& samples) {
  std::vector<at::Tensor> out;
  int64_t first = 0;
  for (int64_t b : samples) {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& rows : owned_rows) parts.push_back(rows.narrow(0, first, b).reshape({-1}));
    out.push_back(parts.empty() ? at::empty({0}, at::kFloat) : at::cat(parts).to(at::kFloat));
    first += b;
  }
  return out;
}

std::vector<at::Tensor> unpack_from_owners(const std::vector<at::Tensor>& received, const std::vector<int>& owner,
                                           int64_t batch, int64_t dim) {
  std::vector<int64_t> at(received.size(), 0);  // per owner: elements read
  std::vector<at::Tensor> rows;
  for (int o : owner) {
    const at::Tensor& m = received[static_cast<size_t>(o)];
    int64_t& a = at[static_cast<size_t>(o)];
    RATION_CHECK(a + batch * dim <= m.numel(), "feature split: rank ", o, " sent ", m.numel(),
                 " floats, fewer than its fields' rows for ", batch, " samples");
    rows.push_back(m.narrow(0, a, batch * dim).view({batch, dim}));
    a += batch * dim;
  }
  for (size_t o = 0; o < received.size(); ++o)
    RATION_CHECK(at[o] == received[o].numel(), "feature split: rank ", o, " sent ", received[o].numel(),
                 " floats; its fields' rows are ", at[o]);
  return rows;
}

std::vector<at::Tensor> pack_by_owner(const std::vector<at::Tensor>& rows, const std::vector<int>& owner, int ranks) {
  std::vector<std::vector<at::Tensor>> parts(static_cast<size_t>(ranks));
  for (size_t f = 0; f < rows.size(); ++f) parts[static_cast<size_t>(owner[f])].push_back(rows[f].to(at::kFloat).reshape({-1}));
  std::vector<at::Tensor> out;
  for (auto& p : parts) out.push_back(p.empty() ? at::empty({0}, at::kFloat) : at::cat(p));
  return out;
}

std::vector<at::Tensor> unpack_from_sources(const std::vector<at::Tensor>& received, int64_t owned_count,
                                            const std::vector<int64_t>& samples, int64_t dim) {
  RATION_CHECK(received.size() == samples.size(), "feature split: ", received.size(), " messages for ",
               samples.size(), " ranks");
  std::vector<std::vector<at::Tensor>> parts(static_cast<size_t>(owned_count));
  for (size_t s = 0; s < received.size(); ++s) {
    const int64_t per_field = samples[s] * dim;
    RATION_CHECK(received[s].numel() == owned_count * per_field, "feature split: rank ", s, " sent ",
                 received[s].numel(), " gradient floats; expected ", owned_count, " fields x ", samples[s],
                 " samples x ", dim);
    for (int64_t k = 0; k < owned_count; ++k)
      parts[static_cast<size_t>(k)].push_back(received[s].narrow(0, k * per_field, per_field).view({samples[s], dim}));
  }
  std::vector<at::Tensor> out;
  for (auto& p : parts) out.push_back(at::cat(p));
  return out;
}

}  // namespace ration::models
