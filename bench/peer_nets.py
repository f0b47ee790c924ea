"""peer_nets.py - every PyTorch peer model of the bench scripts, defined once: ration's model families
(configs/*.toml, src/ration/models/) written as a PyTorch 1.13 user would write them (nn.Linear, nn.Conv2d,
nn.LSTM, F.*), with ration's layouts, sizes (the defaults are the configs') and dropout placement. Every
model maps its input to logits; loss() is the cross-entropy ration's classifiers and language models train
on (CTR: binary cross-entropy with logits, by its caller).

  MLP     flatten -> [Linear -> ReLU -> dropout] per hidden width -> Linear to 10 classes
  CNN     [Conv2d (same padding) -> BatchNorm2d -> ReLU -> 2x2 max pool] per channel count -> Linear ->
          ReLU -> dropout -> Linear to 10 classes
  GPT     nanoGPT: wte + wpe -> dropout -> pre-LN blocks (x + attn(ln1(x)); x + mlp(ln2(x))): fused qkv,
          causal softmax(q k^T / sqrt(d)) with dropout on the weights, proj + dropout; MLP fc 4C, exact GELU,
          proj + dropout; every Linear with a bias -> ln_f -> head tied to wte (ration's model.tie_weights =
          true). Options: checkpoint_blocks (torch.utils.checkpoint per block, non-reentrant) and window
          (sliding-window attention, positions modulo block_size, as model.attention_window).
  LSTMLM  embedding -> nn.LSTM (dropout between layers) -> dropout -> Linear head
  TCNLM   embedding -> gated causal dilated Conv1d blocks (dilation 2^i, residual) -> LayerNorm -> head
  CTR     embedding bag per field (mean, sparse gradients) and a bottom MLP on the dense features, their
          pairwise dot products, top MLP -> one logit (bench/ps_ctr_peer.py)

Left as PyTorch's defaults (they change neither the time nor the memory measured): the initialisation
(ration's gpt uses nanoGPT's N(0, 0.02)) and GPT's parameter names (ration: blocks.i.mlp.fc/proj).

This module imports torch: a peer that measures memory imports it after peer_probe.install().
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def loss(model, x, targets):
    """Mean cross-entropy of model(x) against targets: classes (B,), or tokens (B, T) for logits (B, T, V)."""
    logits = model(x)
    if logits.dim() == 2:
        return F.cross_entropy(logits, targets)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class MLP(nn.Module):  # configs/mlp.toml: hidden [256, 128], dropout 0.1
    def __init__(self, hidden=(256, 128), dropout=0.1):
        super().__init__()
        widths = [784] + list(hidden)
        self.hidden = nn.ModuleList([nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])])
        self.out = nn.Linear(widths[-1], 10)
        self.p = dropout

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.hidden:
            x = F.dropout(F.relu(layer(x)), self.p, self.training)
        return self.out(x)


class CNN(nn.Module):  # configs/cnn.toml: channels [32, 64], fc_hidden 128, kernel 3, dropout 0.25
    def __init__(self, channels=(32, 64), fc_hidden=128, kernel_size=3, dropout=0.25):
        super().__init__()
        k, ch, blocks = kernel_size, 1, []
        for out in channels:
            blocks += [nn.Conv2d(ch, out, k, padding=k // 2), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
            ch = out
        self.blocks = nn.Sequential(*blocks)
        side = 28 // (2 ** len(channels))
        self.fc = nn.Linear(ch * side * side, fc_hidden)
        self.out = nn.Linear(fc_hidden, 10)
        self.p = dropout

    def forward(self, x):
        x = self.blocks(x).flatten(1)
        return self.out(F.dropout(F.relu(self.fc(x)), self.p, self.training))


class Attention(nn.Module):
    def __init__(self, c, h, p):
        super().__init__()
        self.h, self.p = h, p
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x, mask=None):
        """x (B, T, C); mask: bool (T, T), True where a query may not look; None: causal, built here."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if mask is None:
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal if mask is None else mask, float("-inf")).softmax(-1)
        att = F.dropout(att, self.p, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.proj(y), self.p, self.training)


class Block(nn.Module):
    def __init__(self, c, h, p):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.attn = Attention(c, h, p)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.p = p

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + F.dropout(self.mlp_proj(F.gelu(self.fc(self.ln2(x)))), self.p, self.training)


def window_mask(t, window, device=None):
    """bool (T, T), True where a query may not look: the future, and with window > 0 what lies more than
    `window` steps back."""
    ones = torch.ones(t, t, dtype=torch.bool, device=device)
    mask = ones.triu(1)
    if window > 0:
        mask = mask | ones.tril(-window - 1)
    return mask


