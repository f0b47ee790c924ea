// optimizer.cpp — the shared step loop and state bookkeeping of every optimiser (see optimizer.h).
#include "ration/optim/optimizer.h"

#include <ATen/core/grad_mode.h>
#include <algorithm>
#include <set>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::optim {
namespace {
constexpr const char* kPrefix = "optim.";
constexpr const char* kStepKey = "optim.step";
constexpr const char* kLrKey = "optim.lr";
}  // namespace

Optimizer::Optimizer(NamedParams params, double lr) : params_(std::move(params)), lr_(lr) {
  RATION_CHECK(lr >= 0, "learning rate must be >= 0, got ", lr);
  std::set<std::string> seen;
  for (const auto& [name, value] : params_) {
    RATION_CHECK(!name.empty(), "optimiser parameters need names (they key the saved state)");
    RATION_CHECK(seen.insert(name).second, "parameter '", name, "' is given to the optimiser twice");
    RATION_CHECK(value.defined(), "parameter '", name, "' is undefined");
    RATION_CHECK(at::isFloatingType(value.dtype()), "parameter '", name, "' has dtype ", value.dtype(),
                 "; only floating-point parameters can be optimised");
  }
  state_.resize(params_.size());
}

void Optimizer::set_lr(double lr) {
  RATION_CHECK(lr >= 0, "learning rate must be >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::step() {
  NoGradGuard ration_no_grad;
  at::NoGradGuard torch_no_grad;  // parameters are torch leaves with requires_grad in oracle mode
  memory::CategoryGuard workspace(memory::Category::Workspace);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Value& p = params_[i].second;
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    at::Tensor param = p.tensor();  // shares storage: updates land in the parameter
    RATION_CHECK(grad.sizes() == param.sizes(), "gradient of '", params_[i].first, "' has shape ", grad.sizes(),
                 " but the parameter has shape ", param.sizes());
    RATION_CHECK(grad.scalar_type() == param.scalar_type(), "gradient of '", params_[i].first, "' has dtype ",
                 grad.scalar_type(), " but the parameter has dtype ", param.scalar_type());
    update(i, param, grad);
  }
  ++step_count_;
}

int64_t Optimizer::update_workspace_bytes() {
  if (params_.empty()) return 0;
  size_t largest = 0;
  for (size_t i = 1; i < params_.size(); ++i)
    if (params_[i].second.numel() > params_[largest].second.numel()) largest = i;
  NoGradGuard ration_no_grad;
  at::NoGradGuard torch_no_grad;
  memory::CategoryGuard workspace(memory::Category::Workspace);
  // Copies of the parameter, a gradient and the state, so the measured updates change nothing real.
  at::Tensor param = params_[largest].second.tensor().clone();
  const at::Tensor grad = at::zeros_like(param);
  std::map<std::string, at::Tensor> kept = std::move(state_[largest]);
  state_[largest].clear();
  for (const auto& [name, t] : kept) state_[largest][name] = t.clone();
  constexpr int kWorkspace = static_cast<int>(memory::Category::Workspace);
  const int64_t before = memory::stats().current[kWorkspace];
  memory::reset_peak();
  update(largest, param, grad);  // a first update may create the state and take another path: twice
  update(largest, param, grad);
  const int64_t peak = memory::stats().peak[kWorkspace];
  state_[largest] = std::move(kept);
  return std::max<int64_t>(0, peak - before);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& [name, p] : params_) {
    at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) g = at::Tensor();
    else g.zero_();
  }
}

at::Tensor& Optimizer::slot(size_t index, const std::string& name, bool* created) {
  auto& slots = state_.at(index);
  auto it = slots.find(name);
  if (created != nullptr) *created = it == slots.end();
  if (it != slots.end()) return it->second;
  memory::CategoryGuard guard(memory::Category::Optimizer);
  const at::Tensor& param = params_[index].second.tensor();
  at::Tensor init = slot_is_scalar(name) ? at::zeros({}, param.options().dtype(at::kLong))
                                         : at::zeros_like(param, at::MemoryFormat::Preserve);
  return slots.emplace(name, std::move(init)).first->second;
}

