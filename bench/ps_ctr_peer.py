#!/usr/bin/python3
"""bench/ps_ctr_peer.py — the ctr model on MovieLens: ration vs a PyTorch peer, in one run.

The peer is what a user would write in PyTorch 1.13 (bench/peer_nets.py's CTR, with the models every bench
script shares): nn.EmbeddingBag per field (mean, sparse gradients, Adagrad on the embeddings), the same
bottom/top MLPs (AdamW), the same pairwise-dot interaction, BCE with logits, the same time split, batch
size, epochs and thread count. Both sides run once per seed (the seed sets initial values and shuffle
order on each side), interleaved: ration seed 0, peer seed 0, ration seed 1, ...; the table gives each
seed and the mean and standard deviation. --ps-lr / --epochs change both sides alike. Also reports a popularity baseline (each movie's smoothed training click rate).
Prints a table and writes JSON.

--init own (the default): each side draws its own initial values and batch order from the seed, as a
user of either would. --init ration: the peer starts from ration's exact initial values (the embedding
rows' first-touch values from (table seed, id), the dense layers' from ATen's generator seeded as ration
seeds it), takes ration's batch order (splitmix64 Fisher-Yates) and ration's Adagrad eps (1e-8): the two
then compute the same run, and the bench reports the largest per-step training-loss difference (ration
runs with train.log_every = 1) beside the AUCs.

Usage: /usr/bin/python3 bench/ps_ctr_peer.py [--ration build/ration] [--config configs/ctr_movielens.toml]
         [--csv data/movielens.csv] [--threads 1] [--seeds 3] [--first-seed 0] [--ps-lr 0.02] [--epochs 2]
         [--init own|ration] [--json bench/results/ps_ctr_movielens.json]
"""
import argparse
import csv
import json
import math
import subprocess
import time

import numpy as np
import torch
import torch.nn as nn

import peer_nets


def load(path, train_fraction):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["timestamp"]), int(r["userId"]), int(r["movieId"]), float(r["rating"]),
                         int(r["year"]), [g for g in r["genres"].split("|") if g]))
    rows.sort(key=lambda r: r[0])  # stable, as the C++ reader
    n_train = int(len(rows) * train_fraction)
    return rows[:n_train], rows[n_train:]


# ---- ration's initial values and batch order, reproduced (--init ration) ---------------------------------
M64 = (1 << 64) - 1


def mix64(x):
    """splitmix64 finaliser (src/ration/ps/store.h)."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class SplitMix64:
    """The loader's generator (src/ration/data/dataset.cpp)."""

    def __init__(self, state):
        self.state = state & M64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        return mix64((self.state - 0x9E3779B97F4A7C15) & M64)

    def below(self, bound):
        limit = M64 - M64 % bound
        while True:
            r = self.next()
            if r < limit:
                return r % bound


def ration_order(n, seed, epoch):
    """data::shuffle_order(n, seed, epoch): Fisher-Yates over splitmix64."""
    order = list(range(n))
    rng = SplitMix64(SplitMix64(seed).next() ^ ((epoch * 0xD1B54A32D192ED03) & M64))
    rng.next()
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def genre_id(name):
    """The reader's stable genre id (FNV-1a >> 1, src/ration/data/ctr_movielens.cpp)."""
    h = 1469598103934665603
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) & M64
    return h >> 1


def ration_row(table_seed, feature_id, dim, scale):
    """Table::initial_value: a counter-based stream keyed by (table seed, id), uniform in [-scale, scale)."""
    key = mix64(table_seed ^ mix64(feature_id & M64))
    u = np.array([mix64((key + k) & M64) >> 40 for k in range(dim)], dtype=np.float64).astype(np.float32)
    return (np.float32(2.0) * (u / np.float32(1 << 24)) - np.float32(1.0)) * np.float32(scale)


def start_from_ration(model, vocabs, seed, dim, init_scale):
    """Overwrites the peer's initial values with ration's for train.seed = seed (ps.seed unset)."""
    with torch.no_grad():
        for f, (vocab, table) in enumerate(zip(vocabs, model.tables)):
            table_seed = mix64((seed * 1000003 + f) & M64)  # Ctr: mix64(ps.seed * 1000003 + field)
            for key, row in vocab.ids.items():
                feature_id = genre_id(key) if f == 2 else key
                table.weight[row] = torch.from_numpy(ration_row(table_seed, feature_id, dim, init_scale))
        torch.manual_seed(seed)  # ration seeds ATen's generator, then builds bottom then top layers
        for layer in [m for m in list(model.bottom) + list(model.top) if isinstance(m, nn.Linear)]:
            bound = 1.0 / math.sqrt(layer.in_features)
            layer.weight.copy_(torch.empty(layer.weight.shape).uniform_(-bound, bound))
            layer.bias.copy_(torch.empty(layer.bias.shape).uniform_(-bound, bound))


