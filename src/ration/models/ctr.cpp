// ctr.cpp — the "ctr" family (see ctr.h): config, layers, PS lookups, forward, loss, evaluation.
#include "ration/models/ctr.h"

#include <cmath>
#include <filesystem>

#include "ration/core/check.h"
#include "ration/models/families.h"
#include "ration/ps/server.h"

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

  // [ps]
  o.client.endpoints = ps::split_endpoints(cfg.get_string("ps.endpoints", ""));
  o.client.embedded_shards = cfg.get_int("ps.shards", 1);
  o.client.retries = static_cast<int>(cfg.get_int("ps.retries", o.client.retries));
  o.client.timeout_ms = cfg.get_int("ps.timeout_ms", o.client.timeout_ms);
  RATION_CHECK(o.client.timeout_ms >= 1, cfg.origin(), ": ps.timeout_ms must be >= 1");
  const std::string token_file = cfg.get_string("ps.auth_token_file", "");
  if (!token_file.empty()) o.client.auth_token = ps::read_token_file(token_file);
  o.client.tls_ca = cfg.get_string("ps.tls_ca", "");
  o.client.tls_cert = cfg.get_string("ps.tls_cert", "");
  o.client.tls_key = cfg.get_string("ps.tls_key", "");
  o.client.tls_target_name = cfg.get_string("ps.tls_target_name", "");
  RATION_CHECK(o.client.tls_cert.empty() == o.client.tls_key.empty(), cfg.origin(),
               ": ps.tls_cert and ps.tls_key must be given together");
  const std::string ckpt = cfg.has("train.checkpoint_dir") ? cfg.get_string("train.checkpoint_dir", "") : "";
  o.explicit_snapshot_dir = cfg.has("ps.snapshot_dir");
  o.client.snapshot_dir = cfg.get_string("ps.snapshot_dir", ckpt.empty() ? "" : ckpt + "/ps");
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
  client_ = std::make_shared<ps::PsClient>(o.client);
  if (!client_->embedded()) client_->check_health();
  std::vector<ps::TableOptions> tables;
  for (int64_t f = 0; f < o.num_fields; ++f) {
    ps::TableOptions t = o.table;
    t.name = table_name(f);
    t.dim = o.embedding_dim;
    t.seed = ps::mix64(o.table.seed * 1000003ULL + static_cast<uint64_t>(f));
    tables.push_back(t);
  }
  client_->declare_tables(tables);
}

std::vector<FieldRows> Ctr::lookup(const data::Batch& batch, ps::MissingRow missing) {
  RATION_CHECK(static_cast<int64_t>(batch.sparse.size()) == options.num_fields, "ctr expects ", options.num_fields,
               " sparse fields (model.num_fields); the batch has ", batch.sparse.size(),
               " (is data.kind a click-through source: synthetic_ctr or movielens?)");
  std::vector<FieldRows> out;
  const bool trainable = missing == ps::MissingRow::Create && grad_enabled();
  for (int64_t f = 0; f < options.num_fields; ++f) {
    const data::SparseBag& bag = batch.sparse[static_cast<size_t>(f)];
    RATION_CHECK(bag.ids.dtype() == at::kLong && bag.offsets.dtype() == at::kLong, "ctr field ", f,
                 ": ids and offsets must be int64");
    at::Tensor ids = bag.ids.contiguous();
    FieldRows fr;
    fr.table = table_name(f);
    ps::PulledRows pulled = client_->pull(fr.table, ids.data_ptr<int64_t>(), ids.numel(), missing);
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
  ScopeGuard scope(name());
  RATION_CHECK(dense.dim() == 2 && dense.size(1) == options.num_dense, "ctr expects dense features (B, ",
               options.num_dense, ") (model.num_dense); got ", dense.sizes());
  Value x = dense;
  for (size_t i = 0; i < bottom.size(); ++i) x = ops::relu(bottom[i]->forward(x));  // (B, D) at the end
  const int64_t b = dense.size(0), d = options.embedding_dim;
  Values vecs = {ops::reshape(x, {b, 1, d})};
  for (const FieldRows& f : fields) {
    Value e = ops::embedding_bag(f.rows, f.local_index, f.offsets, options.bag_mode);  // (B, D)
    vecs.push_back(ops::reshape(e, {b, 1, d}));
  }
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
  const int64_t step = step_++;
  for (FieldRows& f : fields) {
    if (!f.rows.requires_grad()) continue;
    // The gradient of a field's rows is complete: push it to the servers, which update the rows.
    f.rows.on_grad_ready([client = client_, table = f.table, ids = f.unique_ids, step](ValueImpl& leaf) {
      if (!leaf.grad.defined()) return;
      const ops::SparseRows sr = ops::sparse_rows(leaf.grad);
      const at::Tensor rows = sr.rows.to(at::kFloat).contiguous();
      const at::Tensor local = sr.ids.contiguous();
      std::vector<uint64_t> global(static_cast<size_t>(local.numel()));
      for (int64_t k = 0; k < local.numel(); ++k)
        global[static_cast<size_t>(k)] = ids[static_cast<size_t>(local.data_ptr<int64_t>()[k])];
      client->push(table, global.data(), local.numel(), rows.data_ptr<float>(), rows.size(1), step);
      leaf.grad = at::Tensor();
    });
  }
  return binary_cross_entropy_with_logits(logits(dense, fields), to_model(batch.target, *this));
}

EvalStats Ctr::evaluate(const data::Batch& batch) {
  NoGradGuard no_grad;
  const Value dense = dense_of(batch, *this);
  const std::vector<FieldRows> fields = lookup(batch, ps::MissingRow::ReadDefault);
  const Value z = logits(dense, fields);
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
  if (client_->embedded() && client_->options().snapshot_dir.empty()) return;
  client_->snapshot(step);
}

void Ctr::restore_external_state(const std::string& run_dir, int64_t step) {
  // An embedded run without ps.snapshot_dir of its own reads the snapshot beside the checkpoint.
  const bool beside = client_->embedded() && !explicit_snapshot_dir_;
  client_->restore(step, beside ? run_dir + "/ps" : std::string());
  step_ = step;
}

std::vector<std::pair<std::string, double>> Ctr::report_metrics() {
  int64_t rows = 0, bytes = 0;
  for (const auto& s : client_->stats()) {
    rows += s.stats.rows();
    bytes += s.stats.bytes();
  }
  const ps::ClientTimes& t = client_->times();
  return {{"rows", static_cast<double>(rows)},
          {"bytes", static_cast<double>(bytes)},
          {"shards", static_cast<double>(client_->num_shards())},
          {"embedded", client_->embedded() ? 1.0 : 0.0},
          {"pull_ms", t.pulls > 0 ? t.pull_ms / static_cast<double>(t.pulls) : 0.0},
          {"push_ms", t.pushes > 0 ? t.push_ms / static_cast<double>(t.pushes) : 0.0},
          {"pull_ms_total", t.pull_ms},
          {"push_ms_total", t.push_ms},
          {"rows_pulled", static_cast<double>(t.rows_pulled)},
          {"rows_pushed", static_cast<double>(t.rows_pushed)}};
}

}  // namespace ration::models
