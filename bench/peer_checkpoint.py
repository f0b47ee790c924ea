#!/usr/bin/python3
"""PyTorch peer for bench_budget_curve: the same GPT (architecture, sizes, batch, dropout; bench/peer_nets.py's,
the models every bench script shares) trained one full step at a time (forward, backward, clip to 1.0, AdamW
as configs/gpt.toml, zero_grad) with (a) plain autograd and (b) torch.utils.checkpoint on every block, as
PyTorch users do it. Its peaks are what bench_budget_curve compares; the time of `ration train` against a
PyTorch training loop is bench_train_peer's (bench/peer_train.py). Peak memory is measured by ration's counting
ATen allocator loaded through ctypes (bench/peer_probe.py: the same libc10 as ration), so both sides are
measured identically. Run with Debian's /usr/bin/python3.

usage: peer_checkpoint.py --probe build/bench/libration_memprobe.so --n-layer 4 --n-head 4 --n-embd 128
         --block-size 128 --batch 16 --dropout 0.1 --steps 5 --threads 1
prints one JSON object per mode on stdout."""
import argparse
import json
import os
import statistics
import time

import peer_probe

ap = argparse.ArgumentParser()
ap.add_argument("--probe", required=True)
ap.add_argument("--n-layer", type=int, default=4)
ap.add_argument("--n-head", type=int, default=4)
ap.add_argument("--n-embd", type=int, default=128)
ap.add_argument("--block-size", type=int, default=128)
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--dropout", type=float, default=0.1)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--threads", type=int, default=1)
args = ap.parse_args()

probe = peer_probe.install(args.probe)

import torch  # noqa: E402  (after the allocator is installed)
import peer_nets  # noqa: E402  (the models, defined once for every bench script)

torch.set_num_threads(args.threads)
torch.manual_seed(0)

tokens = torch.randint(0, args.vocab, (args.batch, args.block_size + 1))
x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
for mode in ("none", "per-block"):
    model = peer_nets.GPT(args.vocab, args.n_layer, args.n_head, args.n_embd, args.block_size, args.dropout,
                          checkpoint_blocks=mode == "per-block")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    times, cpus, peaks = [], [], []
    for step in range(args.steps + 2):
        model.zero_grad(set_to_none=True)
        probe.start()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = peer_nets.loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (time.process_time() - c0) * 1e3
        peak = probe.peak_above()
        del loss
        if step >= 2:
            times.append(ms)
            cpus.append(cpu_ms)
            peaks.append(peak)
    # Wall and CPU (process) time both: OpenBLAS keeps its own pool (OPENBLAS_NUM_THREADS, default: every
    # core) whatever torch.set_num_threads says, so CPU time can be a multiple of wall time; the caller
    # must set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS as for ration (bench_peer does).
    print(json.dumps({"peer": "pytorch " + torch.__version__, "mode": mode, "step_ms_median": statistics.median(times),
                      "step_cpu_ms_median": statistics.median(cpus), "step_ms": times, "step_cpu_ms": cpus,
                      "threads": {"torch.get_num_threads": torch.get_num_threads(),
                                  "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)"),
                                  "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "(unset: every core)")},
                      "peak_above_baseline_bytes": max(peaks)}))
