#!/usr/bin/python3
"""PyTorch peer for bench_torchscript_peer: the eager PyTorch training loop of the SAME module that
scripts/export_model.py exported for ration (the nn.Module itself, built by export_model.py's own
build_model with the same seed, so the same weights; not the TorchScript one), on the same data file
(train.pt, {"inputs": x or (x1, x2, ...), "target": y}), timed the way `ration train` times its loop.

Each iteration: the next batch of a shuffled epoch (index_select of every input and the target), the step's
learning rate (ration's defaults: cosine from --lr to --lr / 10, no warm-up), forward, cross entropy,
backward, AdamW step (weight decay 0.01, ration's default), zero_grad(set_to_none=True), loss.item(), and a
progress line every 10 steps (ration's train.log_every default). "loop ms" is one iteration, wall clock; the
median leaves out the first --warmup iterations (ration's leaves out its first).

--checkpoint per-block wraps every natural block in torch.utils.checkpoint (non-reentrant): torchvision
ResNet's residual blocks (layer1.0 ... layer4.1), and the transformer layers of a module with a `layers`
ModuleList (tests/torchscript/models.py's BertEncoder). Other modules have no natural blocks: an error.

Memory (--probe): the peak bytes above each step's pre-step baseline, by ration's counting ATen allocator
(libration_memprobe.so through bench/peer_probe.py). Denormals are left as they are (no set_flush_denormal,
as in ration). Threads: --threads for torch.set_num_threads; OMP_NUM_THREADS / OPENBLAS_NUM_THREADS and
OPENBLAS_CORETYPE come from the environment (bench_torchscript_peer sets them as for ration).

usage: peer_torchscript.py (--file F --name N [--kwargs K] | --torchvision NAME) --data train.pt
         [--batch 16] [--steps 10] [--warmup 1] [--threads 2] [--lr 1e-3] [--seed 0]
         [--checkpoint none|per-block] [--probe build/bench/libration_memprobe.so]"""
import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time

import peer_probe

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--file", default="")
ap.add_argument("--name", default="")
ap.add_argument("--kwargs", default="")
ap.add_argument("--torchvision", default="")
ap.add_argument("--num-classes", type=int, default=10)
ap.add_argument("--data", required=True)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--checkpoint", default="none", choices=["none", "per-block"])
ap.add_argument("--probe", default="")
args = ap.parse_args()

probe = peer_probe.install(args.probe)

import torch  # noqa: E402  (after the allocator is installed)
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


def export_module():
    """scripts/export_model.py, for its build_model (the module exactly as it was exported)."""
    path = os.path.join(HERE, "..", "scripts", "export_model.py")
    spec = importlib.util.spec_from_file_location("export_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Checkpointed(torch.nn.Module):
    """A block whose forward runs under torch.utils.checkpoint (its activations recomputed in backward)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, *xs):
        return checkpoint(self.block, *xs, use_reentrant=False)


def checkpoint_blocks(model):
    """Wraps each natural block; returns how many were wrapped."""
    wrapped = 0
    for stage in ("layer1", "layer2", "layer3", "layer4"):  # torchvision ResNet
        seq = getattr(model, stage, None)
        if isinstance(seq, torch.nn.Sequential):
            for i in range(len(seq)):
                seq[i] = Checkpointed(seq[i])
                wrapped += 1
    layers = getattr(model, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):  # BertEncoder's transformer layers
        for i in range(len(layers)):
            layers[i] = Checkpointed(layers[i])
            wrapped += 1
    if wrapped == 0:
        sys.exit("peer_torchscript: --checkpoint per-block: this module has no natural blocks (ResNet stages, layers)")
    return wrapped


def batches(inputs, target):
    """Shuffled epochs, full batches of every input and the target at the same items."""
    n = target.size(0)
    while True:
        perm = torch.randperm(n)
        for i in range(0, n - args.batch + 1, args.batch):
            idx = perm[i:i + args.batch]
            yield [x.index_select(0, idx) for x in inputs], target.index_select(0, idx)


def learning_rate(step, total):
    """ration's default schedule: cosine from lr to lr / 10 over the run, no warm-up."""
    min_lr = args.lr * 0.1
    return min_lr + 0.5 * (args.lr - min_lr) * (1 + math.cos(math.pi * step / max(1, total)))


torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)  # as export_model.py: the same initial weights
model = export_module().build_model(argparse.Namespace(kwargs=args.kwargs, torchvision=args.torchvision,
                                                       num_classes=args.num_classes, file=args.file, name=args.name))
blocks = checkpoint_blocks(model) if args.checkpoint == "per-block" else 0
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
data = torch.load(args.data)
inputs = list(data["inputs"]) if isinstance(data["inputs"], (list, tuple)) else [data["inputs"]]
source = batches(inputs, data["target"])
total = args.warmup + args.steps
loop_ms, step_ms, peaks = [], [], []
for step in range(total):
    t0 = time.perf_counter()
    xs, y = next(source)
    for g in opt.param_groups:
        g["lr"] = learning_rate(step, total)
    if probe:
        probe.start()
    t1 = time.perf_counter()
    loss = F.cross_entropy(model(*xs), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()
    t2 = time.perf_counter()
    if probe:
        peaks.append(probe.peak_above())
    del loss
    if (step + 1) % 10 == 0 or step + 1 == total:
        print(f"step {step + 1}/{total} | loss {value:.4f} | lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    t3 = time.perf_counter()
    if step >= args.warmup:
        loop_ms.append((t3 - t0) * 1e3)
        step_ms.append((t2 - t1) * 1e3)

out = {"side": "pytorch", "version": torch.__version__, "checkpoint": args.checkpoint, "blocks": blocks,
       "steps": args.steps, "warmup": args.warmup, "loop_ms_median": statistics.median(loop_ms),
       "step_ms_median": statistics.median(step_ms),
       "threads": {"torch.get_num_threads": torch.get_num_threads(),
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
                   "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "")},
       "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", ""), "flush_denormal": False}
if probe:
    out["peak_above_baseline_bytes"] = max(peaks)
sys.stdout.write(json.dumps(out) + "\n")
