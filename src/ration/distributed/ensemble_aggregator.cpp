// ensemble_aggregator.cpp — an ensemble (dist.aggregate = "ensemble"): no exchange while training. Each
// rank trains its own member on its own bootstrap sample of the whole training set (the trainer's loader,
// told by the factory's `members` trait); evaluation combines the members' predictions by voting and by
// averaging probabilities (train/evaluation.h). Checkpoints hold every member: rank 0 gathers each
// rank's parameters and optimiser state as "dist.member<r>.param.<name>" / "dist.member<r>.optim.<name>"
// entries, and a resumed rank takes its own back (docs/DISTRIBUTED.md, "Ensembles").
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <map>

#include "ration/base/check.h"
#include "ration/core/value.h"
#include "ration/distributed/aggregators.h"

namespace ration::dist {
namespace {

std::string member_prefix(int rank) { return "dist.member" + std::to_string(rank) + "."; }

class EnsembleAggregator : public Aggregator {
 public:
  std::string name() const override { return "allreduce"; }  // no traffic: the report's "aggregate" says it
  bool owns_gradient() const override { return true; }
  std::string attach(const AggregatorContext& context) override {
    context_ = context;
    const std::string mine = member_prefix(context.world.rank());
    std::map<std::string, at::Tensor> params;
    optim::NamedTensors state;
    int members = 0;
    for (const auto& [name, t] : context.resumed) {
      if (name.rfind("dist.member", 0) != 0) continue;
      members = std::max(members, 1 + std::stoi(name.substr(11)));
      if (name.rfind(mine + "param.", 0) == 0) params[name.substr(mine.size() + 6)] = t;
      if (name.rfind(mine + "optim.", 0) == 0) state.emplace_back(name.substr(mine.size() + 6), t);
    }
    if (members == 0) return {};
    if (members != context.world.size())
      return "the checkpoint holds " + std::to_string(members) + " ensemble members, this run has " +
             std::to_string(context.world.size()) + " ranks: every member starts from member 0";
    at::NoGradGuard no_grad;
    for (const auto& [name, p] : context.params) {
      const auto it = params.find(name);
      RATION_CHECK(it != params.end() && it->second.sizes() == p.tensor().sizes(), context.origin,
                   ": the checkpoint's ensemble member ", context.world.rank(), " lacks parameter '", name,
                   "' of this model's shape");
      p.impl()->tensor.copy_(it->second);
    }
    context.optimizer->import_state(state);
    return {};
  }
  // Every member's parameters and optimiser state, gathered to rank 0 (all ranks hold the same shapes).
  optim::NamedTensors gather_state(const World& world) override {
    optim::NamedTensors mine;
    for (const auto& [name, p] : context_.params) mine.emplace_back("param." + name, p.tensor());
    for (const auto& [name, t] : context_.optimizer->export_state()) mine.emplace_back("optim." + name, t);
    optim::NamedTensors out;
    for (const auto& [name, t] : mine) {
      const at::Tensor flat = t.to(at::kFloat).contiguous().reshape({-1});
      const at::Tensor all = world.all_gather(flat);  // (N * numel), rank order
      if (world.rank() != 0) continue;
      for (int r = 0; r < world.size(); ++r)
        out.emplace_back(member_prefix(r) + name,
                         all.narrow(0, r * flat.numel(), flat.numel()).reshape(t.sizes()).to(t.scalar_type()).clone());
    }
    return out;
  }
  nlohmann::json report() override { return {{"aggregate", "ensemble"}, {"members", context_.world.size()}}; }

 private:
  AggregatorContext context_;
};

}  // namespace

std::unique_ptr<Aggregator> make_ensemble_aggregator() { return std::make_unique<EnsembleAggregator>(); }

}  // namespace ration::dist
