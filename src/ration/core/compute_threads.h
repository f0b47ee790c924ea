// compute_threads.h — one setting for the threads a step's kernels run on.
// Owns: applying `train.threads` to ATen's intra-op pool AND to the BLAS library's own pool together
//       (Debian's libtorch calls OpenBLAS, whose pthread pool ignores at::set_num_threads: with only ATen
//       set to 1, matrix products still run on every core), and reporting what is in effect.
// Does not own: the config key (train/trainer.cpp reads train.threads) or inter-op threads.
#pragma once
#include <string>

namespace ration {

struct ComputeThreads {
  int aten = 0;     // at::get_num_threads()
  int blas = 0;     // openblas_get_num_threads(), or -1 when the process has no OpenBLAS
  std::string blas_library;  // "openblas" or "none found"
};

// Set ATen's intra-op threads and OpenBLAS's threads (found with dlsym in the running process, so a build
// against another BLAS still links) to n >= 1.
void set_compute_threads(int n);
ComputeThreads compute_threads();

}  // namespace ration
