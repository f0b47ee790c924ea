// ctr.cpp — the "ctr" family (see ctr.h): config, layers, PS lookups, forward, loss, evaluation.
#include "ration/models/ctr.h"

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>

#include "ration/base/check.h"
#include "ration/models/ctr_split.h"
#include "ration/models/families.h"
#include "ration/ps/server.h"
#include "ration/step/hooks.h"

namespace ration::models {

CtrOptions CtrOptions::from_config(Config& cfg) {
  CtrOptions o;
  o.num_dense = published_int(cfg, "data.num_dense", o.num_dense);
  o.num_dense = cfg.get_int("model.num_dense", o.num_dense);
  o.num_fields = published_int(cfg, "data.num_fields", o.num_fields);
  o.num_fields = cfg.get_int("model.num_fields", o.num_fields);
  o.embedding_dim = cfg.get_int("model.embedding_dim", o.embedding_dim);
  o.bottom = cfg.get_int_list("model.bottom", o.bottom);
  o.top = cfg.get_int_list("model.top", o.top);
  const std::string mode = cfg.get_choice("model.bag_mode", "sum", {"sum", "mean"});
  o.bag_mode = mode == "sum" ? ops::EmbeddingBagMode::Sum : ops::EmbeddingBagMode::Mean;
  RATION_CHECK(o.num_dense >= 1 && o.num_fields >= 1 && o.embedding_dim >= 1, cfg.origin(),
               ": model.num_dense, model.num_fields and model.embedding_dim must be >= 1");
  for (int64_t w : o.bottom) RATION_CHECK(w >= 1, cfg.origin(), ": model.bottom widths must be >= 1");
  for (int64_t w : o.top) RATION_CHECK(w >= 1, cfg.origin(), ": model.top widths must be >= 1");
  for (int64_t f = 0; f < o.num_fields; ++f)
    o.table_rows.push_back(published_int(cfg, "data.field" + std::to_string(f) + "_rows", 0));

  // [ps]
  o.client.endpoints = ps::split_endpoints(cfg.get_string("ps.endpoints", ""));
  o.client.embedded_shards = cfg.get_int("ps.shards", 1);
  o.client.retries = static_cast<int>(cfg.get_int("ps.retries", o.client.retries));
  o.client.timeout_ms = cfg.get_int("ps.timeout_ms", o.client.timeout_ms);
  RATION_CHECK(o.client.timeout_ms >= 1, cfg.origin(), ": ps.timeout_ms must be >= 1");
  // A server started with a smaller --max-ids than the default request size: send fewer ids per request.
  o.client.max_ids_per_request = cfg.get_int("ps.max_ids_per_request", o.client.max_ids_per_request);
  RATION_CHECK(o.client.max_ids_per_request >= 1, cfg.origin(), ": ps.max_ids_per_request must be an integer >= 1 "
               "(ids per Pull/Push request; at most the servers' --max-ids), got ", o.client.max_ids_per_request);
  const std::string token_file = cfg.get_string("ps.auth_token_file", "");
  if (!token_file.empty()) o.client.auth_token = ps::read_token_file(token_file);
  o.client.tls_ca = cfg.get_string("ps.tls_ca", "");
  o.client.tls_cert = cfg.get_string("ps.tls_cert", "");
  o.client.tls_key = cfg.get_string("ps.tls_key", "");
  o.client.tls_target_name = cfg.get_string("ps.tls_target_name", "");
  RATION_CHECK(o.client.tls_cert.empty() == o.client.tls_key.empty(), cfg.origin(),
               ": ps.tls_cert and ps.tls_key must be given together");
  // TLS is on exactly when ps.tls_ca names the CA that verifies the servers: a client certificate without
  // it would silently go out in plaintext.
  RATION_CHECK(o.client.tls_cert.empty() || !o.client.tls_ca.empty(), cfg.origin(),
               ": ps.tls_cert / ps.tls_key (this client's certificate) need ps.tls_ca (the CA file that verifies the "
               "servers' certificates): without it the trainer would talk to the servers in plaintext");
  const std::string ckpt = cfg.has("train.checkpoint_dir") ? cfg.get_string("train.checkpoint_dir", "") : "";
  o.explicit_snapshot_dir = cfg.has("ps.snapshot_dir");
  o.client.snapshot_dir = cfg.get_string("ps.snapshot_dir", ckpt.empty() ? "" : ckpt + "/ps");
  // Checkpoints snapshot every shard: a remote shard that cannot is refused at connect (check_health).
  o.client.need_snapshots = !ckpt.empty();
  o.table.dim = o.embedding_dim;
  o.table.seed = static_cast<uint64_t>(cfg.get_int("ps.seed", cfg.has("train.seed") ? cfg.get_int("train.seed", 0) : 0));
  o.table.init_scale = static_cast<float>(cfg.get_double("ps.init_scale", o.table.init_scale));
  o.table.optimizer.kind =
      ps::optimizer_kind_from_name(cfg.get_choice("ps.optimizer", "adagrad", {"sgd", "adagrad", "adam", "ftrl"}),
                                   cfg.origin());
  o.table.optimizer.lr = static_cast<float>(cfg.get_double("ps.lr", o.table.optimizer.lr));
  o.table.optimizer.initial_accumulator =
      static_cast<float>(cfg.get_double("ps.initial_accumulator", o.table.optimizer.initial_accumulator));
  RATION_CHECK(o.table.optimizer.lr > 0, cfg.origin(), ": ps.lr must be > 0");
  o.prefetch = cfg.get_bool("ps.prefetch", o.prefetch);
  const std::string repull = cfg.get_choice("ps.repull", "auto", {"auto", "after_push", "on_collect"});
  o.repull = repull == "auto"         ? RepullTiming::Auto
             : repull == "after_push" ? RepullTiming::AfterPush
                                      : RepullTiming::OnCollect;
  // Eviction (docs/METHODS.md, "Disabling and re-admission"): the keys are the `ration ps serve` flags'.
  ps::EvictOptions& e = o.evict;
  e.policy = ps::evict_policy_from_name(
      cfg.get_choice("ps.evict", "none", {"none", "importance", "frequency", "lru", "l2"}), cfg.origin() + ": ps.evict");
  e.scope = ps::evict_scope_from_name(cfg.get_choice("ps.evict_scope", "slot", {"slot", "shard"}),
                                      cfg.origin() + ": ps.evict_scope");
  e.max_bytes = cfg.get_bytes("ps.max_bytes", e.max_bytes);
  e.evict_every = cfg.get_int("ps.evict_every", e.evict_every);
  e.keep_fraction = cfg.get_double("ps.keep_fraction", e.keep_fraction);
  e.threshold = cfg.get_double("ps.evict_threshold", e.threshold);
  e.readmit_after = cfg.get_int("ps.readmit_after", e.readmit_after);
  e.importance_decay = cfg.get_double("ps.importance_decay", e.importance_decay);
  e.headroom = cfg.get_double("ps.evict_headroom", e.headroom);
  e.grace_steps = cfg.get_int("ps.evict_grace", e.grace_steps);
  e.disabled_share = cfg.get_double("ps.disabled_share", e.disabled_share);
  e.validate(cfg.origin());
  RATION_CHECK(!e.active() || o.client.endpoints.empty(), cfg.origin(), ": ps.evict = '",
               ps::evict_policy_name(e.policy), "' configures embedded shards only; with ps.endpoints set, start each ",
               "server with `ration ps serve --evict ", ps::evict_policy_name(e.policy),
               " --max-bytes ...` and leave ps.evict unset (or \"none\")");
  return o;
}

Ctr::Ctr(const CtrOptions& o) : options(o), explicit_snapshot_dir_(o.explicit_snapshot_dir) {
  int64_t width = o.num_dense;
  std::vector<int64_t> widths = o.bottom;
  widths.push_back(o.embedding_dim);
  for (size_t i = 0; i < widths.size(); ++i) {
    bottom.push_back(register_module("bottom." + std::to_string(i), std::make_shared<nn::Linear>(width, widths[i])));
    width = widths[i];
  }
  const int64_t vectors = o.num_fields + 1;
  width = o.embedding_dim + vectors * (vectors - 1) / 2;
  std::vector<int64_t> tw = o.top;
  tw.push_back(1);
  for (size_t i = 0; i < tw.size(); ++i) {
    top.push_back(register_module("top." + std::to_string(i), std::make_shared<nn::Linear>(width, tw[i])));
    width = tw[i];
  }
  // "auto" re-pulls after the push, embedded or remote: measured on an idle machine, it beat re-pulling on
  // collection in both cases (BENCHMARKS.md, "gRPC loopback and the trainer's prefetch").
  if (options.repull == RepullTiming::Auto) options.repull = RepullTiming::AfterPush;
  std::vector<int64_t> fields(static_cast<size_t>(o.num_fields));
  for (int64_t f = 0; f < o.num_fields; ++f) fields[static_cast<size_t>(f)] = f;
  open_tables(fields);
  hook_ = std::make_unique<PsHook>(*this);
}

void Ctr::open_tables(const std::vector<int64_t>& fields) {
  const CtrOptions& o = options;
  client_ = std::make_shared<ps::PsClient>(o.client);
  if (!client_->embedded()) client_->check_health();
  if (o.evict.active()) {
    // The cap is the total over the embedded shards: each holds about 1/N of every table's ids.
    ps::EvictOptions per_shard = o.evict;
    per_shard.max_bytes = o.evict.max_bytes / client_->num_shards();
    for (int i = 0; i < client_->num_shards(); ++i) client_->embedded_shard(i).set_eviction(per_shard);
  }
  std::vector<ps::TableOptions> tables;
  for (int64_t f : fields) {  // a table's first-touch rows depend on (its seed, the id): the same on any rank
    ps::TableOptions t = o.table;
    t.name = table_name(f);
    t.dim = o.embedding_dim;
    t.seed = ps::mix64(o.table.seed * 1000003ULL + static_cast<uint64_t>(f));
    tables.push_back(t);
  }
  client_->declare_tables(tables);
}

// Embedded shards live inside each process: under data parallel every rank would train a private table.
std::string Ctr::data_parallel_refusal() const {
  if (!client_->embedded()) return {};  // shared servers: every rank pulls and pushes the same tables
  return "the ctr model keeps its embedding tables on parameter-server shards embedded in each process "
         "(ps.endpoints is empty), so with more than one rank each would train a private table. Start the "
         "shared servers first, one per shard (`ration ps serve --listen HOST:PORT --shard I/N`, "
         "see README), and set ps.endpoints = \"HOST:PORT,...\" on every rank; every rank then pulls and "
         "pushes the same tables (each push applied as it arrives). Or place whole tables on the ranks with "
         "parallel.features = \"table\" (docs/DISTRIBUTED.md, \"Feature split\"), or train with one process";
}

Ctr::~Ctr() {
  // A prefetch in flight reads the client: let it land before the members go.
  settle_prefetches();
}

// ---- the step: pull (or collect a prefetch), push after backward ---------------------------------------

// The model's attachment to every step a StepRuntime runs it in.
class Ctr::PsHook final : public train::StepHook {
 public:
  explicit PsHook(Ctr& model) : model_(model) {}
  void after_backward(int64_t step) override {
    if (model_.split_)
      model_.route_gradients(step);
    else
      model_.push_gradients(step);
  }

