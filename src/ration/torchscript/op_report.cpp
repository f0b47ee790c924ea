// op_report.cpp — see op_report.h.
#include "ration/torchscript/op_report.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "ration/torchscript/generic_op.h"

namespace ration::torchscript {

std::vector<OpShare> op_shares(const memory::StepProfile& profile) {
  const std::string prefix = generic_node_name("");
  std::map<std::string, OpShare> by_name;
  double total = 0;
  for (const memory::ProfiledNode& n : profile.nodes) {
    OpShare& row = by_name[n.op];
    row.generic = n.op.rfind(prefix, 0) == 0;
    row.op = row.generic ? n.op.substr(prefix.size()) : n.op;
    row.nodes += 1;
    row.forward_ms += n.forward_ms;
    row.backward_ms += n.backward_ms;
    total += n.forward_ms + n.backward_ms;
  }
  std::vector<OpShare> rows;
  for (auto& [name, row] : by_name) {
    row.share = total > 0 ? (row.forward_ms + row.backward_ms) / total : 0;
    rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end(), [](const OpShare& a, const OpShare& b) { return a.share > b.share; });
  return rows;
}

std::string op_share_table(const std::vector<OpShare>& rows) {
  double native = 0, generic = 0;
  for (const OpShare& r : rows) (r.generic ? generic : native) += r.share;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "imported ops: %.1f%% of node time in ration's own ops, %.1f%% in generic nodes\n",
                100 * native, 100 * generic);
  out += line;
  std::snprintf(line, sizeof line, "  %-34s %-8s %6s %11s %11s %7s\n", "op", "route", "nodes", "forward ms",
                "backward ms", "share");
  out += line;
  for (const OpShare& r : rows) {
    std::snprintf(line, sizeof line, "  %-34s %-8s %6lld %11.3f %11.3f %6.1f%%\n", r.op.c_str(),
                  r.generic ? "generic" : "native", static_cast<long long>(r.nodes), r.forward_ms, r.backward_ms,
                  100 * r.share);
    out += line;
  }
  return out;
}

nlohmann::json op_share_json(const std::vector<OpShare>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const OpShare& r : rows)
    out.push_back({{"op", r.op}, {"route", r.generic ? "generic" : "native"}, {"nodes", r.nodes},
                   {"forward_ms", r.forward_ms}, {"backward_ms", r.backward_ms}, {"share", r.share}});
  return out;
}

}  // namespace ration::torchscript
