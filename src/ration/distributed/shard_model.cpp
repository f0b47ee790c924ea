// shard_model.cpp — a parameter server's copy of (part of) the global model (see shard_model.h).
#include "ration/distributed/shard_model.h"

#include "ration/core/value.h"
#include "ration/optim/clip.h"

namespace ration::dist {

bool per_parameter_entry(const std::string& key) {
  return key.rfind("optim.", 0) == 0 && key != "optim.step" && key != "optim.lr";
}

ShardModel::ShardModel(const AggregatorContext& context, const optim::NamedParams& trainable,
                       const std::vector<size_t>& held, World servers)
    : context_(context), servers_(std::move(servers)), held_(held), total_params_(trainable.size()) {
  for (size_t i : held) {
    const auto& [name, p] = trainable[i];
    params_.emplace_back(name, parameter(p.tensor().detach().clone(), name));
    values_.push_back(params_.back().second);
    numel_ += p.numel();
  }
  optimizer_ = context.make_optimizer(params_);
  optimizer_->import_state(own_entries(context.optimizer->export_state()));
}

void ShardModel::apply(const at::Tensor& gradient, int64_t step) {
  int64_t offset = 0;
  for (auto& [name, p] : params_) {
    p.impl()->grad = gradient.narrow(0, offset, p.numel()).view(p.tensor().sizes());
    offset += p.numel();
  }
  if (context_.clip_grad_norm > 0) optim::clip_by_norms(values_, context_.clip_grad_norm, all_norms());
  if (context_.schedule) context_.schedule->apply(*optimizer_, step);
  optimizer_->step();
  optimizer_->zero_grad();
}

void ShardModel::read(at::Tensor& out) const {
  int64_t offset = 0;
  for (const auto& [name, p] : params_) {
    out.narrow(0, offset, p.numel()).copy_(p.tensor().reshape({-1}));
    offset += p.numel();
  }
}

// The run's optimiser entries that belong to this server's parameters (and the step count, the rate).
optim::NamedTensors ShardModel::own_entries(const optim::NamedTensors& all) const {
  optim::NamedTensors out;
  for (const auto& [key, t] : all) {
    bool mine = !per_parameter_entry(key);
    for (const auto& [name, p] : params_) mine = mine || key.substr(6, key.rfind('.') - 6) == name;
    if (mine) out.emplace_back(key, t);
  }
  return out;
}

// Every trainable parameter's gradient norm in model order: this server's computed here, the others'
// from the other servers (one all-reduce of a float per parameter; a sum with zeros is exact).
std::vector<at::Tensor> ShardModel::all_norms() {
  std::vector<at::Tensor> mine = optim::gradient_norms(values_);
  if (servers_.size() <= 1) return mine;
  at::Tensor all = at::zeros({static_cast<int64_t>(total_params_)}, at::kFloat);
  for (size_t k = 0; k < held_.size(); ++k) all[static_cast<int64_t>(held_[k])].copy_(mine[k]);
  servers_.all_reduce_sum(all);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < all.numel(); ++i) out.push_back(all[i]);
  return out;
}

}  // namespace ration::dist
