"""seq_memory_peer.py - the PyTorch peer of bench/seq_memory.cpp: the same sequence models run over the
whole sequence at once (what a PyTorch user does), no grad, one thread. Peak memory is measured by ration's
counting ATen allocator loaded through ctypes (the same libc10 as ration), so both sides are measured
identically. Run with Debian's /usr/bin/python3.

usage: seq_memory_peer.py --probe build/bench/libration_memprobe.so --model lstm_lm --seq-len 10000
prints one JSON object: {"model", "seq_len", "peak_bytes", "seconds"} (peak above the parameters)."""
import argparse
import ctypes
import json
import math
import time

ap = argparse.ArgumentParser()
ap.add_argument("--probe", required=True)
ap.add_argument("--model", required=True, choices=["lstm_lm", "tcn_lm", "gpt_window", "gpt_full"])
ap.add_argument("--seq-len", type=int, required=True)
ap.add_argument("--window", type=int, default=64)
args = ap.parse_args()

probe = ctypes.CDLL(args.probe)
probe.ration_memprobe_current.restype = ctypes.c_longlong
probe.ration_memprobe_peak.restype = ctypes.c_longlong
probe.ration_memprobe_install()

import torch  # noqa: E402  (after the allocator is installed)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(1)
T = args.seq_len


class LSTMLM(nn.Module):  # configs/lstm_lm.toml: embed 64, 2 x LSTM 128, head
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, 64)
        self.lstm = nn.LSTM(64, 128, 2, batch_first=True)
        self.head = nn.Linear(128, 256)

    def forward(self, x):
        return self.head(self.lstm(self.embed(x))[0])


class Gated(nn.Module):
    def __init__(self, c, k, d):
        super().__init__()
        self.pad = (k - 1) * d
        self.conv = nn.Conv1d(c, 2 * c, k, dilation=d)
        self.out = nn.Linear(c, c)

    def forward(self, x):  # (B, T, C)
        y = self.conv(F.pad(x.transpose(1, 2), (self.pad, 0))).transpose(1, 2)
        a, b = y.chunk(2, -1)
        return x + self.out(torch.tanh(a) * torch.sigmoid(b))


class TCNLM(nn.Module):  # configs/tcn_lm.toml: embed 96, 6 gated blocks k 3, dilations 1..32
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, 96)
        self.blocks = nn.ModuleList([Gated(96, 3, 2 ** i) for i in range(6)])
        self.ln = nn.LayerNorm(96)
        self.head = nn.Linear(96, 256)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln(h))


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, 2)
        q, k, v = [t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.nh)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):  # configs/gpt.toml: 4 layers, 4 heads, 128 wide, block 128
    def __init__(self, block):
        super().__init__()
        self.block = block
        self.wte, self.wpe = nn.Embedding(256, 128), nn.Embedding(block, 128)
        self.blocks = nn.ModuleList([Block(128, 4) for _ in range(4)])
        self.ln = nn.LayerNorm(128)

    def forward(self, x, window):
        T = x.shape[1]
        pos = torch.arange(T) % self.block
        h = self.wte(x) + self.wpe(pos)
        ones = torch.ones(T, T, dtype=torch.bool)
        mask = ones.triu(1)
        if window > 0:
            mask = mask | ones.tril(-window - 1)
        for b in self.blocks:
            h = b(h, mask)
        return self.ln(h) @ self.wte.weight.t()


with torch.no_grad():
    if args.model == "lstm_lm":
        model, run = LSTMLM(), None
    elif args.model == "tcn_lm":
        model, run = TCNLM(), None
    else:
        window = args.window if args.model == "gpt_window" else 0
        model = GPT(128 if window else T)
    x = torch.randint(0, 256, (1, T))
    base = probe.ration_memprobe_current()
    probe.ration_memprobe_reset_peak()
    t0 = time.perf_counter()
    if args.model.startswith("gpt"):
        y = model(x, window)
    else:
        y = model(x)
    # bits per byte as the streamed side computes it
    loss = F.cross_entropy(y[0, :-1].double(), x[0, 1:], reduction="sum")
    seconds = time.perf_counter() - t0
    peak = probe.ration_memprobe_peak() - base
print(json.dumps({"model": args.model, "seq_len": T, "peak_bytes": peak, "seconds": seconds}))