 private:
  Ctr& model_;
};

// What a prefetch hands the step it was started for: each field's rows, as fresh as a pull made then.
struct Ctr::PrefetchedRows {
  std::vector<ps::PulledRows> fields;  // per field, as PsClient::pull returns them
  int64_t repulled = 0;                // rows pulled again because a push changed them after the pull
  double repull_ms = 0;                // time those re-pulls took (on the prefetch's thread)
};

// One batch's rows, pulled on another thread while the step before it runs. Every push made while it is
// in flight chains a re-pull of the pushed ids this batch also holds onto the same future, started
// right after that push returns: the step that collects it waits for nothing a push left stale.
struct Ctr::Prefetch {
  std::vector<at::Tensor> ids;         // per field (n_f) int64: the batch's ids
  std::future<PrefetchedRows> rows;    // the pull, then each re-pull chained after it (AfterPush)
  std::vector<absl::flat_hash_set<uint64_t>> pushed;  // OnCollect: per field, ids pushed since the pull began
};

std::vector<train::StepHook*> Ctr::step_hooks() { return {hook_.get()}; }

void Ctr::prefetch(const data::Batch& next) {
  if (!options.prefetch) return;
  RATION_CHECK(static_cast<int64_t>(next.sparse.size()) == options.num_fields, "ctr expects ", options.num_fields,
               " sparse fields (model.num_fields); the batch to prefetch has ", next.sparse.size());
  auto p = std::make_unique<Prefetch>();
  std::vector<std::string> tables;
  for (int64_t f = 0; f < options.num_fields; ++f) {
    p->ids.push_back(next.sparse[static_cast<size_t>(f)].ids.contiguous());
    tables.push_back(table_name(f));
  }
  // At most two in flight (this step's and the next one's): an older one was for a batch never trained.
  while (prefetches_.size() >= 2) {
    if (prefetches_.front()->rows.valid()) prefetches_.front()->rows.wait();
    prefetches_.pop_front();
    ++counts_.discarded;
  }
  // The thread reads only its own copies (the ids tensors are never written) and the client, whose
  // pull is safe beside pushes; rows a push of this step changes are pulled again on collection.
  p->rows = std::async(std::launch::async, [client = client_, ids = p->ids, tables] {
    PrefetchedRows out;
    for (size_t f = 0; f < ids.size(); ++f)
      out.fields.push_back(
          client->pull(tables[f], ids[f].data_ptr<int64_t>(), ids[f].numel(), ps::MissingRow::Create));
    return out;
  });
  prefetches_.push_back(std::move(p));
  ++counts_.started;
}

// The next batch the trainer took early (its tensors), and up to two prefetches in flight, each with a
// row of embedding_dim floats per id of its batch (unique ids are at most all of them).
int64_t Ctr::prefetch_bytes(const data::Batch& batch) const {
  if (!prefetches()) return 0;  // (no prefetch under a feature split either)
  int64_t batch_bytes = 0, ids = 0;
  for (const Value* v : {&batch.input, &batch.target})
    if (v->defined()) batch_bytes += static_cast<int64_t>(v->tensor().nbytes());
  for (const auto& bag : batch.sparse) {
    batch_bytes += static_cast<int64_t>(bag.ids.nbytes() + bag.offsets.nbytes());
    ids += bag.ids.numel();
  }
  return batch_bytes + 2 * ids * options.embedding_dim * static_cast<int64_t>(sizeof(float));
}

// Per distinct id a step holds its pulled row and, in backward, the row's gradient (two rows of
// embedding_dim floats) and an int64 of bookkeeping. A batch with every id distinct holds that for each of
// its ids; the profiled batch held it for its distinct ids only. (The push after backward copies the
// gradient rows once more, when the step's activations are gone.)
int64_t Ctr::batch_variation_bytes(const data::Batch& batch) const {
  const int64_t per_id = 2 * options.embedding_dim * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(int64_t));
  int64_t repeated = 0;  // ids of the batch beyond the first of each value, per field
  for (const auto& bag : batch.sparse) {
    const at::Tensor ids = bag.ids.contiguous();
    absl::flat_hash_set<int64_t> seen(static_cast<size_t>(ids.numel()));
    const int64_t* p = ids.data_ptr<int64_t>();
    for (int64_t k = 0; k < ids.numel(); ++k) seen.insert(p[k]);
    repeated += ids.numel() - static_cast<int64_t>(seen.size());
  }
  return repeated * per_id;
}

