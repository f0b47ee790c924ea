#!/usr/bin/env python3
"""check_trace.py — check a `--trace` file the way a trace viewer needs it (standard library only).

Owns: the command-line check of a Chrome Trace Event file written by `ration ... --trace`: valid JSON,
only metadata / complete-span / counter events, every span closed (non-negative duration) and nested per
track, counters non-negative, the compute track present with forward and backward spans, memory counters
present; with --report (a `ration train --report` file) the peak counter's maximum equal to the report's
trace.peak_bytes (the traced steps' measured peak) and, when the traced steps are the whole run, to
memory.peak_bytes; with --expect-tracks, those tracks present with spans ("a|b": spans on a or on b, for
work that either of two threads may run, like a copy the queue's thread or a waiting compute thread does). Does not own the in-process
checks against the profile and the report (tests/test_trace.cpp, tests/test_trace_train.cpp).

usage: check_trace.py FILE.json [--expect-budget BYTES] [--report REPORT.json] [--expect-tracks a,b]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--expect-budget", type=int)
    ap.add_argument("--report")
    ap.add_argument("--expect-tracks", default="")
    args = ap.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    tracks, spans, counters = {}, {}, {}
    for e in events:
        ph = e["ph"]
        if ph == "M":
            if e["name"] == "thread_name":
                tracks[e["tid"]] = e["args"]["name"]
        elif ph == "X":
            if e["dur"] < 0:
                sys.exit(f"{args.trace}: span {e['name']} has a negative duration")
            spans.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"], e["cat"]))
        elif ph == "C":
            for series, v in e["args"].items():
                if v < 0:
                    sys.exit(f"{args.trace}: counter {e['name']}/{series} is negative ({v})")
            counters.setdefault(e["name"], []).append(e)
        elif ph == "i":
            if e.get("tid") is None:
                sys.exit(f"{args.trace}: instant event {e['name']} names no track")
        else:
            sys.exit(f"{args.trace}: unexpected event phase {ph!r}")
    for tid, ss in spans.items():
        ss.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, name, _ in ss:
            while stack and stack[-1][1] <= start + 1e-3:  # ts and dur are printed to 1 ns: adjacent spans
                stack.pop()
            if stack and end > stack[-1][1] + 1e-3:
                sys.exit(f"{args.trace}: span {name} overlaps {stack[-1][2]} on track {tracks.get(tid, tid)}")
            stack.append((start, end, name))
    compute = [t for t, n in tracks.items() if n == "compute"]
    if not compute:
        sys.exit(f"{args.trace}: no compute track")
    cats = {}
    for s in spans[compute[0]]:
        cats[s[3]] = cats.get(s[3], 0) + 1
    if not cats.get("forward") or not cats.get("backward"):
        sys.exit(f"{args.trace}: compute track lacks forward or backward spans: {cats}")
    for name in ("device memory (bytes)", "device memory peak (bytes)"):
        if name not in counters:
            sys.exit(f"{args.trace}: no counter {name!r}")
    if args.expect_budget is not None:
        budgets = {e["args"]["budget"] for e in counters.get("budget (bytes)", [])}
        if budgets != {args.expect_budget}:
            sys.exit(f"{args.trace}: budget line {budgets}, expected {args.expect_budget}")
    peak = max(sum(e["args"].values()) for e in counters["device memory peak (bytes)"])
    for names in filter(None, args.expect_tracks.split(",")):
        alternatives = names.split("|")
        if not any(spans.get(t) for t, n in tracks.items() if n in alternatives):
            sys.exit(f"{args.trace}: no spans on track {' or '.join(map(repr, alternatives))} "
                     f"(tracks: {sorted(tracks.values())})")
    if args.report:
        report = json.load(open(args.report))
        traced = report["trace"]["peak_bytes"]
        if peak != traced:
            sys.exit(f"{args.trace}: peak counter maximum {peak} != report trace.peak_bytes {traced}")
        first, end = report["trace"]["steps"]
        if first == report["first_step"] and end == report["steps"] and peak != report["memory"]["peak_bytes"]:
            sys.exit(f"{args.trace}: the whole run is traced but the peak counter's maximum {peak} != "
                     f"memory.peak_bytes {report['memory']['peak_bytes']}")
    print(f"{args.trace}: {len(events)} events, spans {cats}, tracks {sorted(tracks.values())}, "
          f"peak {peak / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
