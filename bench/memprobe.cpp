// memprobe.cpp — the counting ATen CPU allocator as a C library, so a Python peer (Debian's
// python3-torch loads the same libc10) is measured by exactly the same allocator as ration.
// Python: probe = ctypes.CDLL("build/bench/libration_memprobe.so"); probe.ration_memprobe_install()
#include "ration/base/allocator.h"
#include "ration/base/host_malloc.h"

extern "C" {
void ration_memprobe_install() { ration::memory::install_counting_allocator(); }
// ration's host memory setting (train.malloc_keep_freed): glibc keeps `bytes` of freed heap; 1 when applied.
int ration_memprobe_keep_freed(long long bytes) { return ration::memory::keep_freed_host_memory(bytes) ? 1 : 0; }
long long ration_memprobe_current() { return ration::memory::current_bytes(); }
long long ration_memprobe_peak() { return ration::memory::stats().peak_bytes; }
void ration_memprobe_reset_peak() { ration::memory::reset_peak(); }
}