void Ctr::settle_prefetches() {
  for (auto& p : prefetches_)
    if (p->rows.valid()) p->rows.wait();
}

namespace {
bool same_ids(const at::Tensor& a, const at::Tensor& b) {
  return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl() || (a.sizes() == b.sizes() && at::equal(a, b));
}

// Pulls again the rows of `rows` whose ids are in `pushed` (a push changed them after `rows` were read)
// and writes them in place. Returns how many rows it pulled.
int64_t repull_pushed(ps::PsClient& client, const std::string& table, const absl::flat_hash_set<uint64_t>& pushed,
                      ps::PulledRows& rows) {
  std::vector<int64_t> again, where;
  for (size_t k = 0; k < rows.unique_ids.size(); ++k)
    if (pushed.contains(rows.unique_ids[k])) {
      again.push_back(static_cast<int64_t>(rows.unique_ids[k]));
      where.push_back(static_cast<int64_t>(k));
    }
  if (again.empty()) return 0;
  const ps::PulledRows fresh =
      client.pull(table, again.data(), static_cast<int64_t>(again.size()), ps::MissingRow::Create);
  rows.rows.index_copy_(0, at::tensor(where, at::kLong), fresh.rows);
  return static_cast<int64_t>(again.size());
}
}  // namespace

std::vector<ps::PulledRows> Ctr::take_prefetch(const data::Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  auto matches = [&](const Prefetch& p) {
    for (size_t f = 0; f < p.ids.size(); ++f)
      if (!same_ids(p.ids[f], batch.sparse[f].ids)) return false;
    return true;
  };
  // The first step has no prefetch of its own (the pending one is for the next batch): pull as usual.
  size_t k = 0;
  while (k < prefetches_.size() && !matches(*prefetches_[k])) ++k;
  if (k == prefetches_.size()) return {};
  // Prefetches before the match were for batches that were not trained: dropped.
  for (size_t i = 0; i < k; ++i) {
    if (prefetches_.front()->rows.valid()) prefetches_.front()->rows.wait();
    prefetches_.pop_front();
    ++counts_.discarded;
  }
  std::unique_ptr<Prefetch> p = std::move(prefetches_.front());
  prefetches_.pop_front();
  // Rethrows a failed pull or re-pull (naming the endpoint). AfterPush: the re-pulls of rows the
  // previous step pushed were chained on by push_gradients() and ran while the dense optimiser stepped.
  PrefetchedRows got = p->rows.get();
  if (options.repull == RepullTiming::OnCollect) {  // every push before this step has returned
    const auto r0 = std::chrono::steady_clock::now();
    for (size_t f = 0; f < p->pushed.size() && f < got.fields.size(); ++f)
      if (!p->pushed[f].empty())
        got.repulled += repull_pushed(*client_, table_name(static_cast<int64_t>(f)), p->pushed[f], got.fields[f]);
    got.repull_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count();
  }
  ++counts_.used;
  counts_.rows_repulled += got.repulled;
  counts_.repull_ms += got.repull_ms;
  counts_.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return std::move(got.fields);
}

