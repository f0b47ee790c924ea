// compute_threads.cpp — see compute_threads.h.
#include "ration/core/compute_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include "ration/base/check.h"

namespace ration {
namespace {
using SetThreads = void (*)(int);
using GetThreads = int (*)();

SetThreads blas_setter() {
  static const SetThreads f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return f;
}
GetThreads blas_getter() {
  static const GetThreads f = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return f;
}
}  // namespace

void set_compute_threads(int n) {
  RATION_CHECK(n >= 1, "compute threads (train.threads) must be >= 1; got ", n);
  at::set_num_threads(n);
  if (SetThreads set = blas_setter()) set(n);
}

ComputeThreads compute_threads() {
  ComputeThreads t;
  t.aten = at::get_num_threads();
  if (GetThreads get = blas_getter()) {
    t.blas = get();
    t.blas_library = "openblas";
  } else {
    t.blas = -1;
    t.blas_library = "none found";
  }
  return t;
}

}  // namespace ration
