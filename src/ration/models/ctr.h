// ctr.h — "ctr": a DLRM-style click-through model whose embedding tables live on parameter servers.
// Owns: the architecture — bottom MLP over the dense features (B, num_dense) -> (B, D); one embedding bag
//       per sparse field over rows pulled from the parameter servers (ops::embedding_bag, sum or mean);
//       pairwise dot products of the F + 1 vectors (bottom output and the F bags), upper triangle;
//       top MLP over [bottom output, dots] -> one logit; binary cross-entropy (written as 2-class
//       cross-entropy of [0, logit], which equals BCE-with-logits) — and the model's use of its PsClient
//       in a training step (docs/METHODS.md, "Parameter servers for sparse embeddings"): the rows are
//       pulled by the forward (or, prefetched, while the previous step ran), and the model's StepHook
//       pushes their sparse gradients after backward (the optimiser runs on the store); snapshot/restore
//       with checkpoints; the feature split (parallel.features = "table", ctr_split.cpp: each rank holds
//       whole tables, lookups and their gradients routed to the tables' owners by all-to-all).
// Does not own: the store or the servers (ps/), the data (data/ctr_*.h), the dense optimiser (trainer),
//       the step (runtime/step_runtime.h: it calls step_hooks()).
// Config: model.embedding_dim (16), model.bottom ([64]) — a last layer of width D is appended —,
//   model.top ([64, 32]), model.bag_mode ("sum"|"mean"), model.num_fields / model.num_dense and each
//   table's rows data.field<F>_rows (published by the data side; the feature split's placement); [ps]: endpoints ("" = embedded), shards (1), optimizer ("adagrad"), lr (0.05),
//   initial_accumulator, init_scale (0.01), seed (train.seed), prefetch (true: pull the next batch's
//   rows during the current step), repull ("auto" | "after_push" | "on_collect": when rows the step
//   pushed are pulled again for the prefetched batch; auto: after_push with remote shards), snapshot_dir (train.checkpoint_dir + "/ps" when embedded),
//   auth_token_file, tls_ca, tls_cert, tls_key, tls_target_name, retries (3), timeout_ms (30000);
//   eviction of embedded shards (ps/evict.h; remote shards take the same settings as `ration ps serve`
//   flags): evict ("none"|"importance"|"frequency"|"lru"|"l2"), evict_scope ("slot": lowest rows chosen per
//   table, default; "shard": pooled over the shard's tables), max_bytes (0: no cap; 123 or "4MiB";
//   the total over the embedded shards, split evenly), evict_every (100), keep_fraction (1), evict_threshold (0),
//   readmit_after (2), importance_decay (0.99), evict_headroom (0.9: a capped round cuts to this
//   fraction of the cap).
// Parameter names: bottom.0.weight, ..., top.N.weight, top.N.bias.
#pragma once
#include <absl/container/flat_hash_set.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ration/models/model.h"
#include "ration/nn/layers.h"
#include "ration/ops/ops.h"
#include "ration/ps/client.h"
#include "ration/ps/evict.h"

namespace ration::models {

// When a prefetch's rows that a push changed after its pull began are pulled again (ps.repull):
// AfterPush — on the prefetch's thread right after the push returns, overlapping the dense update (a
// network round trip off the step's critical path); OnCollect — by the step that collects the prefetch;
// Auto (the default) — AfterPush, embedded or remote (the faster of the two in both cases on an idle
// machine). All give bitwise the rows of a synchronous pull (bench_ps_grpc measures the two).
enum class RepullTiming { Auto, AfterPush, OnCollect };

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
  bool prefetch = true;  // ps.prefetch
  RepullTiming repull = RepullTiming::Auto;  // ps.repull ("auto" | "after_push" | "on_collect"); resolved by Ctr
  ps::EvictOptions evict;  // ps.evict, ps.max_bytes, ...: applied to every embedded shard
  std::vector<int64_t> table_rows;  // per field: the rows its table may hold (data.field<F>_rows; 0: not declared)
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

// How the step's pulls went (reported as ps.prefetch_*).
struct PrefetchCounts {
  int64_t started = 0;       // prefetch() calls that started a pull
  int64_t used = 0;          // training lookups served by a prefetch
  int64_t discarded = 0;     // prefetches whose batch never came (another batch was trained)
  int64_t rows_repulled = 0; // prefetched rows pulled again because the step before pushed them
  double wait_ms = 0;        // time training lookups spent waiting for prefetches (and re-pulls not yet done)
  double repull_ms = 0;      // time the re-pulls took on the prefetch threads (off the step's path)
};

class Ctr : public Model {
 public:
  explicit Ctr(const CtrOptions& options);
  ~Ctr() override;
  // Pulls each field's rows (created on first touch when training, read-only otherwise). A training
  // lookup of the batch the oldest pending prefetch was started for takes its rows instead, pulling
  // again those that a push changed after the prefetch began.
  std::vector<FieldRows> lookup(const data::Batch& batch, ps::MissingRow missing);
  // dense (B, num_dense), one FieldRows per field -> logits (B, 1).
  Value logits(const Value& dense, const std::vector<FieldRows>& fields);
  // Mean BCE. The step's rows are kept for push_gradients (the step hook calls it after backward).
  Value loss(const data::Batch& batch) override;
  EvalStats evaluate(const data::Batch& batch) override;
  std::string family() const override { return "ctr"; }
  std::string data_parallel_refusal() const override;
  // Embedded shards snapshot under ps.snapshot_dir (default RUN_DIR/ps); remote shards under their own
  // --snapshot-dir. Version = step.
  void save_external_state(const std::string& run_dir, int64_t step) override;
  void restore_external_state(const std::string& run_dir, int64_t step) override;
  std::vector<std::pair<std::string, double>> report_metrics() override;

