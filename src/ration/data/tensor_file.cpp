// tensor_file.cpp — see tensor_file.h.
#include "ration/data/tensor_file.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>

#include "ration/base/allocator.h"
#include "ration/base/check.h"

namespace ration::data {
namespace {

c10::IValue read_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RATION_CHECK(in.good(), "data file '", path, "' cannot be opened; hint: write it in PyTorch with ",
               "torch.save({\"inputs\": x, \"target\": y}, \"", path, "\")");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    RATION_CHECK(false, "data file '", path, "' cannot be read (", what.substr(0, what.find('\n')), "); hint: write it ",
                 "with torch.save({\"inputs\": x, \"target\": y}, path) (libtorch 1.13 reads a dictionary of two or more ",
                 "entries, not one)");
  }
  return {};
}

at::Tensor tensor_at(const std::string& path, const std::string& key, const c10::IValue& v) {
  RATION_CHECK(v.isTensor(), "data file '", path, "': \"", key, "\" holds a ", v.tagKind(), ", expected a tensor");
  RATION_CHECK(v.toTensor().dim() >= 1, "data file '", path, "': \"", key, "\" is a 0-d tensor; items go along dim 0");
  return v.toTensor().contiguous();
}

}  // namespace

TensorFile::TensorFile(const std::string& path) : path_(path) {
  memory::CategoryGuard data(memory::Category::Data);
  const c10::IValue value = read_pickle(path);
  RATION_CHECK(value.isGenericDict(), "data file '", path, "' holds a ", value.tagKind(),
               ", expected a dictionary {\"inputs\": ..., \"target\": ...}");
  const c10::Dict<c10::IValue, c10::IValue> dict = value.toGenericDict();
  std::string keys;
  for (const auto& entry : dict) keys += (keys.empty() ? "" : ", ") + (entry.key().isString() ? entry.key().toStringRef() : "?");
  for (const char* key : {"inputs", "target"}) {
    RATION_CHECK(dict.contains(key), "data file '", path, "' has no key \"", key, "\" (its keys: ", keys,
                 "); hint: torch.save({\"inputs\": x, \"target\": y}, path)");
  }
  const c10::IValue inputs = dict.at("inputs");
  if (inputs.isTensor()) {
    inputs_.push_back(tensor_at(path, "inputs", inputs));
  } else {
    RATION_CHECK(inputs.isList() || inputs.isTuple(), "data file '", path, "': \"inputs\" holds a ", inputs.tagKind(),
                 ", expected a tensor or a list/tuple of tensors");
    const std::vector<c10::IValue> items = inputs.isTuple() ? inputs.toTupleRef().elements().vec() : inputs.toListRef().vec();
    RATION_CHECK(!items.empty(), "data file '", path, "': \"inputs\" is an empty list");
    for (size_t i = 0; i < items.size(); ++i) inputs_.push_back(tensor_at(path, "inputs[" + std::to_string(i) + "]", items[i]));
  }
  target_ = tensor_at(path, "target", dict.at("target"));
  // Every tensor is indexed by the same item numbers, so all must have the same length along dim 0.
  for (size_t i = 0; i < inputs_.size(); ++i) {
    RATION_CHECK(inputs_[i].size(0) == inputs_[0].size(0), "data file '", path, "': inputs[", i, "] ",
                 inputs_[i].sizes(), " has ", inputs_[i].size(0), " items (dim 0) but inputs[0] ", inputs_[0].sizes(),
                 " has ", inputs_[0].size(0), "; hint: every input holds one row per item along dim 0");
    RATION_CHECK(inputs_[i].size(0) == target_.size(0), "data file '", path, "': inputs[", i, "] has ",
                 inputs_[i].size(0), " items (dim 0) but \"target\" has ", target_.size(0));
  }
  RATION_CHECK(target_.size(0) > 0, "data file '", path, "' has no items");
}

Batch TensorFile::get(const std::vector<int64_t>& indices) const {
  memory::CategoryGuard data(memory::Category::Data);
  for (int64_t i : indices) RATION_CHECK(i >= 0 && i < size(), "data file '", path_, "': index ", i, " outside [0, ", size(), ")");
  const at::Tensor index = at::tensor(indices, at::kLong);
  Batch b;
  b.input = Value(inputs_[0].index_select(0, index));
  for (size_t i = 1; i < inputs_.size(); ++i) b.extra_inputs.emplace_back(inputs_[i].index_select(0, index));
  b.target = Value(target_.index_select(0, index));
  b.items = static_cast<int64_t>(indices.size());
  return b;
}

}  // namespace ration::data
