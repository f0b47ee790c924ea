// plan/html.cpp — see plan/html.h. The chart is drawn in MiB against node boundaries: forward nodes by
// ordinal, then backward nodes in execution order; each node's peak is a flat step over its slot.
#include "ration/plan/html.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::memory {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// What the plan decided for a group, as the table shows it.
const char* decision_of(const Group& g) {
  switch (g.decision) {
    case Decision::Keep: return "kept";
    case Decision::Offload: return "offloaded";
    case Decision::Recompute: return "recomputed";
  }
  return "?";
}

// One line of the chart: bytes per node slot (forward ordinals, then backward execution order).
struct Series {
  std::string css_class;  // stroke colour, width and dash pattern (see kStyle)
  std::string label;
  std::vector<int64_t> bytes;
};

// Tick spacing of 1, 2 or 5 × 10^k covering [0, max] in about `ticks` steps.
double nice_step(double max, int ticks) {
  const double raw = std::max(max, 1e-9) / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

int decimals_for(double step) { return step >= 1 ? 0 : step >= 0.1 ? 1 : 2; }

// Chart geometry: plot area inside margins; x in node slots, y in MiB.
struct Frame {
  double width = 1120, height = 460, left = 84, right = 28, top = 56, bottom = 78;
  double slots = 1, y_max = 1;
  double plot_w() const { return width - left - right; }
  double plot_h() const { return height - top - bottom; }
  double x(double slot) const { return left + plot_w() * slot / slots; }
  double y(double mib) const { return top + plot_h() * (1.0 - mib / y_max); }
};

// A step path: each slot's value held flat across the slot.
std::string step_path(const Frame& f, const std::vector<int64_t>& bytes) {
  std::ostringstream d;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const double y = f.y(static_cast<double>(bytes[i]) / kMiB);
    d << (i == 0 ? "M" : "L") << fixed(f.x(static_cast<double>(i)), 1) << ' ' << fixed(y, 1) << " H"
      << fixed(f.x(static_cast<double>(i + 1)), 1) << ' ';
  }
  return d.str();
}

