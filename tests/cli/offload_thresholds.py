#!/usr/bin/env python3
"""`ration train --offload` without a budget (the threshold policy): what the thresholds did, read from the
JSON report and compared with the same run without offload. Above T1 saved values are copied out (bytes
written, each at least offload.min_bytes, read back for backward); above T2 forward pauses while the
throttled copies fly; the measured peak is below the run without offload; the losses are the same.

usage: offload_thresholds.py RATION_BINARY SOURCE_DIR"""
import json
import subprocess
import sys

ration, source = sys.argv[1], sys.argv[2]
MiB, KiB = 1 << 20, 1 << 10
common = [ration, "train", source + "/configs/mlp.toml", "--steps", "3", "--set", "train.checkpoint_dir=",
          "--set", "train.eval_batches=1", "--json"]


def report(extra):
    out = subprocess.run(common + extra, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


plain = report([])
r = report(["--offload", "--offload-t1", "1MiB", "--offload-t2", "2MiB", "--offload-min-bytes", "16KiB",
            "--set", "offload.throttle=20MiB"])
off, totals = r["offload"], r["offload"]["totals"]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


check(off["mode"] == "thresholds", "mode %r" % off["mode"])
check(off["t1"] == MiB and off["t2"] == 2 * MiB and off["min_bytes"] == 16 * KiB, "thresholds as given: %r" % off)
check(totals["offloaded_values"] > 0, "no value was copied out above T1: %r" % totals)
check(totals["written_bytes"] >= 16 * KiB * totals["offloaded_storages"] > 0,
      "written bytes below min_bytes per storage: %r" % totals)
check(0 < totals["read_bytes"] <= totals["written_bytes"], "copies not read back for backward: %r" % totals)
check(totals["max_usage_bytes"] > MiB, "usage never went above T1: %r" % totals)
check(totals["forward_pauses"] > 0 and totals["forward_pause_ms"] > 0, "forward never paused above T2: %r" % totals)
check(r["memory"]["peak_bytes"] < plain["memory"]["peak_bytes"],
      "peak %d not below the run without offload (%d)" % (r["memory"]["peak_bytes"], plain["memory"]["peak_bytes"]))
check(r["loss"] == plain["loss"], "losses differ from the run without offload: %r vs %r" % (r["loss"], plain["loss"]))
if failures:
    print("offload thresholds report:", json.dumps(off, indent=1))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
print("thresholds: %d values / %d bytes out, %d pauses, peak %d < %d without offload" % (
    totals["offloaded_values"], totals["written_bytes"], totals["forward_pauses"], r["memory"]["peak_bytes"],
    plain["memory"]["peak_bytes"]))
