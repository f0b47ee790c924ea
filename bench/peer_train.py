#!/usr/bin/python3
"""PyTorch peer for bench_train_peer: the training loop a PyTorch 1.13 user writes for configs/<family>.toml
(mlp, cnn, gpt, lstm_lm, tcn_lm), timed the way `ration train` times its own loop. The models are
bench/peer_nets.py's (every bench script shares them); sizes, data, batch, dropout, optimiser (AdamW or
SGD-Nesterov), weight decay, clipping and the warm-up + cosine learning rate are read from the same TOML
file ration reads (Python 3.11's tomllib; --set k=v overrides as `ration train --set`).

Each iteration of the loop: draw a batch from the data in memory (text: nanoGPT's get_batch, random windows
of the file's bytes; Fashion-MNIST: the idx files decoded once, a shuffled epoch), set the step's learning
rate, forward, backward, clip_grad_norm_, optimiser step, zero_grad(set_to_none=True), loss.item(), and a
progress line every train.log_every steps, as ration prints (to stdout). "loop ms" is one iteration, wall
clock; the median leaves the first --warmup iterations out (ration's leaves out its first).

gpt only: --checkpoint per-block wraps every transformer block in torch.utils.checkpoint (non-reentrant);
--checkpoint attention wraps only each block's attention (ln1 -> qkv -> softmax -> proj), the selective
checkpointing of attention a user would write.

Memory: with --probe, the peak bytes above each step's pre-step baseline, counted by ration's counting ATen
allocator (libration_memprobe.so through bench/peer_probe.py: the same allocator and libc10 ration counts
with). The JSON names the OpenBLAS core the process runs (openblas_get_corename of the libopenblas mapped
into it) and OPENBLAS_CORETYPE if set. Denormals: left as they are (neither this peer nor ration calls
set_flush_denormal; both run with the CPU's default, denormals kept).

usage: peer_train.py --family gpt --steps 40 [--warmup 5] [--checkpoint none|per-block|attention] [--no-mkldnn]
         [--probe build/bench/libration_memprobe.so [--keep-freed 1073741824]] [--set train.batch_size=32 ...]
--keep-freed applies ration's host memory setting (train.malloc_keep_freed, base/host_malloc.h) in this process.
Threads: train.threads of the config (torch.set_num_threads); OMP_NUM_THREADS / OPENBLAS_NUM_THREADS come
from the environment (bench_train_peer sets them to the same count for both sides)."""
import argparse
import ctypes
import gzip
import json
import math
import os
import statistics
import sys
import time
import tomllib

import peer_probe

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--family", required=True, choices=["mlp", "cnn", "gpt", "lstm_lm", "tcn_lm"])
ap.add_argument("--config", default="", help="TOML file (default: configs/<family>.toml)")
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--checkpoint", default="none", choices=["none", "per-block", "attention"])
ap.add_argument("--probe", default="")
ap.add_argument("--no-mkldnn", action="store_true", help="turn oneDNN (mkldnn) off: ATen's own convolutions")
ap.add_argument("--keep-freed", type=int, default=0,
                help="bytes of freed heap glibc keeps, as ration's train.malloc_keep_freed (needs --probe; 0: glibc's own)")
ap.add_argument("--set", action="append", default=[], help="k=v override, as ration train --set")
args = ap.parse_args()

probe = peer_probe.install(args.probe)
keep_freed_applied = bool(probe and args.keep_freed > 0 and probe.keep_freed(args.keep_freed))

import torch  # noqa: E402  (after the allocator is installed)
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import peer_nets  # noqa: E402


def load_config():
    path = args.config or os.path.join(HERE, "..", "configs", args.family + ".toml")
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    for kv in args.set:
        key, value = kv.split("=", 1)
        section, name = key.split(".", 1)
        try:
            v = json.loads(value)
        except json.JSONDecodeError:
            v = value
        cfg.setdefault(section, {})[name] = v
    return cfg


cfg = load_config()
model_cfg, data_cfg, optim_cfg, train_cfg = (cfg.get(k, {}) for k in ("model", "data", "optim", "train"))
if args.no_mkldnn:
    torch.backends.mkldnn.enabled = False
threads = int(train_cfg.get("threads", 2))
torch.set_num_threads(threads)
torch.manual_seed(int(train_cfg.get("seed", 0)))
batch_size = int(train_cfg.get("batch_size", 64))
log_every = int(train_cfg.get("log_every", 10))


class AttentionCheckpointed(torch.nn.Module):
    """A Block whose attention half (ln1 -> attention) runs under torch.utils.checkpoint."""

    def __init__(self, block):
        super().__init__()
        self.b = block

    def forward(self, x, mask=None):
        b = self.b
        x = x + checkpoint(lambda y: b.attn(b.ln1(y), mask), x, use_reentrant=False)
        return x + F.dropout(b.mlp_proj(F.gelu(b.fc(b.ln2(x)))), b.p, b.training)


