// data_parallel.cpp — [dist] settings, joining the world, config agreement, broadcast, global sums.
#include "ration/distributed/data_parallel.h"

#include <ATen/core/grad_mode.h>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ration/base/check.h"
#include "ration/distributed/aggregator_factory.h"

namespace ration::dist {

namespace {

// ---- partial and asynchronous aggregation (distributed/ps_aggregation.h) and the slow-rank test aid ----------
void read_partial_aggregation(Config& cfg, DataParallelSettings& s) {
  s.ps.backup_workers = cfg.get_int("dist.backup_workers", 0);
  RATION_CHECK(s.ps.backup_workers >= 0, cfg.origin(), ": dist.backup_workers must be an integer >= 0 (k: each "
               "round aggregates the first N - k pushes), got ", s.ps.backup_workers);
  const bool async = cfg.get_choice("dist.sync", "sync", {"sync", "async"}) == "async";
  s.ps.max_staleness = cfg.get_int("dist.max_staleness", 1);
  RATION_CHECK(s.ps.max_staleness >= 0, cfg.origin(), ": dist.max_staleness must be an integer >= 0 (pushes a "
               "worker may run ahead of the slowest; 0 is synchronous), got ", s.ps.max_staleness);
  RATION_CHECK(!(async && s.ps.backup_workers > 0), cfg.origin(), ": dist.sync = \"async\" and dist.backup_workers = ",
               s.ps.backup_workers, " do not combine (backup workers close synchronous rounds; asynchronous pushes have "
               "none); set one of them");
  s.ps.mode = async ? PsAggregation::BoundedAsync
                    : s.ps.backup_workers > 0 ? PsAggregation::BackupWorkers : PsAggregation::Synchronous;
  s.aggregate = parse_aggregate(cfg.get_string("dist.aggregate", "gradients"), cfg.origin());
  if (s.aggregate == Aggregate::Parameters) {
    s.average_every = s.reducer.sync_every;  // K: local steps between averages, one micro-batch each
    s.reducer.sync_every = 1;
  }
  s.debug_delay_ms = cfg.get_int("dist.debug_delay_ms", 0);
  s.debug_delay_rank = cfg.get_int("dist.debug_delay_rank", -1);
  RATION_CHECK(s.debug_delay_ms >= 0 && s.debug_delay_rank >= -1, cfg.origin(), ": dist.debug_delay_ms must be an "
               "integer >= 0 and dist.debug_delay_rank an integer >= -1 (test aid: that rank sleeps this long per "
               "step), got ", s.debug_delay_ms, " and ", s.debug_delay_rank);
}

// dist.servers, which must agree with the servers the launcher started (RATION_PS_SERVERS, its default).
void read_servers(Config& cfg, DataParallelSettings& s) {
  const char* env = std::getenv("RATION_PS_SERVERS");
  int64_t started = 0;
  if (env != nullptr) {
    char* end = nullptr;
    started = std::strtoll(env, &end, 10);
    RATION_CHECK(*env != '\0' && *end == '\0' && started >= 0 && started < 4096, "RATION_PS_SERVERS='", env,
                 "' is not valid; expected the number of dedicated parameter servers, an integer >= 0 (ration "
                 "launch --servers sets it)");
  }
  s.servers = cfg.get_int("dist.servers", started);
  RATION_CHECK(s.servers >= 0, cfg.origin(), ": dist.servers must be an integer >= 0 (dedicated parameter "
               "servers), got ", s.servers);
  RATION_CHECK(s.servers == started || !environment_names_a_world(), cfg.origin(), ": dist.servers = ", s.servers,
               " but ", started, " server processes were started with the workers; start the job with ration launch "
               "-n WORKERS --servers ", s.servers, " -- train ... (by hand: RATION_PS_SERVERS=", s.servers,
               " and WORLD_SIZE = workers + ", s.servers, " in every process)");
  RATION_CHECK(s.servers == 0 || environment_names_a_world(), cfg.origin(), ": dist.servers = ", s.servers,
               " needs server processes beside the workers; start the job with ration launch -n WORKERS --servers ",
               s.servers, " -- train ...");
}

}  // namespace

DataParallelSettings read_data_parallel_settings(Config& cfg) {
  DataParallelSettings s;
  s.reducer.bucket_bytes = cfg.get_bytes("dist.bucket_bytes", s.reducer.bucket_bytes);
  s.reducer.first_bucket_bytes = cfg.get_bytes("dist.first_bucket_bytes", s.reducer.first_bucket_bytes);
  RATION_CHECK(s.reducer.bucket_bytes > 0 && s.reducer.first_bucket_bytes > 0, cfg.origin(),
               ": dist.bucket_bytes and dist.first_bucket_bytes must be positive sizes such as 25MiB");
  s.reducer.sync_every = cfg.get_int("dist.sync_every", s.reducer.sync_every);
  RATION_CHECK(s.reducer.sync_every >= 1, cfg.origin(), ": dist.sync_every must be an integer >= 1, got ",
               s.reducer.sync_every);
  s.compress = cfg.get_choice("dist.compress", s.compress, {"none", "fp16", "onebit"});
  s.onebit.feedback = cfg.get_bool("dist.error_feedback", true) ? ErrorFeedback::On : ErrorFeedback::Off;
  s.onebit.block = cfg.get_int("dist.onebit_block", s.onebit.block);
  RATION_CHECK(s.onebit.block >= 0, cfg.origin(),
               ": dist.onebit_block must be an integer >= 0 (elements per scale; 0: one per parameter), got ",
               s.onebit.block);
  s.onebit.lambda = cfg.get_double("dist.onebit_lambda", s.onebit.lambda);
  RATION_CHECK(s.onebit.lambda >= 0 && s.onebit.lambda < 1, cfg.origin(),
               ": dist.onebit_lambda must be a number in [0, 1) (0: the mean-|v| scale), got ", s.onebit.lambda);
  s.onebit.max_error = cfg.get_double("dist.onebit_max_error", s.onebit.max_error);
  RATION_CHECK(s.onebit.max_error >= 0 && s.onebit.max_error < 1, cfg.origin(),
               ": dist.onebit_max_error must be a number in [0, 1) (the largest ||v - C(v)|| / ||v|| per block; 0: no "
               "set bound), got ", s.onebit.max_error);
  // Default: the learning-rate warm-up (optim.warmup_steps), the steps whose compression costs accuracy
  // (docs/DISTRIBUTED.md, "fp32 warm-up").
  s.onebit.warmup_steps = cfg.get_int("dist.compress_warmup", cfg.get_int("optim.warmup_steps", 0));
  RATION_CHECK(s.onebit.warmup_steps >= 0, cfg.origin(),
               ": dist.compress_warmup must be an integer >= 0 (optimiser steps in fp32 before onebit), got ",
               s.onebit.warmup_steps);
  const std::string moment = cfg.get_choice("dist.onebit_second_moment", "track", {"track", "freeze"});
  s.onebit.second_moment = moment == "freeze" ? SecondMoment::Freeze : SecondMoment::Track;
  RATION_CHECK(s.onebit.second_moment == SecondMoment::Track || s.onebit.warmup_steps > 0, cfg.origin(),
               ": dist.onebit_second_moment = \"freeze\" keeps AdamW's second moment from the last fp32 step; it "
               "needs dist.compress_warmup >= 1, got ", s.onebit.warmup_steps);
  const std::string space = cfg.get_choice("dist.onebit_space", "gradient", {"gradient", "update"});
  s.onebit.space = space == "update" ? CodeSpace::Update : CodeSpace::Gradient;
  s.topology = parse_topology(cfg.get_string("dist.topology", "allreduce"), cfg.origin());
  s.timeout_s = cfg.get_int("dist.timeout_s", s.timeout_s);
  RATION_CHECK(s.timeout_s >= 1, cfg.origin(), ": dist.timeout_s must be a whole number of seconds >= 1, got ",
               s.timeout_s);
  read_partial_aggregation(cfg, s);
  s.gossip.graph = parse_gossip_graph(cfg.get_string("dist.gossip_graph", "ring"), cfg.origin());
  s.gossip.async = cfg.get_bool("dist.gossip_async", false);
  s.gossip.max_staleness = s.ps.max_staleness;
  // Asynchronous gossip: the measurement is an all-reduce of every rank (a barrier), so it is off unless asked for.
  s.gossip.disagreement_every = cfg.get_int("dist.disagreement_every", s.gossip.async ? 0 : 10);
  RATION_CHECK(s.gossip.disagreement_every >= 0, cfg.origin(), ": dist.disagreement_every must be an integer >= 0 "
               "(steps between measurements of the ranks' disagreement; 0: never), got ", s.gossip.disagreement_every);
  s.weights = cfg.get_double_list("dist.weights", {});
  for (double w : s.weights)
    RATION_CHECK(std::isfinite(w) && w > 0, cfg.origin(), ": dist.weights must be an array of numbers > 0, one per "
                 "rank (each rank's share of a step is its weight / their sum), got ", w);
  read_servers(cfg, s);
  check_aggregation(s, cfg.origin());
  return s;
}

JobRoles split_roles(const World& everyone, int64_t servers, const std::string& origin) {
  JobRoles roles;
  roles.everyone = everyone;
  roles.workers_count = everyone.size() - static_cast<int>(servers);
  RATION_CHECK(roles.workers_count >= 1, origin, ": dist.servers = ", servers, " leaves no worker among the job's ",
               everyone.size(), " processes; start them with ration launch -n WORKERS --servers ", servers);
  if (servers == 0) {
    roles.workers = everyone;
    return roles;
  }
  if (everyone.rank() >= roles.workers_count) {
    roles.server = everyone.rank() - roles.workers_count;
    roles.workers = World::init_single();
    return roles;
  }
  std::vector<int> members(static_cast<size_t>(roles.workers_count));
  for (int r = 0; r < roles.workers_count; ++r) members[static_cast<size_t>(r)] = r;
  roles.workers = everyone.subgroup("workers", members);
  return roles;
}

bool environment_names_a_world() { return std::getenv("WORLD_SIZE") != nullptr; }

World join_world(const DataParallelSettings& settings) {
  if (!environment_names_a_world()) return World::init_single();
  WorldOptions options;
  options.timeout = std::chrono::seconds(settings.timeout_s);
  return World::init(options);
}

uint64_t config_fingerprint(const std::map<std::string, std::string>& effective) {
  static const char* const kPerHost[] = {"train.threads", "data.dir", "data.files", "train.checkpoint_dir"};
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;
  };
  for (const auto& [k, v] : effective) {
    bool per_host = k.rfind("offload.", 0) == 0 || k.rfind("memory.", 0) == 0;
    for (const char* p : kPerHost) per_host = per_host || k == p;
    if (per_host) continue;
    mix(k);
    mix(v);
  }
  return h;
}

