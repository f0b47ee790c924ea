// ctr_split.h — the state of ctr's feature split (Ctr::Split), shared by ctr.cpp and ctr_split.cpp.
// Owns: the group, the placement and the last training lookup held until its gradients come back.
// Does not own: the placement and message functions (feature_split.h), the tables (the Ctr's PsClient).
#pragma once
#include <cstdint>
#include <vector>

#include "ration/distributed/world.h"
#include "ration/models/ctr.h"

namespace ration::models {

struct Ctr::Split {
  dist::World group;                 // the data-parallel ranks the tables are placed on
  std::vector<int> owner;            // per field: the rank holding its table
  std::vector<int64_t> owned;        // the fields this rank holds, ascending
  std::vector<int64_t> rows_x_dim;   // per field: the placement's weight
  // The last training lookup, until route_gradients() sends its gradients (every rank's, in lockstep):
  std::vector<Value> pooled;         // per field: this rank's pooled rows (B, D), leaves
  std::vector<FieldRows> served;     // per owned field: the rows pulled for every rank's bags of it
  std::vector<int64_t> samples;      // B_s of every rank in that lookup
  bool pending = false;
  int64_t step_bytes = 0, steps = 0;  // bytes training steps sent to other ranks, and those steps
};

}  // namespace ration::models
