"""peer_probe.py - ration's counting ATen allocator (libration_memprobe.so, built beside the benches) in a
PyTorch peer, through ctypes: the same allocator and libc10 ration measures itself with, so both sides are
measured identically.

install() must run before `import torch` (the allocator has to be in place before torch allocates), so this
module does not import torch; a peer imports torch and peer_nets after it:

    probe = peer_probe.install(args.probe)   # None when the path is empty
    import torch
    probe.start(); ...; probe.peak_above()
"""
import ctypes


class Probe:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.ration_memprobe_current.restype = ctypes.c_longlong
        lib.ration_memprobe_peak.restype = ctypes.c_longlong
        lib.ration_memprobe_install()
        self.lib = lib
        self.base = 0

    def keep_freed(self, nbytes):
        """ration's train.malloc_keep_freed in this process (base/host_malloc.h); True when glibc took it."""
        return bool(self.lib.ration_memprobe_keep_freed(ctypes.c_longlong(nbytes)))

    def start(self):
        """The baseline is what is live now; the peak starts again from it."""
        self.base = self.lib.ration_memprobe_current()
        self.lib.ration_memprobe_reset_peak()

    def peak_above(self):
        """Peak bytes since start() above its baseline."""
        return self.lib.ration_memprobe_peak() - self.base


def install(path):
    """Loads and installs the probe at `path`; None when `path` is empty."""
    return Probe(path) if path else None