bool Optimizer::has_slot(size_t index, const std::string& name) const {
  return state_.at(index).count(name) != 0;
}

NamedTensors Optimizer::export_state() const {
  NamedTensors out;
  out.emplace_back(kStepKey, at::scalar_tensor(step_count_, at::kLong));
  out.emplace_back(kLrKey, at::scalar_tensor(lr_, at::kDouble));
  for (size_t i = 0; i < params_.size(); ++i) {
    for (const auto& [slot_name, t] : state_[i]) {
      out.emplace_back(kPrefix + params_[i].first + "." + slot_name, t);
    }
  }
  return out;
}

void Optimizer::import_state(const NamedTensors& state) {
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < params_.size(); ++i) index_of[params_[i].first] = i;
  const std::vector<std::string> known = slot_names();

  std::vector<std::map<std::string, at::Tensor>> fresh(params_.size());
  bool have_step = false;
  int64_t step_count = 0;
  double lr = lr_;
  memory::CategoryGuard guard(memory::Category::Optimizer);
  at::NoGradGuard torch_no_grad;
  for (const auto& [key, t] : state) {
    RATION_CHECK(t.defined(), "optimiser state entry '", key, "' is an undefined tensor");
    if (key == kStepKey) {
      RATION_CHECK(t.numel() == 1, "'", key, "' must be a scalar, got shape ", t.sizes());
      step_count = t.item<int64_t>();
      have_step = true;
      continue;
    }
    if (key == kLrKey) {
      RATION_CHECK(t.numel() == 1, "'", key, "' must be a scalar, got shape ", t.sizes());
      lr = t.item<double>();
      continue;
    }
    RATION_CHECK(key.rfind(kPrefix, 0) == 0, "optimiser state entry '", key, "' does not start with '", kPrefix,
                 "'; hint: pass only the optimiser's entries of a checkpoint");
    const size_t dot = key.rfind('.');
    RATION_CHECK(dot != std::string::npos && dot > std::string(kPrefix).size(), "optimiser state entry '", key,
                 "' is not of the form optim.<param>.<slot>");
    const std::string param_name = key.substr(std::string(kPrefix).size(), dot - std::string(kPrefix).size());
    const std::string slot_name = key.substr(dot + 1);
    auto it = index_of.find(param_name);
    RATION_CHECK(it != index_of.end(), "optimiser state entry '", key, "' names parameter '", param_name,
                 "', which this ", name(), " optimiser does not hold; hint: was the checkpoint made for another model?");
    RATION_CHECK(std::find(known.begin(), known.end(), slot_name) != known.end(), "optimiser state entry '", key,
                 "' has slot '", slot_name, "', which ", name(), " does not use; hint: was it saved by another optimiser?");
    const at::Tensor& param = params_[it->second].second.tensor();
    at::Tensor copy;
    if (slot_is_scalar(slot_name)) {
      RATION_CHECK(t.numel() == 1, "optimiser state entry '", key, "' must be a scalar, got shape ", t.sizes());
      copy = t.to(param.device(), at::kLong).reshape({}).clone();
    } else {
      RATION_CHECK(t.sizes() == param.sizes(), "optimiser state entry '", key, "' has shape ", t.sizes(),
                   " but parameter '", param_name, "' has shape ", param.sizes());
      copy = t.to(param.device(), param.scalar_type()).clone(at::MemoryFormat::Preserve);
    }
    fresh[it->second][slot_name] = std::move(copy);
  }
  RATION_CHECK(have_step, "optimiser state lacks '", kStepKey, "'; hint: was it written by export_state()?");
  RATION_CHECK(lr >= 0, "optimiser state has a negative learning rate ", lr);
  state_ = std::move(fresh);
  step_count_ = step_count;
  lr_ = lr;
}

int64_t Optimizer::parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, p] : params_) bytes += p.numel() * static_cast<int64_t>(p.tensor().element_size());
  return bytes;
}

int64_t Optimizer::unseen_state_bytes() const {
  const int64_t live = memory::stats().current[static_cast<int>(memory::Category::Optimizer)];
  return std::max<int64_t>(0, state_bytes() - live);
}

}  // namespace ration::optim