void check_same_config(const World& world, const std::map<std::string, std::string>& effective,
                       const std::string& origin) {
  if (world.size() <= 1) return;
  const uint64_t mine = config_fingerprint(effective);
  at::Tensor t = at::empty({1}, at::kLong);
  t.data_ptr<int64_t>()[0] = static_cast<int64_t>(mine);
  const at::Tensor all = world.all_gather(t);  // (size) int64
  std::ostringstream differing;
  int count = 0;
  for (int r = 1; r < world.size(); ++r) {
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differing << (count++ ? ", " : "") << r;
  }
  RATION_CHECK(count == 0, origin, ": the configuration of rank", count > 1 ? "s " : " ", differing.str(),
               " differs from rank 0's (fingerprints of the effective configuration, --set overrides "
               "included, differ); every rank must train the same model with the same keys (per-host keys "
               "train.threads, data.dir, data.files, train.checkpoint_dir, memory.* and offload.* may differ)");
}

void check_same_numbers(const World& world, const std::vector<std::pair<std::string, int64_t>>& named,
                        const std::string& origin) {
  if (world.size() <= 1 || named.empty()) return;
  const auto n = static_cast<int64_t>(named.size());
  at::Tensor mine = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) mine.data_ptr<int64_t>()[i] = named[static_cast<size_t>(i)].second;
  const at::Tensor all = world.all_gather(mine).contiguous();  // (size * n)
  const int64_t* v = all.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::ostringstream values, differing;
    int count = 0;
    for (int r = 0; r < world.size(); ++r) {
      values << (r ? ", " : "") << "rank " << r << ": " << v[r * n + i];
      if (v[r * n + i] != v[i]) differing << (count++ ? ", " : "") << r;
    }
    RATION_CHECK(count == 0, origin, ": every rank must run the same ", named[static_cast<size_t>(i)].first,
                 ", but rank", count > 1 ? "s " : " ", differing.str(), " differ", count > 1 ? "" : "s",
                 " from rank 0 (", values.str(), "); start every rank with the same command line");
  }
}

