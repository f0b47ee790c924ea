// ctr.h — "ctr": a DLRM-style click-through model whose embedding tables live on parameter servers.
// Owns: the architecture — bottom MLP over the dense features (B, num_dense) -> (B, D); one embedding bag
//       per sparse field over rows pulled from the parameter servers (ops::embedding_bag, sum or mean);
//       pairwise dot products of the F + 1 vectors (bottom output and the F bags), upper triangle;
//       top MLP over [bottom output, dots] -> one logit; binary cross-entropy (written as 2-class
//       cross-entropy of [0, logit], which equals BCE-with-logits) — and the model's PsClient: pull before
//       the forward, push the sparse row gradients from the rows' gradient-ready hook (the optimiser runs
//       on the store), snapshot/restore with checkpoints.
// Does not own: the store or the servers (ps/), the data (data/ctr_*.h), the dense optimiser (trainer).
// Config: model.embedding_dim (16), model.bottom ([64]) — a last layer of width D is appended —,
//   model.top ([64, 32]), model.bag_mode ("sum"|"mean"), model.num_fields / model.num_dense (published
//   by the data side); [ps]: endpoints ("" = embedded), shards (1), optimizer ("adagrad"), lr (0.05),
//   init_scale (0.01), seed (train.seed), snapshot_dir (train.checkpoint_dir + "/ps" when embedded),
//   auth_token_file, tls_ca, tls_cert, tls_key, tls_target_name, retries (3), timeout_ms (30000).
// Parameter names: bottom.0.weight, ..., top.N.weight, top.N.bias.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "ration/models/model.h"
#include "ration/nn/layers.h"
#include "ration/ops/ops.h"
#include "ration/ps/client.h"

namespace ration::models {

struct CtrOptions {
  int64_t num_dense = 4;
  int64_t num_fields = 4;
  int64_t embedding_dim = 16;
  std::vector<int64_t> bottom = {64};
  std::vector<int64_t> top = {64, 32};
  ops::EmbeddingBagMode bag_mode = ops::EmbeddingBagMode::Sum;
  ps::ClientOptions client;
  ps::TableOptions table;  // name/seed filled per field
  bool explicit_snapshot_dir = false;
  static CtrOptions from_config(Config& cfg);
};

// Rows pulled for one field of a batch: the leaf the bag reads and where each id maps in it.
struct FieldRows {
  std::string table;
  std::vector<uint64_t> unique_ids;
  Value rows;         // (U, D) leaf; requires grad when training
  Value local_index;  // (n) int64 into rows
  Value offsets;      // (B) int64
};

class Ctr : public Model {
 public:
  explicit Ctr(const CtrOptions& options);
  // Pulls each field's rows (created on first touch when training, read-only otherwise).
  std::vector<FieldRows> lookup(const data::Batch& batch, ps::MissingRow missing);
  // dense (B, num_dense), one FieldRows per field -> logits (B, 1).
  Value logits(const Value& dense, const std::vector<FieldRows>& fields);
  // Mean BCE. When training with grad, each field's rows push their gradient when it is ready.
  Value loss(const data::Batch& batch) override;
  EvalStats evaluate(const data::Batch& batch) override;
  std::string family() const override { return "ctr"; }
  // Embedded shards snapshot under ps.snapshot_dir (default RUN_DIR/ps); remote shards under their own
  // --snapshot-dir. Version = step.
  void save_external_state(const std::string& run_dir, int64_t step) override;
  void restore_external_state(const std::string& run_dir, int64_t step) override;
  std::vector<std::pair<std::string, double>> report_metrics() override;

  ps::PsClient& client() { return *client_; }
  std::string table_name(int64_t field) const { return "field" + std::to_string(field); }

  CtrOptions options;
  std::vector<std::shared_ptr<nn::Linear>> bottom;
  std::vector<std::shared_ptr<nn::Linear>> top;

 private:
  std::shared_ptr<ps::PsClient> client_;
  int64_t step_ = 0;
  bool explicit_snapshot_dir_ = false;  // ps.snapshot_dir set by the user (else RUN_DIR/ps)
  // The last training batch's rows as pulled (before its push), for an oracle re-evaluation.
  std::vector<FieldRows> last_fields_;
  const void* last_batch_ids_ = nullptr;  // pushes carry it (the store records each row's last step)
};

// 2-class cross entropy of [0, logit] against labels (B) int64 in {0, 1}: mean binary cross-entropy.
Value binary_cross_entropy_with_logits(const Value& logits, const Value& labels);

}  // namespace ration::models
