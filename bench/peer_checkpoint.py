#!/usr/bin/python3
"""PyTorch peer for bench_budget_curve: the same GPT (architecture, sizes, batch, dropout) trained one
step at a time with (a) plain autograd and (b) torch.utils.checkpoint on every block, as PyTorch users
do it. Peak memory is measured by ration's counting ATen allocator loaded through ctypes (the same
libc10 as ration), so both sides are measured identically. Run with Debian's /usr/bin/python3.

usage: peer_checkpoint.py --probe build/bench/libration_memprobe.so --n-layer 4 --n-head 4 --n-embd 128
         --block-size 128 --batch 16 --dropout 0.1 --steps 5 --threads 1
prints one JSON object per mode on stdout."""
import argparse
import ctypes
import json
import math
import os
import statistics
import time

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

probe = ctypes.CDLL(args.probe)
probe.ration_memprobe_current.restype = ctypes.c_longlong
probe.ration_memprobe_peak.restype = ctypes.c_longlong
probe.ration_memprobe_install()

import torch  # noqa: E402  (after the allocator is installed)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, c, h, p):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.p = p

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        att = F.dropout(att, self.p, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.proj(y), self.p, self.training)


class Block(nn.Module):
    def __init__(self, c, h, p):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.attn = Attention(c, h, p)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.p = p

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + F.dropout(self.mlp_proj(F.gelu(self.fc(self.ln2(x)))), self.p, self.training)


class GPT(nn.Module):
    def __init__(self, a, ckpt):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.n_embd)
        self.wpe = nn.Embedding(a.block_size, a.n_embd)
        self.blocks = nn.ModuleList([Block(a.n_embd, a.n_head, a.dropout) for _ in range(a.n_layer)])
        self.ln_f = nn.LayerNorm(a.n_embd)
        self.p = a.dropout
        self.ckpt = ckpt

    def forward(self, idx, targets):
        b, t = idx.shape
        x = F.dropout(self.wte(idx) + self.wpe(torch.arange(t)), self.p, self.training)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


tokens = torch.randint(0, args.vocab, (args.batch, args.block_size + 1))
x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
for mode in ("none", "per-block"):
    model = GPT(args, mode == "per-block")
    model.train()
    times, cpus, peaks = [], [], []
    for step in range(args.steps + 2):
        model.zero_grad(set_to_none=True)
        base = probe.ration_memprobe_current()
        probe.ration_memprobe_reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(x, y)
        loss.backward()
        ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (time.process_time() - c0) * 1e3
        peak = probe.ration_memprobe_peak() - base
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