class GPT(nn.Module):  # configs/gpt.toml: vocab 256, 4 layers, 4 heads, 128 wide, block 128, dropout 0.1
    def __init__(self, vocab=256, n_layer=4, n_head=4, n_embd=128, block_size=128, dropout=0.1,
                 checkpoint_blocks=False, window=0):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.p = dropout
        self.block_size = block_size
        self.ckpt = checkpoint_blocks
        self.window = window

    def forward(self, idx, mask=None):
        """idx (B, T) -> logits (B, T, V). mask: one bool (T, T) mask for every block (window_mask); None:
        each block builds the causal one. A sequence longer than block_size needs window > 0."""
        b, t = idx.shape
        pos = torch.arange(t, device=idx.device)
        if self.window > 0:
            pos = pos % self.block_size
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.p, self.training)
        for blk in self.blocks:
            x = checkpoint(blk, x, mask, use_reentrant=False) if self.ckpt else blk(x, mask)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


class LSTMLM(nn.Module):  # configs/lstm_lm.toml: vocab 256, embed 64, 2 x LSTM 128, dropout 0
    def __init__(self, vocab=256, n_embd=64, hidden_size=128, n_layer=2, dropout=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, n_embd)
        self.lstm = nn.LSTM(n_embd, hidden_size, n_layer, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden_size, vocab)
        self.p = dropout

    def forward(self, idx):
        h, _ = self.lstm(self.embed(idx))
        return self.head(F.dropout(h, self.p, self.training))


class Gated(nn.Module):
    def __init__(self, c, k, d):
        super().__init__()
        self.pad = (k - 1) * d
        self.conv = nn.Conv1d(c, 2 * c, k, dilation=d)
        self.out = nn.Linear(c, c)

    def forward(self, x):  # (B, T, C)
        y = self.conv(F.pad(x.transpose(1, 2), (self.pad, 0))).transpose(1, 2)
        a, b = y.chunk(2, -1)
        return x + self.out(torch.tanh(a) * torch.sigmoid(b))


class TCNLM(nn.Module):  # configs/tcn_lm.toml: vocab 256, embed 96, 6 gated blocks, kernel 3, dilations 1..32
    def __init__(self, vocab=256, n_embd=96, n_layer=6, kernel_size=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, n_embd)
        self.blocks = nn.ModuleList([Gated(n_embd, kernel_size, 2 ** i) for i in range(n_layer)])
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln(h))


class CTR(nn.Module):  # ctr (configs/ctr*.toml): DLRM-style embedding bags, bottom/top MLPs, pairwise dots
    """sizes: rows per field; ids/offsets per field as nn.EmbeddingBag takes them; dense (B, 1) -> logits (B,)."""

    def __init__(self, sizes, dim, bottom, top):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(s, dim, mode="mean", sparse=True) for s in sizes)
        for t in self.tables:
            nn.init.uniform_(t.weight, -0.01, 0.01)
        layers, w = [], 1
        for h in bottom + [dim]:
            layers += [nn.Linear(w, h), nn.ReLU()]
            w = h
        self.bottom = nn.Sequential(*layers)
        v = len(sizes) + 1
        w = dim + v * (v - 1) // 2
        layers = []
        for h in top:
            layers += [nn.Linear(w, h), nn.ReLU()]
            w = h
        layers.append(nn.Linear(w, 1))
        self.top = nn.Sequential(*layers)
        self.iu = torch.triu_indices(v, v, 1)

    def forward(self, ids, offsets, dense):
        x = self.bottom(dense)
        t = torch.stack([x] + [tab(i, o) for tab, i, o in zip(self.tables, ids, offsets)], 1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([x, z], 1)).view(-1)


class BiRNNTagger(nn.Module):  # configs/birnn_tagger.toml: vocab 256, embed 64, causal conv k 3, bi-GRU 64, head
    def __init__(self, vocab=256, n_embd=64, hidden_size=64, kernel_size=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, n_embd)
        self.k = kernel_size
        self.front = nn.Conv1d(n_embd, n_embd, kernel_size)
        self.birnn = nn.GRU(n_embd, hidden_size, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden_size, vocab)

    def forward(self, idx):
        x = self.embed(idx).transpose(1, 2)  # (B, C, T)
        x = torch.tanh(self.front(F.pad(x, (self.k - 1, 0)))).transpose(1, 2)  # causal: (B, T, C)
        return self.head(self.birnn(x)[0])
