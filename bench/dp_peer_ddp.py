#!/usr/bin/python3
"""PyTorch DDP peer for bench_dp_scaling: the same CNN / GPT (bench/peer_nets.py, the models every bench
script shares, with configs/cnn.toml's and configs/gpt.toml's sizes; per-rank batch, AdamW, gradient
clipping) trained with torch.nn.parallel.DistributedDataParallel over Gloo, N processes with one thread
each, with and without DDP's fp16 compression hook, as a PyTorch user would. Inputs are random
tensors of the real shapes (this measures step time, not learning). Run with Debian's /usr/bin/python3.

usage: dp_peer_ddp.py --model cnn|gpt --nproc 2 --batch 64 --steps 30 [--hook none|fp16]
prints one JSON object: step_ms_median (forward + backward + all-reduce + optimiser step), per rank 0."""
import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import peer_nets


def worker(rank, a, port, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    torch.manual_seed(0)
    model = peer_nets.CNN() if a.model == "cnn" else peer_nets.GPT()
    ddp = DDP(model) if a.nproc > 1 else model
    if a.hook == "fp16" and a.nproc > 1:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    if a.model == "cnn":
        x, y = torch.randn(a.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (a.batch,), generator=g)
    else:
        t = torch.randint(0, 256, (a.batch, 129), generator=g)
        x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()
    times = []
    for step in range(a.steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        peer_nets.loss(ddp, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0 if a.model == "cnn" else 1.0)
        opt.step()
        if step >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        out.put(statistics.median(times))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["cnn", "gpt"], required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hook", choices=["none", "fp16"], default="none")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, port, q)) for r in range(a.nproc)]
    for p in procs:
        p.start()
    ms = q.get()
    for p in procs:
        p.join()
    print(json.dumps({"peer": "pytorch " + torch.__version__ + " DDP gloo", "model": a.model, "nproc": a.nproc,
                      "batch_per_rank": a.batch, "hook": a.hook, "step_ms_median": ms}))


if __name__ == "__main__":
    main()