class Vocab:
    def __init__(self):
        self.ids = {}

    def __call__(self, key):
        return self.ids.setdefault(key, len(self.ids))


def tensors(rows, vocabs):
    fields = [[], [], [], []]  # user, movie, genres, year: (flat ids, offsets)
    offsets = [[], [], [], []]
    dense, labels = [], []
    for ts, u, m, rating, year, genres in rows:
        for f, values in enumerate(([u], [m], genres, [year])):
            offsets[f].append(len(fields[f]))
            fields[f].extend(vocabs[f](v) for v in values)
        dense.append([(year - 1990) / 20.0 if year > 0 else 0.0])
        labels.append(1.0 if rating >= 4 else 0.0)
    return ([torch.tensor(x, dtype=torch.long) for x in fields], [torch.tensor(o, dtype=torch.long) for o in offsets],
            torch.tensor(dense), torch.tensor(labels))


def batch(ids, offsets, dense, labels, idx):
    out_ids, out_off = [], []
    for i, o in zip(ids, offsets):
        ends = torch.cat([o[1:], torch.tensor([len(i)])])
        parts = [i[o[k]:ends[k]] for k in idx.tolist()]
        lens = torch.tensor([len(p) for p in parts])
        out_ids.append(torch.cat(parts))
        out_off.append(torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]]))
    return out_ids, out_off, dense[idx], labels[idx]


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        ranks[i:j] = 0.5 * (i + 1 + j)
        i = j
    pos = y.sum()
    neg = len(y) - pos
    return (ranks[y > 0.5].sum() - pos * (pos + 1) / 2) / (pos * neg)


