// agreed_profile.cpp — see agreed_profile.h.
#include "ration/distributed/agreed_profile.h"

#include <vector>

#include "ration/base/check.h"

namespace ration::dist {

void agree_profile(memory::StepProfile& p, const World& group) {
  if (!group.defined() || group.size() <= 1) return;
  // The graph's shape first: equal on every rank, or the ranks ran different steps.
  at::Tensor shape = at::tensor({static_cast<int64_t>(p.nodes.size()), static_cast<int64_t>(p.storages.size()),
                                 static_cast<int64_t>(p.backward_order.size())}, at::kLong);
  const at::Tensor mine = shape.clone();
  group.broadcast(shape, 0);
  RATION_CHECK(at::equal(shape, mine), "rank ", group.rank(), " of a tensor-parallel group profiled another graph ",
               "than its rank 0 (nodes, storages, backward nodes: ", mine, " vs ", shape,
               "); the group's ranks must run the same step");
  std::vector<double> times{p.forward_ms, p.backward_ms};
  std::vector<int64_t> bytes{p.baseline_bytes, p.measured_peak_bytes};
  for (const auto& n : p.nodes) {
    times.insert(times.end(), {n.forward_ms, n.backward_ms});
    bytes.insert(bytes.end(), {n.peak_bytes, n.end_bytes});
  }
  for (const auto& s : p.storages) bytes.push_back(s.bytes);
  bytes.insert(bytes.end(), p.backward_peak_bytes.begin(), p.backward_peak_bytes.end());
  bytes.insert(bytes.end(), p.backward_start_bytes.begin(), p.backward_start_bytes.end());
  at::Tensor t = at::tensor(times, at::kDouble), b = at::tensor(bytes, at::kLong);
  group.broadcast(t, 0);
  group.broadcast(b, 0);
  const double* tt = t.data_ptr<double>();
  const int64_t* bb = b.data_ptr<int64_t>();
  p.forward_ms = *tt++;
  p.backward_ms = *tt++;
  p.baseline_bytes = *bb++;
  p.measured_peak_bytes = *bb++;
  for (auto& n : p.nodes) {
    n.forward_ms = *tt++;
    n.backward_ms = *tt++;
    n.peak_bytes = *bb++;
    n.end_bytes = *bb++;
  }
  for (auto& s : p.storages) s.bytes = *bb++;
  for (auto& v : p.backward_peak_bytes) v = *bb++;
  for (auto& v : p.backward_start_bytes) v = *bb++;
}

}  // namespace ration::dist
