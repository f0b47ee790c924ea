#!/usr/bin/python3
"""PyTorch peer for bench_peer: the model families of configs/*.toml (mlp, cnn, gpt, lstm_lm) written as a
PyTorch 1.13 user would write them (bench/peer_nets.py, the models every bench script shares), with the
same sizes, batch, dropout, optimiser (the config's: AdamW or SGD-Nesterov) and gradient clipping as
ration's models. One process times one family: `--steps` training steps (forward + backward + clip +
optimiser + zero_grad) on a fixed batch after `--warmup` steps, and prints one JSON object: median wall
and CPU (process) ms, the threads it ran with, and (with --probe) the peak bytes above the pre-step baseline
measured by ration's counting allocator (libration_memprobe.so through bench/peer_probe.py, the same
allocator ration measures itself with).

Checkpointing (torch.utils.checkpoint per block, attention only) against `ration train --memory-budget`
is bench/peer_train.py's (bench_train_peer), which times the whole training loop.
--profile-ops: one extra profiled step under torch.autograd.profiler; the per-op self-CPU table goes into
the JSON ("ops": name -> {calls, self_ms}).

Thread settings come from the environment (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, set by bench_peer for
both sides) and --threads (torch.set_num_threads); the JSON echoes all three.

usage: peer_models.py --family gpt --threads 1 --steps 20 [--probe SO]
         [--set model.n_layer=4 ...]   (sizes default to configs/<family>.toml's)"""
import argparse
import json
import os
import statistics
import time

import peer_probe

ap = argparse.ArgumentParser()
ap.add_argument("--family", required=True, choices=["mlp", "cnn", "gpt", "lstm_lm"])
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--probe", default="")
ap.add_argument("--profile-ops", action="store_true")
ap.add_argument("--config", default="", help="JSON object of the config values bench_peer read (sizes)")
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
args = ap.parse_args()

probe = peer_probe.install(args.probe)

import torch  # noqa: E402  (after the allocator is installed)
import peer_nets  # noqa: E402  (the models, defined once for every bench script)

torch.set_num_threads(args.threads)
torch.manual_seed(0)

# Defaults = configs/<family>.toml; bench_peer passes the values it read (--config) so both sides agree.
DEFAULTS = {
    "mlp": {"hidden": [256, 128], "dropout": 0.1, "batch": 128, "optim": "sgd", "lr": 0.05, "momentum": 0.9,
            "nesterov": True, "weight_decay": 0.0005, "clip": 0.0},
    "cnn": {"channels": [32, 64], "fc_hidden": 128, "kernel_size": 3, "dropout": 0.25, "batch": 128, "optim": "adamw",
            "lr": 0.002, "weight_decay": 0.0001, "clip": 5.0},
    "gpt": {"vocab": 256, "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "dropout": 0.1, "batch": 16,
            "optim": "adamw", "lr": 0.001, "weight_decay": 0.1, "clip": 1.0},
    "lstm_lm": {"vocab": 256, "n_embd": 64, "hidden_size": 128, "n_layer": 2, "dropout": 0.0, "seq_len": 64,
                "batch": 16, "optim": "adamw", "lr": 0.003, "weight_decay": 0.0, "clip": 1.0},
}
cfg = dict(DEFAULTS[args.family])
if args.config:
    cfg.update(json.loads(args.config))


def build():
    f = args.family
    if f == "mlp":
        model = peer_nets.MLP(cfg["hidden"], cfg["dropout"])
        batch = (torch.rand(cfg["batch"], 1, 28, 28), torch.randint(0, 10, (cfg["batch"],)))
    elif f == "cnn":
        model = peer_nets.CNN(cfg["channels"], cfg["fc_hidden"], cfg["kernel_size"], cfg["dropout"])
        batch = (torch.rand(cfg["batch"], 1, 28, 28), torch.randint(0, 10, (cfg["batch"],)))
    elif f == "gpt":
        model = peer_nets.GPT(cfg["vocab"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"],
                              cfg["dropout"])
        tok = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["block_size"] + 1))
        batch = (tok[:, :-1].contiguous(), tok[:, 1:].contiguous())
    else:
        model = peer_nets.LSTMLM(cfg["vocab"], cfg["n_embd"], cfg["hidden_size"], cfg["n_layer"], cfg["dropout"])
        tok = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"] + 1))
        batch = (tok[:, :-1].contiguous(), tok[:, 1:].contiguous())
    if cfg["optim"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg.get("momentum", 0.9),
                              nesterov=cfg.get("nesterov", False), weight_decay=cfg["weight_decay"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    return model, batch, opt


model, batch, opt = build()
gpu = args.device == "cuda"
if gpu:
    # Parameters move before the optimiser's state exists (AdamW creates it on the first step).
    model.to("cuda")
    batch = tuple(t.to("cuda") for t in batch)
model.train()


def step():
    loss = peer_nets.loss(model, *batch)
    loss.backward()
    if cfg["clip"] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
    opt.step()
    model.zero_grad(set_to_none=True)
    return loss


times, cpus, peaks = [], [], []
for s in range(args.warmup + args.steps):
    if gpu:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    elif probe:
        probe.start()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step()
    if gpu:
        loss.item()  # as ration's step reads its loss
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    cpu_ms = (time.process_time() - c0) * 1e3
    if gpu:
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = probe.peak_above() if probe else 0
    del loss
    if s >= args.warmup:
        times.append(ms)
        cpus.append(cpu_ms)
        peaks.append(peak)

out = {"side": "pytorch", "version": torch.__version__, "family": args.family,
       "steps": args.steps, "warmup": args.warmup, "step_ms_median": statistics.median(times),
       "step_cpu_ms_median": statistics.median(cpus), "step_ms": times,
       "threads": {"torch.set_num_threads": args.threads, "torch.get_num_threads": torch.get_num_threads(),
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
                   "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "")}}
out["device"] = torch.cuda.get_device_name(0) if gpu else "cpu"
if probe or gpu:
    out["peak_above_baseline_bytes"] = max(peaks)

if args.profile_ops:
    with torch.autograd.profiler.profile() as prof:
        step()
    ops = {}
    for e in prof.key_averages():
        ops[e.key] = {"calls": e.count, "self_ms": e.self_cpu_time_total / 1e3}
    out["ops"] = ops
print(json.dumps(out))
