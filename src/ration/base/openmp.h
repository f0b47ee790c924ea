// openmp.h — how long ATen's OpenMP threads spin before they sleep, chosen before the OpenMP runtime loads.
// libgomp (the OpenMP runtime of Debian's libtorch, behind ATen's intra-op threads) makes a thread that
// waits at the end of a parallel region, or for the next one, spin for GOMP_SPINCOUNT iterations of a pause
// instruction before it sleeps: 300,000 by default, milliseconds on these CPUs. When other processes keep the
// cores busy, those spins take the CPU from the thread that still has work, and each parallel region waits
// for it: `ration train configs/cnn.toml` (2 threads, 2 vCPUs, load average ~9) ran 540-840 ms a step with
// the default and 150-240 ms with GOMP_SPINCOUNT=10000 (BENCHMARKS.md, "OpenMP's spin-wait"). A bound of
// 10,000 pauses still covers the gaps between one kernel and the next within a step (tens of microseconds).
// On cores nothing else uses the default is faster (a thread that sleeps pays a wake-up per parallel region:
// an imported 2-layer LSTM, 64 small cells a step, ran 35 ms a step bounded and 26 ms with the default), so
// ration bounds the spin only when other work keeps the cores it needs busy, measured at start.
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
// kBoundedSpinCount) or "runtime" (libgomp's default: the command ran one intra-op thread, the cores were
// free, or the restart failed).
std::string spin_chosen_by();
// How busy other work kept the cores when bound_spin_wait decided (e.g. "1.84 of 2 cores busy"), or "".
std::string busy_at_start();

// Cores kept busy by other processes over `ms` milliseconds (/proc/stat: user, system, irq, softirq and steal
// time of all CPUs; time of niced processes counts as free, since they yield to this one), or -1 when it
// cannot be read. RATION_CORES_BUSY=N stands for the measurement (tests).
double busy_cores(int ms = 100);

// Called by a command before it prints or starts anything, with the intra-op threads it will run: when
// threads > 1, the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT, and other work keeps busy more
// than (cores - threads + 0.5) cores, sets GOMP_SPINCOUNT to kBoundedSpinCount and re-executes
// /proc/self/exe with the same arguments (same process id; RATION_OMP_SELECTED marks the second start).
// Returns only when no restart happened (a failed one prints a warning and the process goes on with
// libgomp's default).
void bound_spin_wait(char** argv, int threads);

}  // namespace ration::openmp
