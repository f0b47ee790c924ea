#!/usr/bin/env python3
"""`ration train --offload` without a budget (the threshold policy): what the thresholds did, read from the
JSON report and compared with the same run without offload (batch 1024, so that saved activations are what
the step's peak holds). Above T1 saved values are copied out (bytes written, each at least
offload.min_bytes, read back for backward); above T2 forward pauses while the throttled copies fly; above
T3 prefetches are held back, so fewer saved activations are resident at the measured peak than without
offload; the losses are the same.

usage: offload_thresholds.py RATION_BINARY SOURCE_DIR"""
import json
import subprocess
import sys

ration, source = sys.argv[1], sys.argv[2]
MiB, KiB = 1 << 20, 1 << 10
common = [ration, "train", source + "/configs/mlp.toml", "--steps", "3", "--set", "train.checkpoint_dir=",
          "--set", "train.eval_batches=1", "--set", "train.batch_size=1024", "--json"]


def report(extra):
    out = subprocess.run(common + extra, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


plain = report([])
r = report(["--offload", "--offload-t1", "1MiB", "--offload-t2", "2MiB", "--offload-t3", "2MiB",
            "--offload-min-bytes", "16KiB", "--set", "offload.throttle=20MiB"])
off, totals = r["offload"], r["offload"]["totals"]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


check(off["mode"] == "thresholds", "mode %r" % off["mode"])
check(off["t1"] == MiB and off["t2"] == 2 * MiB and off["t3"] == 2 * MiB and off["min_bytes"] == 16 * KiB,
      "thresholds as given: %r" % off)
check(totals["offloaded_values"] > 0, "no value was copied out above T1: %r" % totals)
check(totals["written_bytes"] >= 16 * KiB * totals["offloaded_storages"] > 0,
      "written bytes below min_bytes per storage: %r" % totals)
check(0 < totals["read_bytes"] <= totals["written_bytes"], "copies not read back for backward: %r" % totals)
check(totals["max_usage_bytes"] > 2 * MiB, "usage never went above T2: %r" % totals)
check(totals["forward_pauses"] > 0 and totals["forward_pause_ms"] > 0, "forward never paused above T2: %r" % totals)
check(totals["deferred_prefetches"] > 0, "no prefetch was held back above T3: %r" % totals)
saved, saved_plain = (x["memory"]["breakdown_at_peak"]["saved_activations"] for x in (r, plain))
check(0 < saved < saved_plain, "saved activations at the peak %d not below the run without offload (%d)" % (saved, saved_plain))
check(r["loss"] == plain["loss"], "losses differ from the run without offload: %r vs %r" % (r["loss"], plain["loss"]))
if failures:
    print("offload thresholds report:", json.dumps(off, indent=1))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
print("thresholds: %d values / %d bytes out, %d pauses, %d prefetches held, saved at the peak %d < %d without offload"
      % (totals["offloaded_values"], totals["written_bytes"], totals["forward_pauses"], totals["deferred_prefetches"],
         saved, saved_plain))
