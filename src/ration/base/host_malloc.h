// host_malloc.h — how much freed host memory the C library keeps between training steps.
// Owns: keep_freed_host_memory (glibc's trim and mmap thresholds, set once per process).
// Does not own: counting (allocator.h counts what tensors hold; nothing here changes a counted byte, so
//       budgets, profiles and plans are unaffected), the config key (train/trainer.cpp reads
//       train.malloc_keep_freed).
//
// Left alone, glibc returns the top of its heap to the system once more than a few tens of MiB are free
// and maps blocks above its (dynamic) threshold afresh, so a training step, which frees and re-allocates
// the same activations every step, page-faults much of its working set in again on every step (the cnn
// config: about 11,000 faults per step, a quarter of its CPU time; BENCHMARKS.md, "Host malloc
// (`train.malloc_keep_freed`)"). keep_freed_host_memory(n) keeps up to n bytes of freed heap
// (M_TRIM_THRESHOLD) and serves blocks up to min(n, 32 MiB) — 32 MiB is glibc's largest mmap threshold —
// from the heap (M_MMAP_THRESHOLD). The process's resident memory may then stay up to n above what
// tensors hold. Process-wide and one-way: glibc's dynamic thresholds cannot be turned back on.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ration::memory {

// Returns false where the C library refused or is not glibc (nothing changed then). Also switches the
// counting allocator's CPU blocks to host_block_alloc (below).
bool keep_freed_host_memory(int64_t bytes);

// CPU blocks for the counting allocator once keep_freed_host_memory has run: malloc(n + 63) aligned by
// hand to 64 bytes (c10's alignment), instead of c10's posix_memalign, whose freed blocks glibc 2.36
// reuses poorly (a heap of 4 x 12 MiB live blocks grows to ~260 MiB and keeps faulting fresh pages for
// ~10 steps; from malloc it is reused at once, with no fault). Before it has run (and in the PyTorch
// peer's memory probe, which never calls it), the counting allocator keeps c10's allocator.
bool host_blocks_from_malloc();
// Returns the aligned block; *raw receives what host_block_free takes.
void* host_block_alloc(std::size_t n, void** raw);
void host_block_free(void* raw);

}  // namespace ration::memory
