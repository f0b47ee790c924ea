// aggregator.cpp — laying per-parameter tensors out as the buckets are (see aggregator.h).
#include "ration/distributed/aggregator.h"

#include <map>

#include "ration/base/check.h"

namespace ration::dist {

std::vector<at::Tensor> lay_out_as_buckets(const std::vector<BucketLayout>& layouts,
                                           const std::vector<std::pair<std::string, at::Tensor>>& per_param,
                                           float missing) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : per_param) by_name[name] = &t;
  std::vector<at::Tensor> out;
  for (const BucketLayout& l : layouts) {
    at::Tensor flat = at::full({l.numel}, missing, at::kFloat);  // (numel)
    for (size_t i = 0; i < l.names.size(); ++i) {
      const auto it = by_name.find(l.names[i]);
      if (it == by_name.end()) continue;
      RATION_ASSERT(it->second->numel() == l.numels[i], "lay_out_as_buckets: ", l.names[i], " has ",
                    it->second->numel(), " elements, the bucket holds ", l.numels[i]);
      flat.narrow(0, l.offsets[i], l.numels[i]).copy_(it->second->reshape({-1}));
    }
    out.push_back(flat);
  }
  return out;
}

}  // namespace ration::dist