const char* kStyle = R"(
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
         color: #1a1a1a; background: #fff; margin: 24px; max-width: 1180px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 16px; margin: 28px 0 6px; }
  .sub { color: #555; margin: 0 0 14px; }
  dl.summary { display: grid; grid-template-columns: max-content auto; gap: 2px 18px; margin: 0 0 12px; }
  dl.summary dt { color: #555; } dl.summary dd { margin: 0; font-variant-numeric: tabular-nums; }
  svg { display: block; border: 1px solid #ddd; background: #fff; }
  svg text { font: 12px system-ui, "DejaVu Sans", sans-serif; fill: #1a1a1a; }
  svg .axis-title { font-size: 13px; font-weight: 600; }
  svg .grid { stroke: #e4e4e4; stroke-width: 1; }
  svg .axis { stroke: #1a1a1a; stroke-width: 1; }
  svg .phase { stroke: #777; stroke-width: 1; stroke-dasharray: 2 3; }
  .measured { fill: none; stroke: #e08a00; stroke-width: 2.5; }
  .plan { fill: none; stroke: #123a7a; stroke-width: 2; stroke-dasharray: 9 5; }
  .trained { fill: none; stroke: #b8002e; stroke-width: 3; stroke-dasharray: 1 4; stroke-linecap: round; }
  .budget { fill: none; stroke: #000; stroke-width: 1.5; stroke-dasharray: 2 4 10 4; }
  .peak { fill: #123a7a; }
  svg text.halo { paint-order: stroke; stroke: #fff; stroke-width: 4px; stroke-linejoin: round; }
  .note { color: #555; margin: 6px 0 0; max-width: 1120px; }
  table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
  th, td { padding: 3px 10px; border-bottom: 1px solid #e6e6e6; text-align: left; }
  td.num, th.num { text-align: right; }
  th button { all: unset; cursor: pointer; font-weight: 600; }
  th button:focus-visible { outline: 2px solid #123a7a; }
  th[aria-sort="ascending"] button::after { content: " \25B2"; }
  th[aria-sort="descending"] button::after { content: " \25BC"; }
  tbody tr:nth-child(even) { background: #f6f6f6; }
  td.kept { font-weight: 600; } td.recomputed { font-style: italic; } td.offloaded { text-decoration: underline; }
)";

// Sorting: a click on a column header sorts by that column (numbers by their data-v value), again to
// reverse; a link may ask for a sorted view with #sort=KEY or #sort=KEY:desc (KEY: a header's data-key,
// e.g. #sort=bytes:desc). window errors are recorded on <body data-errors>, and <body data-ready="1"> marks that the
// script ran to its end: a headless browser test reads both.
const char* kScript = R"(
(function () {
  window.addEventListener('error', function (e) {
    document.body.setAttribute('data-errors', (document.body.getAttribute('data-errors') || '') + e.message + ';');
  });
  var table = document.getElementById('groups');
  var heads = table.tHead.rows[0].cells;
  function key(row, c) {
    var v = row.cells[c].getAttribute('data-v');
    var n = Number(v);
    return v !== '' && !isNaN(n) ? n : v;
  }
  function sortBy(c) {
    var ascending = heads[c].getAttribute('aria-sort') !== 'ascending';
    for (var i = 0; i < heads.length; i++) heads[i].removeAttribute('aria-sort');
    heads[c].setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a, c), y = key(b, c);
      var r = x < y ? -1 : x > y ? 1 : 0;
      return ascending ? r : -r;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  for (var c = 0; c < heads.length; c++) {
    (function (c) { heads[c].querySelector('button').addEventListener('click', function () { sortBy(c); }); })(c);
  }
  var asked = /sort=([a-z-]+)(:desc)?/.exec(window.location.hash);
  for (var k = 0; asked && k < heads.length; k++) {
    if (heads[k].getAttribute('data-key') !== asked[1]) continue;
    sortBy(k);
    if (asked[2]) sortBy(k);
  }
  document.body.setAttribute('data-ready', '1');
})();
)";

void write_chart(std::ostringstream& os, const StepProfile& profile, const Plan& plan, const MeasuredCurve* trained) {
  const size_t n_forward = profile.nodes.size();
  const size_t n_backward = profile.backward_peak_bytes.size();
  Series measured{"measured", "unconstrained, measured (everything kept)", {}};
  for (const auto& node : profile.nodes) measured.bytes.push_back(node.peak_bytes);
  measured.bytes.insert(measured.bytes.end(), profile.backward_peak_bytes.begin(), profile.backward_peak_bytes.end());
  Series predicted{"plan", "plan, predicted", {}};
  predicted.bytes = plan.prediction.forward_peaks;
  predicted.bytes.insert(predicted.bytes.end(), plan.prediction.backward_peaks.begin(),
                         plan.prediction.backward_peaks.end());

  Series train_step{"trained",
                    "training step " + std::to_string(trained ? trained->step : 0) + ", measured under the plan", {}};
  if (trained) train_step.bytes = trained->bytes;
  std::vector<const Series*> series{&measured, &predicted};
  if (trained) series.push_back(&train_step);

  Frame f;
  f.slots = static_cast<double>(
      std::max<size_t>({measured.bytes.size(), predicted.bytes.size(), train_step.bytes.size(), 1}));
  int64_t top_bytes = plan.budget_bytes;
  for (const Series* s : series)
    for (int64_t b : s->bytes) top_bytes = std::max(top_bytes, b);
  const double y_step = nice_step(static_cast<double>(top_bytes) / kMiB * 1.06, 6);
  f.y_max = y_step * std::ceil(static_cast<double>(top_bytes) / kMiB * 1.06 / y_step);

  os << "<svg width=\"" << f.width << "\" height=\"" << f.height
     << "\" viewBox=\"0 0 " << f.width << ' ' << f.height << "\" role=\"img\" aria-labelledby=\"chart-title\">\n"
     << "<title id=\"chart-title\">Device memory at every node boundary of forward and backward</title>\n";
  // Horizontal grid and y ticks (MiB).
  const int y_dec = decimals_for(y_step);
  for (double v = 0; v <= f.y_max + y_step / 2; v += y_step) {
    const double y = f.y(v);
    os << "<line class=\"grid\" x1=\"" << f.left << "\" x2=\"" << f.width - f.right << "\" y1=\"" << fixed(y, 1)
       << "\" y2=\"" << fixed(y, 1) << "\"/>"
       << "<text x=\"" << f.left - 8 << "\" y=\"" << fixed(y + 4, 1) << "\" text-anchor=\"end\">" << fixed(v, y_dec)
       << "</text>\n";
  }
  // x ticks: forward ordinals, then backward steps, about 6 labels each.
  auto x_ticks = [&](size_t count, size_t offset, const char* prefix) {
    if (count == 0) return;
    const size_t step = std::max<size_t>(1, static_cast<size_t>(nice_step(static_cast<double>(count), 6)));
    for (size_t i = 0; i < count; i += step) {
      const double x = f.x(static_cast<double>(offset + i) + 0.5);
      os << "<line class=\"axis\" x1=\"" << fixed(x, 1) << "\" x2=\"" << fixed(x, 1) << "\" y1=\""
         << f.height - f.bottom << "\" y2=\"" << f.height - f.bottom + 5 << "\"/>"
         << "<text x=\"" << fixed(x, 1) << "\" y=\"" << f.height - f.bottom + 18 << "\" text-anchor=\"middle\">"
         << prefix << i << "</text>\n";
    }
  };
  x_ticks(n_forward, 0, "f");
  x_ticks(n_backward, n_forward, "b");
  // Axes and titles.
  os << "<line class=\"axis\" x1=\"" << f.left << "\" x2=\"" << f.left << "\" y1=\"" << f.top << "\" y2=\""
     << f.height - f.bottom << "\"/>"
     << "<line class=\"axis\" x1=\"" << f.left << "\" x2=\"" << f.width - f.right << "\" y1=\"" << f.height - f.bottom
     << "\" y2=\"" << f.height - f.bottom << "\"/>\n"
     << "<text class=\"axis-title\" transform=\"translate(20 " << fixed(f.top + f.plot_h() / 2, 1)
     << ") rotate(-90)\" text-anchor=\"middle\">device memory (MiB)</text>\n"
     << "<text class=\"axis-title\" x=\"" << fixed(f.left + f.plot_w() / 2, 1) << "\" y=\"" << f.height - 16
     << "\" text-anchor=\"middle\">node boundary: forward nodes f0…f" << (n_forward ? n_forward - 1 : 0)
     << " (creation order), then backward nodes b0…b" << (n_backward ? n_backward - 1 : 0)
     << " (execution order)</text>\n";
  // Forward | backward separator.
  const double x_split = f.x(static_cast<double>(n_forward));
  os << "<line class=\"phase\" x1=\"" << fixed(x_split, 1) << "\" x2=\"" << fixed(x_split, 1) << "\" y1=\"" << f.top
     << "\" y2=\"" << f.height - f.bottom << "\"/>"
     << "<text x=\"" << fixed(x_split - 6, 1) << "\" y=\"" << f.top + 14 << "\" text-anchor=\"end\">forward</text>"
     << "<text x=\"" << fixed(x_split + 6, 1) << "\" y=\"" << f.top + 14 << "\">backward</text>\n";
  // Budget line, series, the predicted peak.
  const double y_budget = f.y(static_cast<double>(plan.budget_bytes) / kMiB);
  os << "<line id=\"budget-line\" class=\"budget\" x1=\"" << f.left << "\" x2=\"" << f.width - f.right << "\" y1=\""
     << fixed(y_budget, 1) << "\" y2=\"" << fixed(y_budget, 1) << "\"/>\n";
  for (const Series* s : series) {
    os << "<path id=\"series-" << s->css_class << "\" class=\"" << s->css_class << "\" data-points=\""
       << s->bytes.size() << "\" d=\"" << step_path(f, s->bytes) << "\"><title>" << escape(s->label)
       << "</title></path>\n";
  }
  if (!predicted.bytes.empty()) {
    const auto it = std::max_element(predicted.bytes.begin(), predicted.bytes.end());
    const double slot = static_cast<double>(it - predicted.bytes.begin()) + 0.5;
    const double y = f.y(static_cast<double>(*it) / kMiB);
    const bool right_half = f.x(slot) > f.left + f.plot_w() * 0.6;
    // The label sits low in the plot, where no curve goes (fixed occupancy keeps memory off zero), tied to
    // the peak by a thin leader line.
    const double y_label = f.height - f.bottom - 12;
    os << "<circle class=\"peak\" cx=\"" << fixed(f.x(slot), 1) << "\" cy=\"" << fixed(y, 1) << "\" r=\"4\"/>"
       << "<line class=\"phase\" x1=\"" << fixed(f.x(slot), 1) << "\" x2=\"" << fixed(f.x(slot), 1) << "\" y1=\""
       << fixed(y + 5, 1) << "\" y2=\"" << fixed(y_label - 14, 1) << "\"/>"
       << "<text class=\"halo\" x=\"" << fixed(f.x(slot) + (right_half ? 6 : -6), 1) << "\" y=\"" << fixed(y_label, 1)
       << "\" text-anchor=\"" << (right_half ? "end" : "start") << "\">predicted peak "
       << escape(format_bytes(*it)) << " (" << escape(plan.prediction.peak_at) << ")</text>\n";
  }
  // Legend (top, above the plot), one sample line per series in its own style.
  struct Entry {
    const char* css_class;
    std::string label;
  };
  std::vector<Entry> legend{{"measured", measured.label + ": peak " + format_bytes(profile.measured_peak_bytes)},
                            {"plan", predicted.label + ": peak " + format_bytes(plan.prediction.peak_bytes)}};
  if (trained)
    legend.push_back(
        {"trained", "training step " + std::to_string(trained->step) + ": peak " + format_bytes(trained->peak_bytes)});
  legend.push_back({"budget", "budget " + format_bytes(plan.budget_bytes)});
  double lx = f.left, ly = 22;  // a second row when the first is full
  for (const auto& e : legend) {
    const double w = 52 + 6.6 * static_cast<double>(e.label.size());
    if (lx > f.left && lx + w > f.width - f.right) {
      lx = f.left;
      ly += 18;
    }
    os << "<line class=\"" << e.css_class << "\" x1=\"" << fixed(lx, 1) << "\" x2=\"" << fixed(lx + 34, 1)
       << "\" y1=\"" << ly << "\" y2=\"" << ly << "\"/><text x=\"" << fixed(lx + 40, 1) << "\" y=\"" << ly + 4
       << "\">" << escape(e.label) << "</text>\n";
    lx += w;
  }
  os << "</svg>\n";
}

void write_summary(std::ostringstream& os, const StepProfile& profile, const Plan& plan) {
  auto row = [&](const std::string& k, const std::string& v) {
    os << "<dt>" << escape(k) << "</dt><dd>" << escape(v) << "</dd>\n";
  };
  os << "<dl class=\"summary\">\n";
  row("budget", format_bytes(plan.budget_bytes) + " = fixed occupancy " + format_bytes(plan.fixed_bytes) +
                    " + activation capacity " + format_bytes(plan.capacity_bytes));
  row("strategy", to_string(plan.strategy));
  row("measured peak, everything kept", format_bytes(profile.measured_peak_bytes));
  row("predicted peak, everything kept", format_bytes(plan.unconstrained_peak_bytes) +
                                             " (includes memory the profiled step did not hold, e.g. optimiser "
                                             "state created at the first optimiser step)");
  row("predicted peak, this plan", format_bytes(plan.prediction.peak_bytes) + " at " + plan.prediction.peak_at);
  row("feasible minimum", format_bytes(plan.minimum_peak_bytes));
  row("groups kept", std::to_string(plan.kept_groups) + " of " + std::to_string(plan.groups.size()) + " (" +
                         format_bytes(plan.kept_bytes) + ")");
  row("groups recomputed", std::to_string(plan.dropped_groups - plan.offloaded_groups) + " (" +
                               format_bytes(plan.dropped_bytes - plan.offloaded_bytes) + "), predicted " +
                               fixed(plan.prediction.recompute_ms, 2) + " ms of re-runs");
  if (plan.offload_costs)
    row("groups offloaded", std::to_string(plan.offloaded_groups) + " (" + format_bytes(plan.offloaded_bytes) +
                                "), predicted copy stall " + fixed(plan.prediction.offload_stall_ms, 2) + " ms");
  os << "</dl>\n";
}

void write_table(std::ostringstream& os, const StepProfile& profile, const Plan& plan) {
  os << "<h2 id=\"groups-title\">Saved groups (" << plan.groups.size()
     << "): one row per saved storage; click a column to sort</h2>\n"
     << "<table id=\"groups\" aria-labelledby=\"groups-title\"><thead><tr>"
     << "<th class=\"num\" data-key=\"storage\"><button type=\"button\">storage</button></th>"
     << "<th data-key=\"node-set\"><button type=\"button\">node set</button></th>"
     << "<th data-key=\"producer\"><button type=\"button\">producer</button></th>"
     << "<th class=\"num\" data-key=\"bytes\"><button type=\"button\">bytes</button></th>"
     << "<th data-key=\"decision\"><button type=\"button\">decision</button></th>"
     << "<th class=\"num\" data-key=\"recompute-ms\"><button type=\"button\">recompute ms</button></th>"
     << "<th class=\"num\" data-key=\"copy-deadline\"><button type=\"button\">copy deadline</button></th>"
     << "<th class=\"num\" data-key=\"prefetch\"><button type=\"button\">prefetch</button></th>"
     << "</tr></thead>\n<tbody>\n";
  for (const auto& g : plan.groups) {
    const char* decision = decision_of(g);
    const bool offloaded = g.decision == Decision::Offload;
    std::string producer = g.op + " #" + std::to_string(g.producer);
    if (g.producer >= 0 && static_cast<size_t>(g.producer) < profile.nodes.size() &&
        !profile.nodes[static_cast<size_t>(g.producer)].scope.empty())
      producer += " (" + profile.nodes[static_cast<size_t>(g.producer)].scope + ")";
    os << "<tr data-group=\"" << g.storage << "\">"
       << "<td class=\"num\" data-v=\"" << g.storage << "\">" << g.storage << "</td>"
       << "<td data-v=\"" << escape(g.node_set) << "\">" << escape(g.node_set) << "</td>"
       << "<td data-v=\"" << g.producer << "\">" << escape(producer) << "</td>"
       << "<td class=\"num\" data-v=\"" << g.bytes << "\">" << escape(format_bytes(g.bytes)) << "</td>"
       << "<td class=\"" << decision << "\" data-v=\"" << decision << "\">" << decision << "</td>"
       << "<td class=\"num\" data-v=\"" << fixed(g.recompute_ms, 4) << "\">" << fixed(g.recompute_ms, 3) << "</td>";
    if (offloaded) {
      os << "<td class=\"num\" data-v=\"" << g.deadline << "\">after f" << g.deadline << "</td>"
         << "<td class=\"num\" data-v=\"" << g.prefetch << "\">" << g.prefetch << " nodes</td>";
    } else {
      os << "<td class=\"num\" data-v=\"-1\">—</td><td class=\"num\" data-v=\"-1\">—</td>";
    }
    os << "</tr>\n";
  }
  os << "</tbody></table>\n";
}

}  // namespace

std::string plan_html(const StepProfile& profile, const Plan& plan, const std::string& title,
                      const MeasuredCurve* trained) {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
     << "<title>ration memory plan: " << escape(title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
     << "<h1>Memory plan: " << escape(title) << "</h1>\n"
     << "<p class=\"sub\">Device memory (everything the counting allocator sees except the dataset held in "
        "host memory) at every node boundary of one training step: each node's peak drawn across its slot.</p>\n";
  write_summary(os, profile, plan);
  write_chart(os, profile, plan, trained);
  os << "<p class=\"note\">The measured curve is the profiling step, which runs before the optimiser's first "
        "step; the plan's prediction also holds the optimiser state created at that step (its unconstrained "
        "prediction peaks at "
     << escape(format_bytes(plan.unconstrained_peak_bytes)) << ", the measurement at "
     << escape(format_bytes(profile.measured_peak_bytes)) << ").</p>\n";
  if (trained)
    os << "<p class=\"note\" id=\"trained-note\">The training step curve is step " << trained->step
       << " as it ran under the plan (recomputes inside the backward nodes that needed them). Its peak, "
       << escape(format_bytes(trained->peak_bytes)) << ", includes the optimiser update after backward, which "
       << "peaked at " << escape(format_bytes(trained->update_peak)) << ".</p>\n";
  write_table(os, profile, plan);
  os << "<script>" << kScript << "</script>\n</body></html>\n";
  return os.str();
}

void write_plan_html(const std::string& path, const std::string& what, const StepProfile& profile, const Plan& plan,
                     const std::string& title, const MeasuredCurve* trained) {
  const std::string page = plan_html(profile, plan, title, trained);
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    RATION_CHECK(out.good(), what, " '", path, "': cannot create '", tmp, "': ", std::strerror(errno),
                 " (expected a writable file path, e.g. plan.html)");
    out << page;
    out.flush();
    RATION_CHECK(out.good(), what, " '", path, "': write failed: ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    RATION_CHECK(false, what, " '", path, "': cannot rename the finished page into place: ", std::strerror(err));
  }
}

}  // namespace ration::memory
