#!/usr/bin/env python3
"""bench/model_parallel.py — model and hybrid parallelism (docs/DISTRIBUTED.md, "Model and hybrid
parallelism"), measured with `ration launch -- train` runs on this machine; prints three tables and writes
bench/results/model_parallel.json.

  1. Bubble: gpt, 2 pipeline stages, 1F1B, M = 1, 2, 4, 8 micro-batches: the measured share of the schedule
     (a step up to its gradients exchanged) the busiest stage does not compute a micro-batch, next to
     (P - 1) / (M + P - 1); the mean over both stages, and the share blocked in neighbour exchanges alone.
  2. Layouts at N = 4: one process, data parallel 4, pipeline 4, tensor 4, tensor 2 x data 2, pipeline 2 x
     data 2 on a wider gpt at the same global batch: samples/s, the largest per-process peak, bytes each
     process sends per step, and the step time projected to 1 / 10 / 100 Gb/s links (the measured step plus
     the bytes at that rate: this machine's loopback is not a network).
  3. Equal per-process memory: pipeline 2 under --memory-budget B (each stage plans recompute for its
     micro-batches in flight) against pipeline 2 without a plan, which must fit B with a smaller batch.

Usage: bench/model_parallel.py [--build build] [--steps 12] [--repeats 2] [--tables bubble,layouts,memory]
                               [--out bench/results/model_parallel.json]
--tables runs some of the three; their results replace those tables in an existing --out file.
Every configuration runs `repeats` times, interleaved (round-robin over the configurations); the medians of the
runs' median step times are reported. Threads: one per process (train.threads = 1, OpenBLAS single-threaded).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(build, n, sets, steps, budget=None):
    """One `ration launch -n N -- train configs/gpt.toml` run; returns its report (rank 0's)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [os.path.join(build, "ration")]
        if n > 1:
            cmd += ["launch", "-n", str(n), "--master-port", "0", "--oversubscribe", "--"]
        cmd += ["train", os.path.join(ROOT, "configs/gpt.toml"), "--steps", str(steps), "--report", report, "--json",
                "--set", "train.threads=1", "--set", "train.checkpoint_dir=", "--set", "train.eval_every=0",
                "--set", "train.eval_batches=1", "--set", "model.dropout=0"]
        for s in sets:
            cmd += ["--set", s]
        if budget:
            cmd += ["--memory-budget", str(budget)]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=900)
        if p.returncode != 0:
            return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
        with open(report) as f:
            return json.load(f)


def peak_of(r):
    """The largest per-process measured peak: every rank's with [parallel], else rank 0's."""
    if "parallel" in r:
        return max(m["measured_peak_bytes"] for m in r["parallel"]["memory"])
    return r["memory"]["peak_bytes"]


def bytes_sent(r):
    if "parallel" in r:
        return r["parallel"]["bytes_sent_per_step"]
    return r.get("dist", {}).get("bytes_sent_per_step", 0)


def interleaved(build, configs, steps, repeats):
    """configs: name -> (n, sets, budget). Returns name -> list of reports (errors kept)."""
    out = {name: [] for name in configs}
    for _ in range(repeats):
        for name, (n, sets, budget) in configs.items():
            out[name].append(run(build, n, sets, steps, budget))
            print(f"  ran {name}", file=sys.stderr, flush=True)
    return out


def summary(reports):
    ok = [r for r in reports if "error" not in r]
    if not ok:
        return {"error": reports[0]["error"]}
    step_ms = statistics.median(r["time"]["step_ms_median"] for r in ok)
    batch = ok[0]["effective_config"]["train.batch_size"]
    s = {"step_ms": step_ms, "peak_bytes": max(peak_of(r) for r in ok), "bytes_sent_per_step": bytes_sent(ok[0]),
         "loss_last": ok[0]["loss"][-1]}
    s["batch_per_replica"] = int(batch)
    if "parallel" in ok[0]:
        p = ok[0]["parallel"]
        s["layout"] = f"T{p['tensor']} x P{p['pipeline']} x D{p['data']}"
        if "bubble" in p:
            b = [r["parallel"]["bubble"] for r in ok]
            s["bubble_measured"] = statistics.median(x["measured_idle_fraction_busiest_stage"] for x in b)
            s["idle_mean"] = statistics.median(x["measured_idle_fraction_mean"] for x in b)
            s["wait_mean"] = statistics.median(x["measured_wait_fraction_mean"] for x in b)
            s["bubble_formula"] = p["bubble"]["formula"]
        if ok[0].get("plan"):
            s["recompute_ms"] = ok[0]["time"].get("recompute_ms", 0)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tables", default="bubble,layouts,memory")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/model_parallel.json"))
    a = ap.parse_args()
    tables = set(a.tables.split(","))
    result = {}
    if tables != {"bubble", "layouts", "memory"} and os.path.exists(a.out):
        with open(a.out) as f:
            result = json.load(f)
    result.update({"command": " ".join(sys.argv), "steps": a.steps, "repeats": a.repeats})
    if "bubble" in tables:
        bubble_table(a, result)
    if "layouts" in tables:
        layouts_table(a, result)
    if "memory" in tables:
        memory_table(a, result)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {a.out}")