  // ---- the training step (see the header): the hook pushes after backward.
  std::vector<train::StepHook*> step_hooks() override;
  // ---- the feature split (ctr_split.cpp; docs/DISTRIBUTED.md, "Feature split"): this rank keeps the tables
  // place_tables() gives it (its embedded shards snapshot under <snapshot dir>/rank<r>) and serves every
  // rank's lookups of them; a training lookup's pooled rows are leaves whose gradients the step hook sends
  // back to the owners, which push them. Refused ("" when done): remote shards, fewer tables than ranks.
  std::string split_features(const dist::World& group) override;
  void evaluate_nothing() override;
  void discard_step() override { step_fields_.clear(); }  // a profiled step's rows are never pushed
  // Pushes the sparse row gradients of the last training loss() to the servers (step `step` is recorded
  // with the rows), then clears them. Nothing to push (no gradient): nothing happens.
  void push_gradients(int64_t step);
  bool prefetches() const override { return options.prefetch && split_ == nullptr; }
  // Starts pulling `next`'s rows on another thread (when ps.prefetch is on); a later training lookup of
  // the same ids collects them.
  void prefetch(const data::Batch& next) override;
  int64_t prefetch_bytes(const data::Batch& batch) const override;
  int64_t batch_variation_bytes(const data::Batch& batch) const override;
  // Waits until every prefetch in flight has landed (before a snapshot: the shards are then quiet).
  void settle_prefetches();
  const PrefetchCounts& prefetch_counts() const { return counts_; }

  ps::PsClient& client() { return *client_; }
  std::string table_name(int64_t field) const { return "field" + std::to_string(field); }

  CtrOptions options;
  std::vector<std::shared_ptr<nn::Linear>> bottom;
  std::vector<std::shared_ptr<nn::Linear>> top;

 private:
  class PsHook;
  struct Split;
  // Builds the client over the embedded shards (or connects to ps.endpoints) and declares `fields`' tables.
  void open_tables(const std::vector<int64_t>& fields);
  // The feature split's lookup of this rank's bags (B samples; 0: none) and of every rank's bags of the
  // tables held here (rows missing from them: `missing`): every field's pooled rows (B, D), leaves that
  // require grad when `trainable` (their gradients then go back to the owners after backward).
  std::vector<Value> routed_lookup(const std::vector<data::SparseBag>& bags, int64_t batch, ps::MissingRow missing,
                                   bool trainable);
  // After backward: the pooled rows' gradients to their owners, who push the rows' gradients.
  void route_gradients(int64_t step);
  // The placement beside this rank's snapshot (<snapshot dir>/placement: every field's owner), and the check
  // on resuming that the snapshot in `dir` was placed as this run places the tables.
  void save_placement() const;
  void check_placement(const std::string& dir) const;
  // dense (B, num_dense) and every field's pooled rows (B, D) -> logits (B, 1).
  Value logits_from_bags(const Value& dense, const Values& bags);
  struct Prefetch;
  struct PrefetchedRows;
  std::vector<ps::PulledRows> take_prefetch(const data::Batch& batch);
  // Chains onto every prefetch in flight a re-pull of the ids in `pushed` (per field) that its batch holds.
  void chain_repulls(std::vector<absl::flat_hash_set<uint64_t>> pushed);
  // ps.evict_rounds, rows_disabled, rows_readmitted, bytes_freed, disabled_ids and bytes_after_round
  // (accounted bytes right after the last round) summed over the shards.
  void append_eviction_metrics(std::vector<std::pair<std::string, double>>& metrics);
  // feature_split 1, tables_here, split_bytes_sent_per_step, and per field owner.field<F> (its rank) and
  // rows_x_dim.field<F>.
  void append_split_metrics(std::vector<std::pair<std::string, double>>& metrics) const;

  std::shared_ptr<ps::PsClient> client_;
  std::unique_ptr<PsHook> hook_;
  std::unique_ptr<Split> split_;  // parallel.features = "table"
  std::deque<std::unique_ptr<Prefetch>> prefetches_;  // oldest first
  PrefetchCounts counts_;
  std::vector<FieldRows> step_fields_;  // the last training loss()'s rows (leaves), until pushed
  bool explicit_snapshot_dir_ = false;  // ps.snapshot_dir set by the user (else RUN_DIR/ps)
  // The last training batch's rows as pulled (before its push), for an oracle re-evaluation.
  std::vector<FieldRows> last_fields_;
  const void* last_batch_ids_ = nullptr;  // the batch last_fields_ were pulled for (its first ids tensor)
};

// 2-class cross entropy of [0, logit] against labels (B) int64 in {0, 1}: mean binary cross-entropy.
Value binary_cross_entropy_with_logits(const Value& logits, const Value& labels);

}  // namespace ration::models
