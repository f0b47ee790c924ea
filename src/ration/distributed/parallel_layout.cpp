#include "ration/distributed/parallel_layout.h"

#include "ration/base/check.h"

namespace ration::dist {

const char* to_string(PipelineSchedule s) { return s == PipelineSchedule::GPipe ? "gpipe" : "1f1b"; }
const char* to_string(PipelineSplit s) {
  return s == PipelineSplit::Bytes ? "bytes" : s == PipelineSplit::Uniform ? "uniform" : "time";
}

ParallelSettings read_parallel_settings(Config& cfg) {
  ParallelSettings s;
  s.tensor = cfg.get_int("parallel.tensor", 1);
  RATION_CHECK(s.tensor >= 1, cfg.origin(), ": parallel.tensor must be an integer >= 1 (processes each layer is ",
               "split over); got ", s.tensor);
  s.pipeline = cfg.get_int("parallel.pipeline", 1);
  RATION_CHECK(s.pipeline >= 1, cfg.origin(), ": parallel.pipeline must be an integer >= 1 (pipeline stages); got ",
               s.pipeline);
  s.micro_batches = cfg.get_int("parallel.micro_batches", s.pipeline);
  RATION_CHECK(s.micro_batches >= 1, cfg.origin(), ": parallel.micro_batches must be an integer >= 1 (pieces of ",
               "each batch the pipeline streams); got ", s.micro_batches);
  s.schedule = cfg.get_choice("parallel.schedule", "1f1b", {"1f1b", "gpipe"}) == "gpipe" ? PipelineSchedule::GPipe
                                                                                       : PipelineSchedule::OneFOneB;
  const std::string split = cfg.get_choice("parallel.split", "time", {"time", "bytes", "uniform"});
  s.split = split == "bytes" ? PipelineSplit::Bytes : split == "uniform" ? PipelineSplit::Uniform : PipelineSplit::Time;
  s.feature_split = cfg.get_choice("parallel.features", "none", {"none", "table"}) == "table";
  return s;
}

ParallelLayout make_layout(const ParallelSettings& settings, int world_size, int rank, const std::string& origin) {
  const int64_t per_replica = settings.tensor * settings.pipeline;
  RATION_CHECK(world_size >= 1 && world_size % per_replica == 0, origin, ": ", world_size,
               " processes do not split into parallel.tensor = ", settings.tensor, " x parallel.pipeline = ",
               settings.pipeline, " x data-parallel replicas D: N = T x P x D needs N to be a multiple of ",
               per_replica, " (e.g. ration launch -n ", per_replica, " or -n ", 2 * per_replica, ")");
  ParallelLayout l;
  l.tensor = static_cast<int>(settings.tensor);
  l.pipeline = static_cast<int>(settings.pipeline);
  l.data = static_cast<int>(world_size / per_replica);
  l.rank = rank;
  l.tensor_rank = rank % l.tensor;
  l.replica = (rank / l.tensor) % l.data;
  l.stage = rank / (l.tensor * l.data);
  return l;
}

namespace {
// The ranks of `count` coordinates along one axis, the others this rank's.
template <typename RankAt>
std::vector<int> along(int count, RankAt rank_at) {
  std::vector<int> m;
  for (int i = 0; i < count; ++i) m.push_back(rank_at(i));
  return m;
}
}  // namespace

std::vector<int> ParallelLayout::tensor_members() const {
  return along(tensor, [&](int t) { return rank_of(t, stage, replica); });
}

std::vector<int> ParallelLayout::pipeline_members() const {
  return along(pipeline, [&](int s) { return rank_of(tensor_rank, s, replica); });
}

std::vector<int> ParallelLayout::data_members() const {
  return along(data, [&](int d) { return rank_of(tensor_rank, stage, d); });
}

std::vector<int> ParallelLayout::model_members() const {
  std::vector<int> m;
  for (int s = 0; s < pipeline; ++s)
    for (int t = 0; t < tensor; ++t) m.push_back(rank_of(t, s, replica));
  return m;
}

std::string ParallelLayout::describe() const {
  return detail::str("stage ", stage, "/", pipeline, ", tensor shard ", tensor_rank, "/", tensor, ", replica ", replica,
                     "/", data);
}

std::vector<std::string> ParallelLayout::describe_all() const {
  std::vector<std::string> lines;
  for (int r = 0; r < size(); ++r) {
    ParallelLayout other = *this;
    other.rank = r;
    other.tensor_rank = r % tensor;
    other.replica = (r / tensor) % data;
    other.stage = r / (tensor * data);
    lines.push_back(detail::str("rank ", r, ": ", other.describe()));
  }
  return lines;
}

ParallelGroups build_groups(const World& everyone, const ParallelLayout& layout) {
  ParallelGroups g;
  g.layout = layout;
  g.everyone = everyone;
  const ParallelLayout& l = layout;
  // Every rank opens its groups in the same order (tensor, pipeline, data, model, ends); a group's
  // members are all at the same point of that order when they open it, so no rank waits on another kind.
  auto name = [&](const char* kind, int a, int b) { return detail::str(kind, "-", a, "-", b); };
  g.tensor = everyone.subgroup(name("tensor", l.stage, l.replica), l.tensor_members());
  g.pipeline = everyone.subgroup(name("pipeline", l.tensor_rank, l.replica), l.pipeline_members());
  g.data = everyone.subgroup(name("data", l.tensor_rank, l.stage), l.data_members());
  g.model = everyone.subgroup(name("model", l.replica, 0), l.model_members());
  if (l.pipeline > 1 && (l.first_stage() || l.last_stage()))
    g.ends = everyone.subgroup(name("ends", l.tensor_rank, l.replica),
                               {l.rank_of(l.tensor_rank, 0, l.replica), l.rank_of(l.tensor_rank, l.pipeline - 1, l.replica)});
  return g;
}

}  // namespace ration::dist
