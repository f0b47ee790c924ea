#!/usr/bin/env python3
"""The folders of src/ration form layers: a file may include headers of its own folder and of folders in
lower layers only. Fails on an include that goes up or sideways within a layer, on a folder-level cycle,
on a folder missing from the table below, and (with --architecture FILE) on a folder that has no row in
docs/ARCHITECTURE.md's folder table. The table is the one place the layering is written down; ARCHITECTURE.md
explains it.
Usage: check_layers.py SRC_DIR [--architecture docs/ARCHITECTURE.md]
"""
import os
import re
import sys

# Lowest first. Folders in one layer may not include each other.
LAYERS = [
    ["base"],                        # error checks, the counting allocator, host memory, timing
    ["core"],                        # values, nodes, the autograd engine, saved values, step policies, traces
    ["ops", "config", "optim"],      # differentiable ops, settings, optimisers
    ["data", "seq"],                 # datasets and batches; sequence-model interfaces (dependency types, buffers)
    ["nn", "plan"],                  # modules and layers; the planner (profile, graph, simulator, strategies)
    ["offload", "ps", "torchscript"],  # the offload engine and tiers; the parameter-server library; TorchScript import
    ["step", "distributed"],         # what a training step offers models (hooks, piecewise losses); collectives
    ["models"],                      # model families
    ["runtime"],                     # StepRuntime: one owner of a step (profile, plan, execute)
    ["streaming"],                   # chunk-wise streaming and truncated-BPTT executors
    ["train"],                       # the training loop, checkpoints, gradcheck, progress
    ["serving"],                     # the online embedding server (an application of ps + models)
    ["cli"],                         # the command line
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"ration/([a-z_0-9]+)/[^"]+"', re.M)


def main():
    src = sys.argv[1]
    arch = sys.argv[sys.argv.index("--architecture") + 1] if "--architecture" in sys.argv else None
    layer_of = {f: i for i, layer in enumerate(LAYERS) for f in layer}
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    problems = [f"folder src/ration/{f} has no layer in {__file__}'s table" for f in folders if f not in layer_of]
    edges = {}
    for f in folders:
        for dirpath, _, files in os.walk(os.path.join(src, f)):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    to = m.group(1)
                    if to == f:
                        continue
                    edges.setdefault(f, set()).add(to)
                    line = text.count("\n", 0, m.start()) + 1
                    if to not in layer_of or f not in layer_of:
                        continue
                    if layer_of[to] >= layer_of[f]:
                        how = "up" if layer_of[to] > layer_of[f] else "sideways"
                        problems.append(f"{os.path.relpath(path, os.path.dirname(src))}:{line}: includes ration/{to}/ ({how}: "
                                        f"{f} is in layer {layer_of[f]}, {to} in layer {layer_of[to]})")
    # Cycles in the folder graph (independent of the table, so a wrong table cannot hide one).
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                problems.append("folder cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for f in folders:
        if f not in state:
            visit(f)
    if arch:
        with open(arch, encoding="utf-8") as fh:
            doc = fh.read()
        for f in folders:
            if not re.search(r"^\|\s*`?(src/ration/)?" + re.escape(f) + r"/?`?\s*\|", doc, re.M):
                problems.append(f"{arch}: no row for folder {f}/ in the folder table")
    for p in problems:
        print(p)
    print(f"{len(folders)} folders, {sum(len(v) for v in edges.values())} folder dependencies, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
