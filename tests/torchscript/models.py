"""PyTorch modules the TorchScript import tests export (scripts/export_model.py --file this --name X):
a small CNN, a BERT-style encoder (nn.TransformerEncoderLayer), a U-Net-style net with skip connections
and upsampling, an nn.LSTM classifier, a module with two inputs per item, and modules for the error cases."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from typing import Dict


class SmallCNN(nn.Module):
    def __init__(self, channels=8, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.fc = nn.Linear(2 * channels * 4 * 4, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class BertEncoder(nn.Module):
    def __init__(self, vocab=50, dim=32, heads=4, layers=2, num_classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, activation="gelu",
                                        batch_first=True) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[:, : tokens.size(1)]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(1))


class UNetSmall(nn.Module):
    def __init__(self, c=8, num_classes=10):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        self.down2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(inplace=True))
        self.bottom = nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec2 = nn.Sequential(nn.Conv2d(4 * c, c, 3, padding=1), nn.ReLU())
        self.dec1 = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(c, num_classes)

    def forward(self, x):
        d1 = self.down1(x)                        # (B, c, 16, 16)
        d2 = self.down2(F.max_pool2d(d1, 2))      # (B, 2c, 8, 8)
        b = self.bottom(F.max_pool2d(d2, 2))      # (B, 2c, 4, 4)
        u2 = self.dec2(torch.cat([self.up(b), d2], 1))                                # (B, c, 8, 8)
        u1 = self.dec1(torch.cat([F.interpolate(u2, scale_factor=2.0), d1], dim=1))  # (B, c, 16, 16)
        return self.head(F.adaptive_avg_pool2d(u1, 1).flatten(1))


class LSTMClassifier(nn.Module):
    """x (B, T, features) -> classes from the last step's output. Time-major (batch_first=False) transposes
    its input first; bidirectional reads both directions' outputs; `bias=False` drops every bias."""
    def __init__(self, features=6, hidden=16, num_classes=10, bidirectional=False, batch_first=True, bias=True,
                 dropout=0.0):
        super().__init__()
        self.batch_first = batch_first
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=batch_first, bidirectional=bidirectional,
                            bias=bias, dropout=dropout)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)

    def forward(self, x):
        if self.batch_first:
            out, (h, c) = self.lstm(x)
            last = out[:, -1]
        else:
            out, (h, c) = self.lstm(x.transpose(0, 1))
            last = out[-1]
        return self.head(last) + 0.1 * c.sum(0).sum(1, keepdim=True)


class TwoInputs(nn.Module):
    """Two inputs per item: token ids (B, T) and a dense feature vector (B, F); the data file holds
    {"inputs": (tokens, features), "target": y}."""
    def __init__(self, vocab=50, dim=16, features=6, num_classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.tokens = nn.Linear(dim, dim)
        self.dense = nn.Sequential(nn.Linear(features, dim), nn.LayerNorm(dim), nn.GELU())
        self.head = nn.Linear(2 * dim, num_classes)

    def forward(self, tokens, features):
        t = torch.tanh(self.tokens(self.embed(tokens))).mean(1)   # (B, dim)
        return self.head(torch.cat([t, self.dense(features)], 1))  # (B, num_classes)


class ReturnsLoss(nn.Module):
    """forward(inputs, target) returns the scalar loss itself (no model.loss)."""
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x, target):
        return F.cross_entropy(self.fc(x), target)


class NoBackward(nn.Module):
    """Trains through an op libtorch has no derivative for."""
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        h = self.fc(x)
        return torch.nextafter(h, h + 1.0)


class TiedWeights(nn.Module):
    """Two modules sharing one weight tensor (ration refuses it rather than update it twice)."""
    def __init__(self, num_classes=10):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.b.weight = self.a.weight
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(self.b(self.a(x)))


class NeedsPythonObject(nn.Module):
    """forward takes a Python object (a dict of options) besides the tensor: ration cannot call it."""
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x, options: Dict[str, float]):
        return self.fc(x) * options["scale"]