void Ctr::chain_repulls(std::vector<absl::flat_hash_set<uint64_t>> pushed) {
  bool any = false;
  for (const auto& ids : pushed) any = any || !ids.empty();
  if (!any) return;
  std::vector<std::string> tables;
  for (int64_t f = 0; f < options.num_fields; ++f) tables.push_back(table_name(f));
  auto shared = std::make_shared<const std::vector<absl::flat_hash_set<uint64_t>>>(std::move(pushed));
  for (auto& p : prefetches_) {
    // Runs after the pull (or the re-pull chained before it) and after this step's pushes returned.
    p->rows = std::async(std::launch::async, [client = client_, before = std::move(p->rows), shared, tables]() mutable {
      PrefetchedRows out = before.get();
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t f = 0; f < out.fields.size() && f < shared->size(); ++f)
        if (!(*shared)[f].empty()) out.repulled += repull_pushed(*client, tables[f], (*shared)[f], out.fields[f]);
      out.repull_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return out;
    });
  }
}

void Ctr::push_gradients(int64_t step) {
  std::vector<FieldRows> fields = std::move(step_fields_);
  step_fields_.clear();
  std::vector<absl::flat_hash_set<uint64_t>> pushed(fields.size());  // per field: the ids pushed
  for (size_t field = 0; field < fields.size(); ++field) {  // lookup() made them in field order
    FieldRows& f = fields[field];
    if (!f.rows.requires_grad() || !f.rows.grad().defined()) continue;
    const ops::SparseRows sr = ops::sparse_rows(f.rows.grad());
    const at::Tensor rows = sr.rows.to(at::kFloat).contiguous();
    const at::Tensor local = sr.ids.contiguous();
    const int64_t* li = local.data_ptr<int64_t>();
    std::vector<uint64_t> global(static_cast<size_t>(local.numel()));
    for (int64_t k = 0; k < local.numel(); ++k) global[static_cast<size_t>(k)] = f.unique_ids[static_cast<size_t>(li[k])];
    client_->push(f.table, global.data(), local.numel(), rows.data_ptr<float>(), rows.size(1), step);
    f.rows.grad() = at::Tensor();
    pushed[field].insert(global.begin(), global.end());
  }
  // Prefetches in flight may have read these rows before the pushes changed them: re-pull them now, on
  // the prefetch's thread, while the step goes on to the dense optimiser (or, OnCollect, when collected).
  if (prefetches_.empty()) return;
  if (options.repull == RepullTiming::AfterPush) {
    chain_repulls(std::move(pushed));
    return;
  }
  for (auto& p : prefetches_) {
    p->pushed.resize(pushed.size());
    for (size_t f = 0; f < pushed.size(); ++f) p->pushed[f].insert(pushed[f].begin(), pushed[f].end());
  }
}