void broadcast_from_rank0(const World& world, const std::vector<std::pair<std::string, Value>>& params,
                          const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
  if (world.size() <= 1) return;
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    at::Tensor t = p.tensor();
    world.broadcast(t, 0);
  }
  for (const auto& [name, b] : buffers) {
    at::Tensor t = b;
    world.broadcast(t, 0);
  }
}

std::vector<double> all_reduce_doubles(const World& world, const std::vector<double>& values) {
  if (world.size() <= 1 || values.empty()) return values;
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kDouble);
  for (size_t i = 0; i < values.size(); ++i) t.data_ptr<double>()[i] = values[i];
  world.all_reduce_sum(t);
  return {t.data_ptr<double>(), t.data_ptr<double>() + values.size()};
}

std::vector<float> all_gather_floats(const World& world, const std::vector<float>& values) {
  if (world.size() <= 1) return values;
  at::Tensor n = at::empty({1}, at::kLong);
  n.data_ptr<int64_t>()[0] = static_cast<int64_t>(values.size());
  const at::Tensor lengths = world.all_gather(n);  // (size) int64
  const int64_t longest = lengths.max().item<int64_t>();
  std::vector<float> out;
  if (longest == 0) return out;
  at::Tensor mine = at::zeros({longest}, at::kFloat);  // (longest) this rank's values, zero-padded
  if (!values.empty()) std::copy(values.begin(), values.end(), mine.data_ptr<float>());
  const at::Tensor all = world.all_gather(mine);  // (size * longest)
  const float* p = all.data_ptr<float>();
  for (int r = 0; r < world.size(); ++r) {
    const int64_t len = lengths.data_ptr<int64_t>()[r];
    out.insert(out.end(), p + r * longest, p + r * longest + len);
  }
  return out;
}

}  // namespace ration::dist
