"""A model and data for a config file: taciturn imports them by name (examples/plugin.toml,
examples/clients.toml)."""

import torch
from torch import nn


def net(hidden=32):
    return nn.Sequential(nn.Linear(20, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 4))


def blobs(n=1200):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :4] * 2).argmax(dim=1)
    return x[:1000], y[:1000], x[1000:], y[1000:]  # train and test tensors


def sites(sizes=(150, 300, 450)):
    """Three clients' own data, of different sizes: one (x_train, y_train, x_test, y_test) each."""
    g = torch.Generator().manual_seed(1)
    clients = []
    for n in sizes:
        x = torch.randn(n + n // 5, 20, generator=g)
        y = (x[:, :4] * 2).argmax(dim=1)
        clients.append((x[:n], y[:n], x[n:], y[n:]))  # the last fifth: the client's held-out split
    return clients
