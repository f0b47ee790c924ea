// memprobe.cpp — the counting ATen CPU allocator as a C library, so a Python peer (Debian's
// python3-torch loads the same libc10) is measured by exactly the same allocator as ration.
// Python: probe = ctypes.CDLL("build/bench/libration_memprobe.so"); probe.ration_memprobe_install()
#include "ration/base/allocator.h"

extern "C" {
void ration_memprobe_install() { ration::memory::install_counting_allocator(); }
long long ration_memprobe_current() { return ration::memory::current_bytes(); }
long long ration_memprobe_peak() { return ration::memory::stats().peak_bytes; }
void ration_memprobe_reset_peak() { ration::memory::reset_peak(); }
}
