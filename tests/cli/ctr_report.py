#!/usr/bin/env python3
"""`ration train configs/ctr.toml --json` with embedded shards: what the report's figures say, not only that
they are there.
  embedded: the evaluation's AUC is a probability in (0, 1) next to a positive log loss; the shards hold rows
            and bytes, and the trainer pulled and pushed rows, taking time to do it.
  eviction: with ps.max_bytes = 3MiB and a round every 10 steps, 30 steps run two rounds that disable rows and
            free bytes, and right after its round the shards' accounted bytes are within the cap.
usage: ctr_report.py embedded|eviction RATION_BINARY SOURCE_DIR"""
import json
import math
import subprocess
import sys

mode, ration, source = sys.argv[1], sys.argv[2], sys.argv[3]
cmd = [ration, "train", source + "/configs/ctr.toml", "--set", "train.eval_every=0", "--set", "data.eval_samples=1000",
       "--set", "train.checkpoint_dir=", "--json"]
if mode == "embedded":
    cmd += ["--steps", "4"]
else:
    cmd += ["--steps", "30", "--set", "ps.evict=importance", "--set", "ps.max_bytes=3MiB", "--set", "ps.evict_every=10",
            "--set", "ps.prefetch=false"]
r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
ps = r["ps"]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


if mode == "embedded":
    ev = r["eval"][-1]
    check(0 < ev["auc"] < 1 and math.isfinite(ev["auc"]), "auc %r is not a probability" % ev.get("auc"))
    check(ev["logloss"] > 0, "logloss %r" % ev.get("logloss"))
    check(ps["embedded"] == 1 and ps["shards"] >= 1, "not embedded shards: %r" % ps)
    check(ps["rows"] > 0 and ps["bytes"] > 0, "the shards hold nothing: %r" % ps)
    check(ps["rows_pulled"] > 0 and ps["rows_pushed"] > 0, "no rows pulled or pushed: %r" % ps)
    check(ps["pull_ms"] > 0 and ps["pull_ms_total"] >= ps["pull_ms"], "pull times %r" % ps)
else:
    cap = 3 << 20
    check(ps["max_bytes"] == cap, "max_bytes %r" % ps.get("max_bytes"))
    check(ps["evict_rounds"] == 2, "evict_rounds %r, expected 2 (steps 10 and 20)" % ps.get("evict_rounds"))
    check(ps["rows_disabled"] > 0 and ps["bytes_freed"] > 0, "the rounds disabled nothing: %r" % ps)
    check(0 < ps["bytes_after_round"] <= cap, "bytes after the round %r above the cap %d" % (ps["bytes_after_round"], cap))
if failures:
    print(json.dumps(ps, indent=1))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
print("%s: ok %s" % (mode, json.dumps({k: ps[k] for k in ("rows", "bytes")})))