std::vector<FieldRows> Ctr::lookup(const data::Batch& batch, ps::MissingRow missing) {
  RATION_CHECK(static_cast<int64_t>(batch.sparse.size()) == options.num_fields, "ctr expects ", options.num_fields,
               " sparse fields (model.num_fields); the batch has ", batch.sparse.size(),
               " (is data.kind a click-through source: synthetic_ctr or movielens?)");
  std::vector<FieldRows> out;
  const bool trainable = missing == ps::MissingRow::Create && grad_enabled();
  for (const data::SparseBag& bag : batch.sparse)
    RATION_CHECK(bag.ids.dtype() == at::kLong && bag.offsets.dtype() == at::kLong,
                 "ctr fields' ids and offsets must be int64; got ", bag.ids.dtype(), " and ", bag.offsets.dtype());
  std::vector<ps::PulledRows> prefetched;
  if (missing == ps::MissingRow::Create && !prefetches_.empty()) prefetched = take_prefetch(batch);
  for (int64_t f = 0; f < options.num_fields; ++f) {
    const data::SparseBag& bag = batch.sparse[static_cast<size_t>(f)];
    FieldRows fr;
    fr.table = table_name(f);
    ps::PulledRows pulled;
    if (!prefetched.empty()) {
      pulled = std::move(prefetched[static_cast<size_t>(f)]);
    } else {
      const at::Tensor ids = bag.ids.contiguous();
      pulled = client_->pull(fr.table, ids.data_ptr<int64_t>(), ids.numel(), missing);
    }
    fr.unique_ids = std::move(pulled.unique_ids);
    at::Tensor rows = pulled.rows;
    const at::TensorOptions p = parameter_options();
    if (rows.scalar_type() != p.dtype().toScalarType()) rows = rows.to(p.dtype().toScalarType());
    fr.rows = Value(rows, trainable);
    fr.local_index = Value(pulled.local_index);
    fr.offsets = Value(bag.offsets);
    out.push_back(std::move(fr));
  }
  return out;
}

