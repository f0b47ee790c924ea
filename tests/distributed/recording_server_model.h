// recording_server_model.h — a parameter-server model for the aggregation tests: its "update" is
// p <- p - g (plain SGD, lr 1) and it keeps every gradient it applied and the step it was applied at.
// Owns: nothing beyond the test's parameters. Does not own: the aggregation rules under test
// (src/ration/distributed/ps_aggregation.*).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "ration/distributed/ps_aggregation.h"

namespace ration::dist {

class RecordingModel : public ServerModel {
 public:
  explicit RecordingModel(int64_t numel) : params_(at::zeros({numel})) {}
  int64_t numel() const override { return params_.numel(); }
  void apply(const at::Tensor& gradient, int64_t step) override {
    applied.push_back(gradient.clone());
    steps.push_back(step);
    params_.sub_(gradient);
  }
  void read(at::Tensor& out) const override { out.copy_(params_); }
  std::vector<at::Tensor> applied;
  std::vector<int64_t> steps;

 private:
  at::Tensor params_;
};

}  // namespace ration::dist
