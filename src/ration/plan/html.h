// plan/html.h — the memory picture of a budget plan: one self-contained HTML page a person can open.
// Owns: rendering a measured StepProfile and the Plan made from it as HTML — an inline SVG chart of
//       device memory at every node boundary of forward and backward (measured with everything kept, the
//       plan's prediction and, from `ration train --html`, a training step measured under the plan:
//       MeasuredCurve) with the budget line, axis labels with units and a legend whose series stay
//       distinct in greyscale (dash patterns), then every saved group as a sortable table (node set,
//       producer, bytes, decision, recompute ms, copy deadline) — and writing that page to a file.
//       No network: no external script, style sheet, font or image; the page's only script is inline
//       (table sorting).
// Does not own: profiling (profile.h), planning (planner.h), the command line (cli/main.cpp).
#pragma once
#include <string>

#include "ration/plan/planner.h"
#include "ration/plan/profile.h"

namespace ration::memory {

// A training step measured while the plan ran: device memory per node slot (the high-water mark of each
// forward node, then of each backward node, recomputes included), and the step's peak, update included.
struct MeasuredCurve {
  int64_t step = 0;
  std::vector<int64_t> bytes;  // forward slots, then backward slots
  int64_t peak_bytes = 0;      // the step's measured peak (forward, backward and the optimiser update)
  int64_t update_peak = 0;     // high-water mark from the last backward node to the end of the update
};

// The page. `title` names the run (e.g. "configs/cnn.toml, budget 60 MiB"); it is escaped. `trained`: a
// measured training step to draw too (null: plan only).
std::string plan_html(const StepProfile& profile, const Plan& plan, const std::string& title,
                      const MeasuredCurve* trained = nullptr);

// Writes plan_html(...) to `path` through a temporary file renamed into place, so a reader never sees
// half a page. Errors name `what` (the flag or key that gave the path), the path and the reason.
void write_plan_html(const std::string& path, const std::string& what, const StepProfile& profile, const Plan& plan,
                     const std::string& title, const MeasuredCurve* trained = nullptr);

}  // namespace ration::memory
