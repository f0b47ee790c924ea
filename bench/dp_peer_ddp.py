#!/usr/bin/python3
"""PyTorch DDP peer for bench_dp_scaling: the same CNN / GPT (architecture, sizes, per-rank batch, AdamW,
gradient clipping) trained with torch.nn.parallel.DistributedDataParallel over Gloo, N processes with one
thread each, with and without DDP's fp16 compression hook, as a PyTorch user would. Inputs are random
tensors of the real shapes (this measures step time, not learning). Run with Debian's /usr/bin/python3.

usage: dp_peer_ddp.py --model cnn|gpt --nproc 2 --batch 64 --steps 30 [--hook none|fp16]
prints one JSON object: step_ms_median (forward + backward + all-reduce + optimiser step), per rank 0."""
import argparse
import json
import math
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


class ConvBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 1, 1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)


class CNN(nn.Module):  # configs/cnn.toml: channels [32, 64], fc_hidden 128, dropout 0.25
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(ConvBlock(1, 32), ConvBlock(32, 64))
        self.fc = nn.Linear(64 * 7 * 7, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x, y):
        h = F.dropout(F.relu(self.fc(self.blocks(x).flatten(1))), 0.25, self.training)
        return F.cross_entropy(self.out(h), y)


class Block(nn.Module):  # configs/gpt.toml: n_layer 4, n_head 4, n_embd 128, block 128, dropout 0.1
    def __init__(self, c, h, p):
        super().__init__()
        self.h, self.p = h, p
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def attn(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        y = (F.dropout(att, self.p, self.training) @ v).transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.proj(y), self.p, self.training)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + F.dropout(self.mlp_proj(F.gelu(self.fc(self.ln2(x)))), self.p, self.training)


class GPT(nn.Module):
    def __init__(self, vocab=256, block=128, c=128, h=4, layers=4, p=0.1):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.blocks = nn.ModuleList([Block(c, h, p) for _ in range(layers)])
        self.ln_f, self.p = nn.LayerNorm(c), p

    def forward(self, idx, targets):
        x = F.dropout(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])), self.p, self.training)
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def worker(rank, a, port, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    torch.manual_seed(0)
    model = CNN() if a.model == "cnn" else GPT()
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
        ddp(x, y).backward()
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
