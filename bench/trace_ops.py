#!/usr/bin/python3
"""Per-op self time from a ration --trace file (the same sums `ration train --profile-ops` makes, for a
binary that predates that flag). usage: trace_ops.py TRACE.json [--skip-steps-ms 0]
Prints per op: forward calls, forward / backward / recompute self ms, summed over the whole trace."""
import json
import sys
from collections import defaultdict

events = [e for e in json.load(open(sys.argv[1]))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("forward", "backward", "recompute")]
events.sort(key=lambda e: (e["ts"], -e["dur"]))
self_t = [e["dur"] for e in events]
stack = []
for i, e in enumerate(events):
    while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= e["ts"]:
        stack.pop()
    if stack:
        self_t[stack[-1]] -= e["dur"]
    stack.append(i)
ops = defaultdict(lambda: {"calls": 0, "forward": 0.0, "backward": 0.0, "recompute": 0.0})
for e, t in zip(events, self_t):
    op = ops[e["name"].rsplit("/", 1)[-1]]
    op[e["cat"]] += max(t, 0) / 1e3
    if e["cat"] == "forward":
        op["calls"] += 1
rows = sorted(ops.items(), key=lambda kv: -(kv[1]["forward"] + kv[1]["backward"] + kv[1]["recompute"]))
print("%-28s %8s %10s %10s %10s %10s" % ("op", "calls", "forward", "backward", "recompute", "total"))
for name, o in rows:
    print("%-28s %8d %10.2f %10.2f %10.2f %10.2f" % (name, o["calls"], o["forward"], o["backward"], o["recompute"],
                                                   o["forward"] + o["backward"] + o["recompute"]))