Value Ctr::logits(const Value& dense, const std::vector<FieldRows>& fields) {
  Values bags;
  {
    ScopeGuard scope(name());
    for (const FieldRows& f : fields)
      bags.push_back(ops::embedding_bag(f.rows, f.local_index, f.offsets, options.bag_mode));  // (B, D)
  }
  return logits_from_bags(dense, bags);
}

Value Ctr::logits_from_bags(const Value& dense, const Values& bags) {
  ScopeGuard scope(name());
  RATION_CHECK(dense.dim() == 2 && dense.size(1) == options.num_dense, "ctr expects dense features (B, ",
               options.num_dense, ") (model.num_dense); got ", dense.sizes());
  Value x = dense;
  for (size_t i = 0; i < bottom.size(); ++i) x = ops::relu(bottom[i]->forward(x));  // (B, D) at the end
  const int64_t b = dense.size(0), d = options.embedding_dim;
  Values vecs = {ops::reshape(x, {b, 1, d})};
  for (const Value& e : bags) vecs.push_back(ops::reshape(e, {b, 1, d}));  // (B, 1, D) each
  const int64_t v = static_cast<int64_t>(vecs.size());
  Value t = ops::cat(vecs, 1);                              // (B, F+1, D)
  Value z = ops::bmm(t, ops::transpose(t, 1, 2));          // (B, F+1, F+1)
  Values parts = {x};                                       // (B, D)
  for (int64_t i = 0; i + 1 < v; ++i) {
    Value row = ops::slice(ops::slice(z, 1, i, i + 1), 2, i + 1, v);  // (B, 1, F-i): pairs (i, j > i)
    parts.push_back(ops::reshape(row, {b, v - 1 - i}));
  }
  Value h = ops::cat(parts, 1);  // (B, D + (F+1)F/2)
  for (size_t i = 0; i < top.size(); ++i) {
    h = top[i]->forward(h);
    if (i + 1 < top.size()) h = ops::relu(h);
  }
  return h;  // (B, 1)
}

Value binary_cross_entropy_with_logits(const Value& logits, const Value& labels) {
  // softmax([0, z])[1] = sigmoid(z): the 2-class cross entropy is exactly BCE with logits.
  Value zeros(at::zeros_like(logits.tensor()));
  return ops::cross_entropy(ops::cat({zeros, logits}, 1), labels);
}

namespace {
Value dense_of(const data::Batch& batch, const nn::Module& model) {
  RATION_CHECK(batch.input.defined() && batch.target.defined() && at::isFloatingType(batch.input.dtype()),
               "ctr batch needs dense features (B, F) float and labels (B) int64");
  RATION_CHECK(batch.target.dtype() == at::kLong && batch.target.dim() == 1 &&
                   batch.target.size(0) == batch.input.size(0),
               "ctr labels must be int64 (B) in {0, 1}; got ", batch.target.dtype(), " ", batch.target.sizes());
  return to_model(batch.input, model);
}
}  // namespace

