// openmp.h — how long ATen's OpenMP threads spin before they sleep, chosen before the OpenMP runtime loads.
// libgomp (the OpenMP runtime of Debian's libtorch, behind ATen's intra-op threads) makes a thread that
// waits at the end of a parallel region, or for the next one, spin for GOMP_SPINCOUNT iterations of a pause
// instruction before it sleeps: 300,000 by default, milliseconds on these CPUs. When other processes keep the
// cores busy, those spins take the CPU from the thread that still has work, and each parallel region waits
// for it: `ration train configs/cnn.toml` (2 threads, 2 vCPUs, load average ~9) ran 540-840 ms a step with
// the default and 150-240 ms with GOMP_SPINCOUNT=10000 (BENCHMARKS.md, "OpenMP's spin-wait"). A bound of
// 10,000 pauses still covers the gaps between one kernel and the next within a step (tens of microseconds).
// libgomp reads the setting once, when it loads, so applying it means starting the process again with the
// variable set, as base/blas.h does for OpenBLAS's core.
// Owns: the bounded spin count, who chose it, and the one re-execution that applies it.
// Does not own: thread counts (core/compute_threads.h), OpenBLAS's own threads and core (base/blas.h).
#pragma once
#include <string>

namespace ration::openmp {

// The spin count ration sets when the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT.
inline constexpr const char* kBoundedSpinCount = "10000";

// GOMP_SPINCOUNT in effect, "passive"/"active" when only OMP_WAIT_POLICY is set, "" for libgomp's default.
std::string spin_setting();
// Who chose it: "user" (set before ration started), "ration" (ration restarted itself with
// kBoundedSpinCount) or "runtime" (libgomp's default: the command ran one intra-op thread, or the restart
// failed).
std::string spin_chosen_by();

// Called by a command before it prints or starts anything, with the intra-op threads it will run: when
// threads > 1 and the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT, sets GOMP_SPINCOUNT to
// kBoundedSpinCount and re-executes /proc/self/exe with the same arguments (same process id;
// RATION_OMP_SELECTED marks the second start). Returns only when no restart happened (a failed one prints a
// warning and the process goes on with libgomp's default).
void bound_spin_wait(char** argv, int threads);

}  // namespace ration::openmp
