#!/usr/bin/python3
"""What `ration train`'s loop adds to the step: per family, `ration train configs/F.toml --steps S` (its report's
time.loop_ms_median and time.step_ms_median) interleaved with `bench_peer --worker ration --family F` (the same
step through StepRuntime on one fixed batch, no loop around it), the order reversed every other repetition;
threads as the config's train.threads (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = the same). Prints one line per
run and the medians with every repetition (BENCHMARKS.md, "What the training loop adds").

usage: bench/loop_vs_step.py [--build build] [--families mlp,gpt,lstm_lm] [--reps 3] [--steps 60]"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
ap.add_argument("--families", default="mlp,gpt,lstm_lm")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--steps", type=int, default=60)
args = ap.parse_args()


def threads(fam):
    with open(os.path.join(HERE, "..", "configs", fam + ".toml")) as f:
        for line in f:
            if line.startswith("threads"):
                return line.split("=")[1].split()[0]
    return "2"


out = {}
report = os.path.join(tempfile.gettempdir(), "ration-loop-vs-step-%d.json" % os.getpid())
for r in range(args.reps):
    for fam in args.families.split(","):
        t = threads(fam)
        env = dict(os.environ, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t)
        for side in (["train", "bench"] if r % 2 == 0 else ["bench", "train"]):
            load = open("/proc/loadavg").read().split()[0]
            if side == "train":
                subprocess.run([os.path.join(args.build, "ration"), "train", os.path.join(HERE, "..", "configs", fam + ".toml"),
                                "--steps", str(args.steps), "--set", "train.checkpoint_dir=", "--report", report],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                with open(report) as f:
                    tm = json.load(f)["time"]
                out.setdefault((fam, "train loop"), []).append(tm["loop_ms_median"])
                out.setdefault((fam, "train step"), []).append(tm["step_ms_median"])
            else:
                text = subprocess.run([os.path.join(args.build, "bench", "bench_peer"), "--worker", "ration", "--family", fam,
                                       "--steps", str(args.steps), "--warmup", "1", "--threads", t],
                                      env=env, capture_output=True, text=True, check=True).stdout
                out.setdefault((fam, "bench_peer step"), []).append(json.loads(text.strip().splitlines()[-1])["step_ms_median"])
            print(f"rep {r + 1} {fam} {side} (load {load})", flush=True)
if os.path.exists(report):
    os.remove(report)
for (fam, k), v in out.items():
    print(f"{fam:8s} {k:16s} median {statistics.median(v):8.2f}  reps {[round(x, 2) for x in v]}")
