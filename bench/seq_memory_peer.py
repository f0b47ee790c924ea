"""seq_memory_peer.py - the PyTorch peer of bench/seq_memory.cpp: the same sequence models (bench/peer_nets.py,
the models every bench script shares) run over the whole sequence at once (what a PyTorch user does), no
grad, one thread. Peak memory is measured by ration's counting ATen allocator loaded through ctypes
(bench/peer_probe.py: the same libc10 as ration), so both sides are measured identically. Run with Debian's
/usr/bin/python3.

usage: seq_memory_peer.py --probe build/bench/libration_memprobe.so --model lstm_lm --seq-len 10000
prints one JSON object: {"model", "seq_len", "peak_bytes", "seconds"} (peak above the parameters)."""
import argparse
import json
import time

import peer_probe

ap = argparse.ArgumentParser()
ap.add_argument("--probe", required=True)
ap.add_argument("--model", required=True, choices=["lstm_lm", "tcn_lm", "gpt_window", "gpt_full", "birnn_tagger"])
ap.add_argument("--seq-len", type=int, required=True)
ap.add_argument("--window", type=int, default=64)
args = ap.parse_args()

probe = peer_probe.install(args.probe)

import torch  # noqa: E402  (after the allocator is installed)
import torch.nn.functional as F  # noqa: E402
import peer_nets  # noqa: E402  (the models, defined once for every bench script)

torch.set_num_threads(1)
T = args.seq_len

with torch.no_grad():
    window = 0
    if args.model == "lstm_lm":  # configs/lstm_lm.toml: embed 64, 2 x LSTM 128, head
        model = peer_nets.LSTMLM()
    elif args.model == "tcn_lm":  # configs/tcn_lm.toml: embed 96, 6 gated blocks k 3, dilations 1..32
        model = peer_nets.TCNLM()
    elif args.model == "birnn_tagger":  # configs/birnn_tagger.toml: embed 64, causal conv k 3, bi-GRU 64, head
        model = peer_nets.BiRNNTagger()
    else:  # configs/gpt.toml's sizes (4 layers, 4 heads, 128 wide), no dropout; full: block_size T
        window = args.window if args.model == "gpt_window" else 0
        model = peer_nets.GPT(block_size=128 if window else T, dropout=0.0, window=window)
    x = torch.randint(0, 256, (1, T))
    probe.start()
    t0 = time.perf_counter()
    if args.model.startswith("gpt"):
        y = model(x, peer_nets.window_mask(T, window))  # one mask for every block
    else:
        y = model(x)
    # bits per byte as the streamed side computes it
    loss = F.cross_entropy(y[0, :-1].double(), x[0, 1:], reduction="sum")
    seconds = time.perf_counter() - t0
    peak = probe.peak_above()
print(json.dumps({"model": args.model, "seq_len": T, "peak_bytes": peak, "seconds": seconds}))
