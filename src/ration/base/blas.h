// blas.h — which BLAS kernels this process runs, and choosing them when the library guessed badly.
// Debian's OpenBLAS is built for many CPUs and picks its kernels ("core") at load time from the CPU it
// recognises; on a CPU it does not know it falls back to a generic core (e.g. "Prescott": SSE3 only),
// which leaves AVX2 / AVX-512 unused and makes every matmul several times slower (docs/ARCHITECTURE.md,
// BENCHMARKS.md "BLAS kernels"). OpenBLAS only reads its choice (OPENBLAS_CORETYPE) when it loads, so the
// remedy is to start the process again with the variable set.
// Owns: reading OpenBLAS's core and thread count (looked up at run time: absent when ATen uses another
//       BLAS), the CPU's vector features, the best core for them, and select_blas_core (one re-execution).
// Does not own: ATen's thread settings (core/compute_threads).
#pragma once
#include <string>

namespace ration::blas {

// OpenBLAS's core name ("SkylakeX", "Haswell", "Prescott", ...), or "" when the BLAS is not OpenBLAS.
std::string core();
// OpenBLAS's thread count, or 0 when the BLAS is not OpenBLAS.
int threads();
// The best OpenBLAS core for this CPU's vector units: "SkylakeX" (AVX-512 F/BW/VL/DQ), "Haswell" (AVX2 +
// FMA), or "" (nothing better than the library's own choice is known).
std::string best_core_for_cpu();
// Whether `core` leaves this CPU's vector units unused: a core older than AVX2 on a CPU with AVX2.
bool leaves_vector_units_unused(const std::string& core);

// Who chose the core: "user" (OPENBLAS_CORETYPE was set before ration started), "ration" (ration
// restarted itself with the best core), or "library" (OpenBLAS's own pick, not generic).
std::string chosen_by();

// Called first thing in main: when OpenBLAS picked a core that leaves vector units unused and the user
// did not set OPENBLAS_CORETYPE, sets it to best_core_for_cpu() and re-executes /proc/self/exe with the
// same arguments (once: RATION_BLAS_SELECTED marks the second start). Returns only when no restart
// happened (or the restart failed: then a warning is printed and the process goes on as it is).
// RATION_BLAS_PRETEND_GENERIC=1 (a test aid) treats the library's pick as generic.
void select_core(char** argv);

}  // namespace ration::blas
