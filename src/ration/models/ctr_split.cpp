// ctr_split.cpp — ctr's feature split (parallel.features = "table"; docs/DISTRIBUTED.md, "Feature split").
// Owns: placing the tables on the data-parallel ranks (Ctr::split_features), the routed lookup (every rank's
//       ids of a field to its owner, which pulls, pools and sends the pooled rows back), and the gradients'
//       way back after backward (the owner sums every rank's pooled-row gradients into its rows' and
//       pushes them once, as one process pushes its batch's). Does not own: the message layouts and the
//       placement (feature_split.h), the dense part's averaging (train/model_parallel_step.h).
//
// Equal to one process at the global batch: rank s's loss is the mean over its B_s samples, so its pooled
// rows' gradient is D times the one-process gradient of those samples (B = D x B_s); the owner divides the
// gradients it receives by D (the dense gradients are averaged over the D ranks the same way), pools with
// the same op over the same rows (first-touch rows depend only on the table's seed and the id), and pushes
// one sparse gradient per table per step, so the store's optimiser sees what one process's push gives it.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "ration/base/check.h"
#include "ration/models/ctr_split.h"
#include "ration/models/feature_split.h"

namespace ration::models {
namespace {
// Bytes of `pieces` that leave this rank (its own piece stays).
int64_t bytes_to_others(const std::vector<at::Tensor>& pieces, int rank) {
  int64_t bytes = 0;
  for (size_t r = 0; r < pieces.size(); ++r)
    if (static_cast<int>(r) != rank) bytes += pieces[r].numel() * static_cast<int64_t>(pieces[r].element_size());
  return bytes;
}
}  // namespace

std::string Ctr::split_features(const dist::World& group) {
  if (!client_->embedded())
    return "the feature split places whole embedding tables on the training ranks' own (embedded) parameter-server "
           "shards, but ps.endpoints is set (remote servers hold every table already); leave ps.endpoints empty, or "
           "train data parallel with the shared servers (parallel.features = \"none\")";
  if (options.num_fields < group.size())
    return "model.num_fields = " + std::to_string(options.num_fields) + " tables cannot be placed whole on " +
           std::to_string(group.size()) + " data-parallel ranks (each rank holds at least one table); use at most " +
           std::to_string(options.num_fields) + " ranks, or more sparse fields";
  auto s = std::make_unique<Split>();
  s->group = group;
  const std::vector<int64_t> dims(static_cast<size_t>(options.num_fields), options.embedding_dim);
  s->owner = place_tables(options.table_rows, dims, group.size());
  s->owned = owned_fields(s->owner, group.rank());
  for (int64_t f = 0; f < options.num_fields; ++f)
    s->rows_x_dim.push_back(std::max<int64_t>(options.table_rows[static_cast<size_t>(f)], 1) * options.embedding_dim);
  // This rank's shards hold its tables only, and snapshot beside the other ranks' (ps/rank<r>). Split at
  // start-up, before any lookup: nothing was prefetched from the tables it replaces.
  RATION_CHECK(prefetches_.empty(), "ctr: split_features after a prefetch (split the model before training)");
  if (!options.client.snapshot_dir.empty())
    options.client.snapshot_dir += "/rank" + std::to_string(group.rank());
  open_tables(s->owned);
  split_ = std::move(s);
  return {};
}

std::vector<Value> Ctr::routed_lookup(const std::vector<data::SparseBag>& bags, int64_t batch, ps::MissingRow missing,
                                      bool trainable) {
  Split& s = *split_;
  RATION_CHECK(static_cast<int64_t>(bags.size()) == options.num_fields, "ctr expects ", options.num_fields,
               " sparse fields (model.num_fields); the batch has ", bags.size());
  const int64_t dim = options.embedding_dim;
  // 1. ids to the owners; the owner pulls each of its tables' rows once for every rank's bags, and pools.
  const std::vector<at::Tensor> requests = pack_id_requests(bags, batch, s.owner, s.group.size());
  const IdRequests asked = unpack_id_requests(s.group.all_to_all(requests), s.owned);
  std::vector<FieldRows> served;
  std::vector<at::Tensor> pooled_here;  // per owned field (sum_s B_s, D)
  {
    NoGradGuard no_grad;
    for (const GlobalBags& g : asked.fields) {
      FieldRows fr;
      fr.table = table_name(g.field);
      ps::PulledRows pulled = client_->pull(fr.table, g.ids.data_ptr<int64_t>(), g.ids.numel(), missing);
      fr.unique_ids = std::move(pulled.unique_ids);
      at::Tensor rows = pulled.rows;
      const auto dtype = parameter_options().dtype().toScalarType();
      if (rows.scalar_type() != dtype) rows = rows.to(dtype);
      fr.rows = Value(rows);
      fr.local_index = Value(pulled.local_index);
      fr.offsets = Value(g.offsets);
      pooled_here.push_back(ops::embedding_bag(fr.rows, fr.local_index, fr.offsets, options.bag_mode).tensor());
      served.push_back(std::move(fr));
    }
  }
  // 2. the pooled rows back to the ranks that asked.
  const std::vector<at::Tensor> replies = pack_by_source(pooled_here, asked.samples);
  const std::vector<at::Tensor> rows = unpack_from_owners(s.group.all_to_all(replies), s.owner, batch, dim);
  std::vector<Value> pooled;
  const at::TensorOptions p = parameter_options();
  for (const at::Tensor& r : rows) pooled.push_back(Value(r.to(p.dtype().toScalarType()).clone(), trainable));
  if (trainable) {
    s.step_bytes += bytes_to_others(requests, s.group.rank()) + bytes_to_others(replies, s.group.rank());
    s.pooled = pooled;
    s.served = std::move(served);
    s.samples = asked.samples;
    s.pending = true;
  }
  return pooled;
}

void Ctr::evaluate_nothing() {
  if (!split_) return;
  NoGradGuard no_grad;
  std::vector<data::SparseBag> none(static_cast<size_t>(options.num_fields));
  for (auto& b : none) b = {at::empty({0}, at::kLong), at::empty({0}, at::kLong)};
  (void)routed_lookup(none, 0, ps::MissingRow::ReadDefault, false);
}

// 3. Every rank's pooled-row gradients to the owners; each owner's rows get the gradient of the global mean
// loss (the sum over ranks / D) through the same pooling op, and are pushed as one process pushes them.
void Ctr::route_gradients(int64_t step) {
  Split& s = *split_;
  if (!s.pending) return;  // no training lookup since the last push (every rank alike)
  s.pending = false;
  std::vector<at::Tensor> grads;
  for (Value& v : s.pooled) grads.push_back(v.grad().defined() ? v.grad() : at::zeros_like(v.tensor()));
  s.pooled.clear();
  const std::vector<at::Tensor> to_owners = pack_by_owner(grads, s.owner, s.group.size());
  s.step_bytes += bytes_to_others(to_owners, s.group.rank());
  ++s.steps;
  const std::vector<at::Tensor> summed = unpack_from_sources(s.group.all_to_all(to_owners),
                                                             static_cast<int64_t>(s.owned.size()), s.samples,
                                                             options.embedding_dim);
  RATION_CHECK(grad_enabled(), "ctr's feature split routes its rows' gradients after backward with grad mode on");
  const double ranks = static_cast<double>(s.group.size());
  for (size_t k = 0; k < s.served.size(); ++k) {
    FieldRows& f = s.served[k];
    f.rows = Value(f.rows.tensor(), /*requires_grad=*/true);
    const Value out = ops::embedding_bag(f.rows, f.local_index, f.offsets, options.bag_mode);  // (sum_s B_s, D)
    out.backward(summed[k].to(out.tensor().scalar_type()).div(ranks));
  }
  step_fields_ = std::move(s.served);
  s.served.clear();
  push_gradients(step);
}

namespace {
std::string placement_text(const std::vector<int>& owner) {
  std::ostringstream os;
  for (size_t f = 0; f < owner.size(); ++f) os << (f ? " " : "") << owner[f];
  return os.str();
}
}  // namespace

void Ctr::save_placement() const {
  const std::string path = options.client.snapshot_dir + "/placement";
  std::ofstream out(path, std::ios::trunc);
  out << placement_text(split_->owner) << "\n";
  RATION_CHECK(out.good(), "ctr: could not write the feature split's placement to ", path);
}

void Ctr::check_placement(const std::string& dir) const {
  const std::string path = dir + "/placement";
  std::ifstream in(path);
  std::string saved;
  RATION_CHECK(in && std::getline(in, saved), "ctr: no feature-split placement at ", path,
               " (this rank's tables of the checkpoint); resume with parallel.features = \"table\" and the number ",
               "of ranks the checkpoint was saved with");
  const std::string now = placement_text(split_->owner);
  RATION_CHECK(saved == now, "ctr: the checkpoint's tables were placed on ranks [", saved, "] (field by field, ", path,
               "), this run places them on [", now, "]; resume with the number of ranks and the tables (data sizes) ",
               "it was saved with");
}

void Ctr::append_split_metrics(std::vector<std::pair<std::string, double>>& metrics) const {
  metrics.emplace_back("feature_split", 1.0);
  metrics.emplace_back("tables_here", static_cast<double>(split_->owned.size()));
  // What this rank's training steps sent to the others (ids, pooled rows, their gradients), per step.
  metrics.emplace_back("split_bytes_sent_per_step",
                       split_->steps > 0 ? static_cast<double>(split_->step_bytes) / static_cast<double>(split_->steps) : 0.0);
  for (size_t f = 0; f < split_->owner.size(); ++f) {
    metrics.emplace_back("owner." + table_name(static_cast<int64_t>(f)), static_cast<double>(split_->owner[f]));
    metrics.emplace_back("rows_x_dim." + table_name(static_cast<int64_t>(f)), static_cast<double>(split_->rows_x_dim[f]));
  }
}

}  // namespace ration::models