def run_peer(train, test, cfg, seed, init="own"):
    torch.manual_seed(seed)
    vocabs = [Vocab() for _ in range(4)]
    tr = tensors(train, vocabs)
    te = tensors(test, vocabs)
    model = peer_nets.CTR([max(1, len(v.ids)) for v in vocabs], cfg["dim"], cfg["bottom"], cfg["top"])
    if init == "ration":
        start_from_ration(model, vocabs, seed, cfg["dim"], cfg["init_scale"])
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt_dense = torch.optim.AdamW(dense_params, lr=cfg["lr"], weight_decay=0.0)
    # torch's Adagrad eps is 1e-10, ration's 1e-8 (the same AUC to 1e-4 either way, measured).
    opt_sparse = torch.optim.Adagrad(list(model.tables.parameters()), lr=cfg["ps_lr"],
                                     eps=1e-8 if init == "ration" else 1e-10)
    n = len(tr[3])
    bs = cfg["batch_size"]
    rng = np.random.default_rng(seed)
    steps = 0
    losses = []
    t0 = time.time()
    for epoch in range(cfg["epochs"]):
        perm = torch.tensor(ration_order(n, seed, epoch)) if init == "ration" else torch.from_numpy(rng.permutation(n))
        for b in range(n // bs):
            ids, off, dense, y = batch(*tr, perm[b * bs:(b + 1) * bs])
            loss = nn.functional.binary_cross_entropy_with_logits(model(ids, off, dense), y)
            opt_dense.zero_grad()
            opt_sparse.zero_grad()
            loss.backward()
            opt_dense.step()
            opt_sparse.step()
            losses.append(loss.item())
            steps += 1
    seconds = time.time() - t0
    with torch.no_grad():
        ids, off, dense, y = batch(*te, torch.arange(len(te[3])))
        z = model(ids, off, dense)
        p = torch.sigmoid(z).numpy()
        logloss = nn.functional.binary_cross_entropy_with_logits(z, y).item()
    return {"auc": float(auc(p, y.numpy())), "logloss": logloss, "steps": steps,
            "samples_per_s": steps * bs / seconds, "losses": losses}


def popularity(train, test):
    clicks, seen = {}, {}
    base = sum(1.0 for r in train if r[3] >= 4) / len(train)
    for r in train:
        seen[r[2]] = seen.get(r[2], 0) + 1
        clicks[r[2]] = clicks.get(r[2], 0) + (1 if r[3] >= 4 else 0)
    prior = 10.0
    s = np.array([(clicks.get(r[2], 0) + prior * base) / (seen.get(r[2], 0) + prior) for r in test])
    y = np.array([1.0 if r[3] >= 4 else 0.0 for r in test])
    return float(auc(s, y))


def run_ration(args, cfg, seed):
    t0 = time.time()
    out = subprocess.run([args.ration, "train", args.config, "--json", "--set", f"data.file={args.csv}",
                          "--set", f"train.threads={args.threads}", "--set", f"train.seed={seed}",
                          "--set", f"ps.lr={cfg['ps_lr']}", "--set", f"train.epochs={cfg['epochs']}",
                          "--set", "train.log_every=1"],
                         check=True, capture_output=True, text=True)
    rep = json.loads(out.stdout)
    return {"auc": rep["eval"][-1]["auc"], "logloss": rep["eval"][-1]["logloss"], "steps": rep["steps"],
            "samples_per_s": rep["time"]["items_per_second"], "wall_s": time.time() - t0, "ps": rep["ps"],
            "losses": rep["loss"]}


def summary(runs, key):
    v = np.array([r[key] for r in runs])
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ration", default="build/ration")
    ap.add_argument("--config", default="configs/ctr_movielens.toml")
    ap.add_argument("--csv", default="data/movielens.csv")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--init", choices=["own", "ration"], default="own",
                    help="own: each side its own initial values and order; ration: the peer starts from ration's")
    ap.add_argument("--ps-lr", type=float, default=0.02, help="Adagrad lr of the embeddings, both sides")
    ap.add_argument("--epochs", type=int, default=2, help="both sides")
    ap.add_argument("--json", default="bench/results/ps_ctr_movielens.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # The same settings as configs/ctr_movielens.toml (ps_lr and epochs from the flags).
    cfg = {"dim": 16, "bottom": [16], "top": [64, 32], "lr": 1e-3, "ps_lr": args.ps_lr, "batch_size": 256,
           "epochs": args.epochs, "init_scale": 0.01}
    train, test = load(args.csv, 0.8)
    ours, peers = [], []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        ours.append(run_ration(args, cfg, seed))
        peers.append(run_peer(train, test, cfg, seed, args.init))
        steps = min(len(ours[-1]["losses"]), len(peers[-1]["losses"]))
        gap = max(abs(a - b) for a, b in zip(ours[-1]["losses"][:steps], peers[-1]["losses"][:steps]))
        ours[-1]["seed"] = peers[-1]["seed"] = seed
        peers[-1]["max_step_loss_diff"] = gap
        print(f"seed {seed}: ration AUC {ours[-1]['auc']:.4f}, PyTorch AUC {peers[-1]['auc']:.4f} "
              f"(largest per-step loss difference {gap:.2e})", flush=True)
    for r in ours + peers:
        del r["losses"]
    pop = popularity(train, test)
    print(f"MovieLens ({len(train)} train / {len(test)} test ratings, time split), {args.threads} threads, "
          f"Adagrad lr {args.ps_lr}, {args.epochs} epochs, {args.seeds} seeds, initial values: {args.init}")
    print(f"{'':22s} {'AUC mean':>9s} {'AUC std':>8s} {'logloss':>8s} {'steps':>6s} {'samples/s':>10s}")
    for name, runs in (("ration ctr", ours), ("PyTorch EmbeddingBag", peers)):
        m, sd = summary(runs, "auc")
        print(f"{name:22s} {m:9.4f} {sd:8.4f} {summary(runs, 'logloss')[0]:8.4f} {runs[0]['steps']:6d} "
              f"{np.median([r['samples_per_s'] for r in runs]):10.0f}")
    print(f"{'popularity baseline':22s} {pop:9.4f}")
    diff = summary(ours, "auc")[0] - summary(peers, "auc")[0]
    print(f"ration - PyTorch mean AUC: {diff:+.4f} (bound: >= -0.005)")
    with open(args.json, "w") as f:
        json.dump({"bench": "ps_ctr_movielens", "threads": args.threads, "settings": cfg, "seeds": args.seeds,
                   "first_seed": args.first_seed, "init": args.init,
                   "ration": ours, "pytorch": peers, "ration_auc_mean": summary(ours, "auc")[0],
                   "pytorch_auc_mean": summary(peers, "auc")[0], "popularity_auc": pop}, f, indent=2)
    print("wrote", args.json)


if __name__ == "__main__":
    main()
