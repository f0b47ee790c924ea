#!/usr/bin/python3
"""trace_peer_torch.py — the PyTorch peer of bench_trace_overhead: what torch.profiler costs a step.

Owns: the same training step as configs/cnn.toml's model (bench/peer_nets.py's CNN, the models every
bench script shares: two conv 3x3 -> batch norm -> ReLU -> 2x2 max pool blocks of 32 and 64 channels, fc
128, dropout 0.25, 10 classes; AdamW; one fixed random batch of 28x28 images) in PyTorch 1.13, timed with
the profiler off and on (torch.profiler.profile with CPU activity and profile_memory=True, as a user
recording a memory timeline would), alternating and swapping order every repetition after warm-up steps;
the time to export one profiled step as a Chrome trace.
Does not own ration's side (bench/trace_overhead.cpp runs this script and prints both).

usage: trace_peer_torch.py [--reps R] [--warmup W] [--batch B] [--threads T] [--out FILE.json]
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import peer_nets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = peer_nets.CNN()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(a.batch, 1, 28, 28), torch.randint(0, 10, (a.batch,))

    def step():
        loss = peer_nets.loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed(profiled):
        t0 = time.perf_counter()
        if profiled:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
        else:
            prof = None
            step()
        return (time.perf_counter() - t0) * 1e3, prof

    for _ in range(a.warmup):
        step()
    _, prof = timed(True)
    path = os.path.join(tempfile.gettempdir(), "ration-torch-trace.json")
    t0 = time.perf_counter()
    prof.export_chrome_trace(path)
    export_ms = (time.perf_counter() - t0) * 1e3
    trace_bytes = os.path.getsize(path)
    os.remove(path)
    off, on, ratio = [], [], []
    for r in range(a.reps):
        if r % 2 == 0:
            o, _ = timed(False)
            p, _ = timed(True)
        else:
            p, _ = timed(True)
            o, _ = timed(False)
        off.append(o)
        on.append(p)
        ratio.append(p / o)
    res = {"torch": torch.__version__, "threads": a.threads, "batch": a.batch, "repetitions": a.reps,
           "off_ms_median": statistics.median(off), "profiled_ms_median": statistics.median(on),
           "profiled_over_off_median": statistics.median(ratio), "export_ms": export_ms,
           "trace_bytes": trace_bytes, "off_ms": off, "profiled_ms": on}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, list)}))


if __name__ == "__main__":
    main()