Value Ctr::loss(const data::Batch& batch) {
  const Value dense = dense_of(batch, *this);
  if (split_) {
    RATION_CHECK(!oracle_mode(), "ctr with a feature split (parallel.features = \"table\") has no oracle mode");
    const Values bags = routed_lookup(batch.sparse, dense.size(0), ps::MissingRow::Create, grad_enabled());
    return binary_cross_entropy_with_logits(logits_from_bags(dense, bags), to_model(batch.target, *this));
  }
  if (oracle_mode()) {
    // The oracle differentiates the step the engine just took: the rows as they were pulled for this
    // batch, before that step's push changed them (ration gradcheck runs engine, then oracle).
    RATION_CHECK(!batch.sparse.empty() && last_batch_ids_ == batch.sparse.front().ids.unsafeGetTensorImpl(),
                 "ctr in oracle mode re-evaluates ",
                 "the last training batch only (run loss() on the same batch without the oracle first)");
    return binary_cross_entropy_with_logits(logits(dense, last_fields_), to_model(batch.target, *this));
  }
  std::vector<FieldRows> fields = lookup(batch, ps::MissingRow::Create);
  last_fields_.clear();
  for (const FieldRows& f : fields) {
    FieldRows copy = f;
    copy.rows = Value(f.rows.tensor().clone());
    last_fields_.push_back(std::move(copy));
  }
  last_batch_ids_ = batch.sparse.empty() ? nullptr : batch.sparse.front().ids.unsafeGetTensorImpl();
  const Value l = binary_cross_entropy_with_logits(logits(dense, fields), to_model(batch.target, *this));
  step_fields_ = std::move(fields);
  return l;
}

