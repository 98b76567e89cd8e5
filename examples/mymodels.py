"""A model and data for a config file: taciturn imports them by name (examples/plugin.toml)."""

import torch
from torch import nn


def net(hidden=32):
    return nn.Sequential(nn.Linear(20, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 4))


def blobs(n=1200):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :4] * 2).argmax(dim=1)
    return x[:1000], y[:1000], x[1000:], y[1000:]  # train and test tensors