def build_model():
    f, m = args.family, model_cfg
    if f == "mlp":
        return peer_nets.MLP(m.get("hidden", [256, 128]), m.get("dropout", 0.0))
    if f == "cnn":
        return peer_nets.CNN(m.get("channels", [32, 64]), m.get("fc_hidden", 128), m.get("kernel_size", 3),
                             m.get("dropout", 0.0))
    if f == "gpt":
        model = peer_nets.GPT(m.get("vocab_size", 256), m["n_layer"], m["n_head"], m["n_embd"], m["block_size"],
                              m.get("dropout", 0.0), checkpoint_blocks=args.checkpoint == "per-block")
        if args.checkpoint == "attention":
            model.blocks = torch.nn.ModuleList(AttentionCheckpointed(b) for b in model.blocks)
        return model
    if f == "lstm_lm":
        return peer_nets.LSTMLM(m.get("vocab_size", 256), m["n_embd"], m["hidden_size"], m["n_layer"],
                                m.get("dropout", 0.0))
    return peer_nets.TCNLM(m.get("vocab_size", 256), m["n_embd"], m["n_layer"], m.get("kernel_size", 3))


def text_batches():
    """nanoGPT's get_batch: random windows of seq_len + 1 bytes of the file."""
    with open(data_cfg["files"], "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    t = int(data_cfg.get("seq_len", model_cfg.get("block_size", 128)))
    while True:
        ix = torch.randint(len(data) - t - 1, (batch_size,))
        w = torch.stack([data[i:i + t + 1] for i in ix.tolist()])
        yield w[:, :-1].contiguous(), w[:, 1:].contiguous()


def image_batches():
    """Fashion-MNIST from its idx files, decoded once; a shuffled epoch at a time, full batches."""
    d = data_cfg["dir"]
    with gzip.open(os.path.join(d, "train-images-idx3-ubyte.gz")) as f:
        images = torch.frombuffer(bytearray(f.read()[16:]), dtype=torch.uint8).view(-1, 1, 28, 28).float() / 255
    with gzip.open(os.path.join(d, "train-labels-idx1-ubyte.gz")) as f:
        labels = torch.frombuffer(bytearray(f.read()[8:]), dtype=torch.uint8).long()
    while True:
        perm = torch.randperm(len(labels))
        for i in range(0, len(perm) - batch_size + 1, batch_size):
            idx = perm[i:i + batch_size]
            yield images[idx], labels[idx]


def build_optimizer(model):
    name = optim_cfg.get("name", "adamw")
    wd = float(optim_cfg.get("weight_decay", 0.0))
    lr = float(optim_cfg["lr"])
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=float(optim_cfg.get("momentum", 0.9)),
                               nesterov=bool(optim_cfg.get("nesterov", False)), weight_decay=wd)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)


def learning_rate(step, total):
    """Linear warm-up, then cosine from optim.lr to optim.min_lr over the run (ration's WarmupCosine)."""
    lr = float(optim_cfg["lr"])
    if optim_cfg.get("schedule", "cosine") == "constant":
        return lr
    min_lr = float(optim_cfg.get("min_lr", lr * 0.1))
    warm = min(int(optim_cfg.get("warmup_steps", 0)), total)
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def openblas_core():
    """The core of the libopenblas mapped into this process (torch loads it through libblas.so.3)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "openblas" in line and ".so" in line.split()[-1]}
    for p in sorted(paths):
        try:
            lib = ctypes.CDLL(p)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode().strip()
        except (OSError, AttributeError):
            continue
    return ""


model = build_model()
model.train()
opt = build_optimizer(model)
batches = image_batches() if data_cfg.get("kind") == "fashion_mnist" else text_batches()
clip = float(optim_cfg.get("clip_grad_norm", 0.0))
total = args.warmup + args.steps
loop_ms, step_ms, peaks = [], [], []
for step in range(total):
    t0 = time.perf_counter()
    x, y = next(batches)
    for g in opt.param_groups:
        g["lr"] = learning_rate(step, total)
    if probe:
        probe.start()
    t1 = time.perf_counter()
    loss = peer_nets.loss(model, x, y)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()
    t2 = time.perf_counter()
    if probe:
        peaks.append(probe.peak_above())
    del loss
    if (step + 1) % log_every == 0 or step + 1 == total:
        print(f"step {step + 1}/{total} | loss {value:.4f} | lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    t3 = time.perf_counter()
    if step >= args.warmup:
        loop_ms.append((t3 - t0) * 1e3)
        step_ms.append((t2 - t1) * 1e3)

out = {"side": "pytorch", "version": torch.__version__, "family": args.family, "checkpoint": args.checkpoint,
       "steps": args.steps, "warmup": args.warmup, "loop_ms_median": statistics.median(loop_ms),
       "step_ms_median": statistics.median(step_ms), "loop_ms": loop_ms,
       "threads": {"torch.get_num_threads": torch.get_num_threads(),
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
                   "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "")},
       "blas": {"core": openblas_core(), "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "")},
       "malloc_keep_freed": args.keep_freed if keep_freed_applied else 0,
       "openmp": {"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", ""), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "")},
       "mkldnn": {"available": torch.backends.mkldnn.is_available(), "enabled": torch.backends.mkldnn.enabled}, "flush_denormal": False}
if probe:
    out["peak_above_baseline_bytes"] = max(peaks)
sys.stdout.write(json.dumps(out) + "\n")