EvalStats Ctr::evaluate(const data::Batch& batch) {
  NoGradGuard no_grad;
  const Value dense = dense_of(batch, *this);
  const Value z = split_ ? logits_from_bags(dense, routed_lookup(batch.sparse, dense.size(0), ps::MissingRow::ReadDefault, false))
                         : logits(dense, lookup(batch, ps::MissingRow::ReadDefault));
  const Value labels = to_model(batch.target, *this);
  EvalStats s;
  s.count = labels.numel();
  s.loss_sum = binary_cross_entropy_with_logits(z, labels).item() * static_cast<double>(s.count);
  const at::Tensor p = at::sigmoid(z.tensor().view({-1})).to(at::kFloat).contiguous();
  const at::Tensor y = labels.tensor().to(at::kFloat).contiguous();
  s.correct = (p.gt(0.5).to(at::kFloat) == y).sum().item<int64_t>();
  s.scores.assign(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  s.labels.assign(y.data_ptr<float>(), y.data_ptr<float>() + y.numel());
  return s;
}

void Ctr::save_external_state(const std::string& run_dir, int64_t step) {
  settle_prefetches();  // the snapshot then holds whatever the pulls in flight created, deterministically
  if (client_->embedded() && client_->options().snapshot_dir.empty()) return;
  client_->snapshot(step);
  if (split_) save_placement();
}

void Ctr::restore_external_state(const std::string& run_dir, int64_t step) {
  // An embedded run without ps.snapshot_dir of its own reads the snapshot beside the checkpoint (with a
  // feature split, this rank's tables: ps/rank<r>).
  const bool beside = client_->embedded() && !explicit_snapshot_dir_;
  settle_prefetches();
  prefetches_.clear();  // pulled before the restore: stale
  const std::string dir = run_dir + "/ps" + (split_ ? "/rank" + std::to_string(split_->group.rank()) : "");
  // A feature split's snapshots are per rank: resuming across that boundary would find no tables.
  const bool saved_split = std::filesystem::exists(run_dir + "/ps/rank0");
  RATION_CHECK(!beside || saved_split == (split_ != nullptr) || !std::filesystem::exists(run_dir + "/ps"),
               "ctr: the checkpoint in ", run_dir, saved_split ? " holds tables split over ranks (ps/rank<r>: written with "
               "parallel.features = \"table\")" : " holds every table in one process's shards (ps/)",
               "; resume it with the layout it was saved with (", saved_split ? "parallel.features = \"table\" and the same "
               "number of ranks" : "without parallel.features = \"table\"", ")");
  RATION_CHECK(!beside || !split_ || std::filesystem::exists(dir), "ctr: the checkpoint in ", run_dir, " holds no tables of rank ",
               split_ ? split_->group.rank() : 0, " (", dir, "): it was saved by fewer ranks; resume with parallel.features = "
               "\"table\" and the number of ranks it was saved with");
  if (split_) check_placement(beside ? dir : client_->options().snapshot_dir);
  client_->restore(step, beside ? dir : std::string());
}

std::vector<std::pair<std::string, double>> Ctr::report_metrics() {
  int64_t rows = 0, bytes = 0;
  for (const auto& s : client_->stats()) {
    rows += s.stats.rows();
    bytes += s.stats.bytes();
  }
  const ps::ClientTimes t = client_->times();
  std::vector<std::pair<std::string, double>> metrics = {{"rows", static_cast<double>(rows)},
          {"bytes", static_cast<double>(bytes)},
          {"shards", static_cast<double>(client_->num_shards())},
          {"embedded", client_->embedded() ? 1.0 : 0.0},
          {"pull_ms", t.pulls > 0 ? t.pull_ms / static_cast<double>(t.pulls) : 0.0},
          {"push_ms", t.pushes > 0 ? t.push_ms / static_cast<double>(t.pushes) : 0.0},
          {"pull_ms_total", t.pull_ms},
          {"push_ms_total", t.push_ms},
          {"rows_pulled", static_cast<double>(t.rows_pulled)},
          {"rows_pushed", static_cast<double>(t.rows_pushed)},
          {"prefetch", options.prefetch ? 1.0 : 0.0},
          {"repull_after_push", options.repull == RepullTiming::AfterPush ? 1.0 : 0.0},
          {"prefetch_used", static_cast<double>(counts_.used)},
          {"prefetch_discarded", static_cast<double>(counts_.discarded)},
          {"rows_repulled", static_cast<double>(counts_.rows_repulled)},
          {"pull_wait_ms", counts_.used > 0 ? counts_.wait_ms / static_cast<double>(counts_.used) : 0.0},
          {"repull_ms", counts_.used > 0 ? counts_.repull_ms / static_cast<double>(counts_.used) : 0.0}};
  if (options.evict.active()) append_eviction_metrics(metrics);
  if (split_) append_split_metrics(metrics);
  return metrics;
}

void Ctr::append_eviction_metrics(std::vector<std::pair<std::string, double>>& metrics) {
  ps::EvictTotals sum;
  int64_t bytes_after_round = 0;  // the shards' accounted bytes right after their last round
  int64_t peak = 0, refused = 0;  // the most bytes each shard ever held (summed), rows refused admission
  for (int i = 0; i < client_->num_shards(); ++i) {
    const ps::ShardCore& core = client_->embedded_shard(i);
    peak += core.peak_bytes();
    refused += core.refused_rows();
    const ps::Evictor* e = client_->embedded_shard(i).evictor();
    if (e == nullptr) continue;
    const ps::EvictTotals t = e->totals();
    bytes_after_round += e->last_round().bytes_after;
    sum.rounds = std::max(sum.rounds, t.rounds);  // every shard runs the same rounds (one per evict_every)
    sum.admission_rounds += t.admission_rounds;
    sum.disabled += t.disabled;
    sum.readmitted += t.readmitted;
    sum.bytes_freed += t.bytes_freed;
    sum.disabled_now += t.disabled_now;
  }
  metrics.insert(metrics.end(), {{"max_bytes", static_cast<double>(options.evict.max_bytes)},
                                 {"evict_rounds", static_cast<double>(sum.rounds)},
                                 {"rows_disabled", static_cast<double>(sum.disabled)},
                                 {"rows_readmitted", static_cast<double>(sum.readmitted)},
                                 {"bytes_freed", static_cast<double>(sum.bytes_freed)},
                                 {"disabled_ids", static_cast<double>(sum.disabled_now)},
                                 {"bytes_after_round", static_cast<double>(bytes_after_round)}});
  // Under a byte cap, the most the shards ever held (each shard's maximum, summed: never below the
  // total at any moment) and the new rows refused because a shard was full.
  if (options.evict.max_bytes > 0)
    metrics.insert(metrics.end(), {{"peak_bytes", static_cast<double>(peak)}, {"rows_refused", static_cast<double>(refused)},
                                   {"admission_rounds", static_cast<double>(sum.admission_rounds)}});
}

}  // namespace ration::models