def bubble_table(a, result):

    # 1. Bubble at M = 1, 2, 4, 8 (gpt 4 x 128, batch 16).
    bubble = {f"M={m}": (2, ["parallel.pipeline=2", f"parallel.micro_batches={m}"], None) for m in (1, 2, 4, 8)}
    bubble["M=4 gpipe"] = (2, ["parallel.pipeline=2", "parallel.micro_batches=4", "parallel.schedule=gpipe"], None)
    rows = {k: summary(v) for k, v in interleaved(a.build, bubble, a.steps, a.repeats).items()}
    result["bubble"] = rows
    print("\n1. Bubble: gpt 4 x 128, batch 16, pipeline 2, 1F1B: the share of the schedule the busiest stage spends")
    print("   not computing a micro-batch (the bubble), the mean over both stages, the share blocked in exchanges")
    print(f"{'M':>6} {'bubble':>9} {'(P-1)/(M+P-1)':>14} {'mean idle':>10} {'mean wait':>10} {'step ms':>9}")
    for k, s in rows.items():
        if "error" in s:
            print(f"{k:>6} error: {s['error']}")
            continue
        print(f"{k:>6} {s['bubble_measured']:9.3f} {s['bubble_formula']:14.3f} {s['idle_mean']:10.3f} "
              f"{s['wait_mean']:10.3f} {s['step_ms']:9.1f}")


def layouts_table(a, result):
    # 2. Layouts at N = 4 on a wider gpt (8 blocks x 256, 8 heads), global batch 16.
    wide = ["model.n_layer=8", "model.n_embd=256", "model.n_head=8", "model.block_size=128"]
    layouts = {
        "1 process": (1, wide + ["train.batch_size=16"], None),
        "data 4": (4, wide + ["train.batch_size=4"], None),
        "pipeline 4": (4, wide + ["train.batch_size=16", "parallel.pipeline=4", "parallel.micro_batches=8"], None),
        "tensor 4": (4, wide + ["train.batch_size=16", "parallel.tensor=4"], None),
        "tensor 2 x data 2": (4, wide + ["train.batch_size=8", "parallel.tensor=2"], None),
        "pipeline 2 x data 2": (4, wide + ["train.batch_size=8", "parallel.pipeline=2", "parallel.micro_batches=4"], None),
    }
    rows = {k: summary(v) for k, v in interleaved(a.build, layouts, a.steps, a.repeats).items()}
    result["layouts"] = rows
    print("\n2. gpt 8 x 256, global batch 16 x 128 tokens, N = 4 processes on this machine (1 thread each)")
    print(f"{'layout':>20} {'samples/s':>10} {'peak/process':>13} {'sent/step':>11} "
          f"{'step @1Gb/s':>12} {'@10Gb/s':>9} {'@100Gb/s':>9}")
    for k, s in rows.items():
        if "error" in s:
            print(f"{k:>20} error: {s['error']}")
            continue
        step_s = s["step_ms"] / 1000
        s["samples_per_s"] = 16 / step_s
        proj = {g: step_s + s["bytes_sent_per_step"] * 8 / (g * 1e9) for g in (1, 10, 100)}
        s["projected_step_s"] = {f"{g}Gb/s": v for g, v in proj.items()}
        print(f"{k:>20} {s['samples_per_s']:10.2f} {s['peak_bytes'] / 2**20:10.1f} MiB {s['bytes_sent_per_step'] / 2**20:8.2f} MiB "
              f"{proj[1] * 1000:9.0f} ms {proj[10] * 1000:6.0f} ms {proj[100] * 1000:6.0f} ms")



def memory_table(a, result):
    # 3. Equal per-process memory: the budget is 85% of pipeline 2's largest stage peak at batch 16, M = 4.
    base = ["parallel.pipeline=2", "parallel.micro_batches=4"]
    loose = summary([run(a.build, 2, base + ["train.batch_size=16"], a.steps)])
    budget = int(0.85 * loose["peak_bytes"])
    cmp = {"pipeline 2 + plan, batch 16": (2, base + ["train.batch_size=16"], budget)}
    for b in (12, 8, 4):
        cmp[f"pipeline 2 alone, batch {b}"] = (2, base + [f"train.batch_size={b}"], None)
    rows = {k: summary(v) for k, v in interleaved(a.build, cmp, a.steps, a.repeats).items()}
    result["equal_memory"] = {"budget_bytes": budget, "rows": rows}
    print(f"\n3. Equal per-process memory {budget / 2**20:.1f} MiB (85% of pipeline 2's stage peak at batch 16)")
    print(f"{'configuration':>30} {'samples/s':>10} {'peak/process':>13} {'fits':>5}")
    for k, s in rows.items():
        if "error" in s:
            print(f"{k:>30} error: {s['error']}")
            continue
        s["samples_per_s"] = s["batch_per_replica"] / (s["step_ms"] / 1000)
        s["fits"] = s["peak_bytes"] <= budget
        print(f"{k:>30} {s['samples_per_s']:10.2f} {s['peak_bytes'] / 2**20:10.1f} MiB {str(s['fits']):>5}")


if __name__ == "__main__":
    main()
