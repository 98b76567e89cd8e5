"""What every implementation in the speed benchmark shares: data, model, the exact plan of SGD
steps, evaluation and the result record. Runs in any venv with torch and numpy (taciturn is not
imported, so Flower and pfl run in their own environments).

The plan (plan.npz, written by benchmarks/speed.py from taciturn's own seeded streams) fixes
which clients train in which round and, for each of them, the order in which it visits its
samples; batches are consecutive chunks of ``batch_size`` (the last one partial). init.npz holds
the initial weights under nn.Sequential names. Every implementation therefore takes exactly the
same SGD steps from the same start, and must end at the same accuracy up to rounding.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

T0 = time.perf_counter()
DATA = Path(os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
MEAN, STD = 0.2860, 0.3530


def _idx(name: str) -> np.ndarray:
    raw = gzip.decompress((DATA / name).read_bytes())
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(dims)


@lru_cache(maxsize=1)
def fashion_mnist() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def images(name):
        return (torch.from_numpy(_idx(name).copy()).float().div_(255).sub_(MEAN).div_(STD)).unsqueeze(1)

    def labels(name):
        return torch.from_numpy(_idx(name).astype(np.int64))

    return (
        images("train-images-idx3-ubyte.gz"),
        labels("train-labels-idx1-ubyte.gz"),
        images("t10k-images-idx3-ubyte.gz"),
        labels("t10k-labels-idx1-ubyte.gz"),
    )


class Plan:
    def __init__(self, folder: str | Path):
        folder = Path(folder)
        with np.load(folder / "plan.npz", allow_pickle=False) as plan:
            self.round_clients = plan["round_clients"]  # (rounds, clients per round)
            self.order = plan["order"]  # sample ids, client after client, round after round
            self.offsets = plan["offsets"]  # slot k of round r: order[offsets[r*K+k]:offsets[r*K+k+1]]
        self.meta = json.loads((folder / "plan.json").read_text())
        self.rounds, self.per_round = self.round_clients.shape
        self.batch_size = self.meta["batch_size"]
        self.lr = self.meta["lr"]
        with np.load(folder / "init.npz", allow_pickle=False) as init:
            self.init = {k: torch.from_numpy(init[k].copy()) for k in init.files}

    def samples(self, round: int, slot: int) -> np.ndarray:
        """Sample ids client ``slot`` of ``round`` (0-based) visits, in order."""
        i = round * self.per_round + slot
        return self.order[self.offsets[i] : self.offsets[i + 1]]

    def client_data(self, round: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, _, _ = fashion_mnist()
        idx = torch.from_numpy(self.samples(round, slot))
        return x[idx], y[idx]

    def model(self) -> nn.Module:
        """The planned architecture with the planned initial weights."""
        kind = self.meta["model"]
        if kind == "mlp":
            layers, width = [nn.Flatten()], 784
            for h in self.meta["hidden"]:
                layers += [nn.Linear(width, h), nn.ReLU()]
                width = h
            layers.append(nn.Linear(width, 10))
        else:  # the 2-conv CNN without padding
            layers = [
                nn.Conv2d(1, 32, 5),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 5),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(1024, 512),
                nn.ReLU(),
                nn.Linear(512, 10),
            ]
        model = nn.Sequential(*layers)
        model.load_state_dict(self.init)
        return model

    def evaluate_now(self, round: int) -> bool:
        """Evaluate after 1-based round ``round``?"""
        return round % self.meta["eval_every"] == 0 or round == self.rounds


def local_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, lr: float) -> None:
    """Plain SGD over consecutive batches of (x, y), which are already in the planned order."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for start in range(0, len(x), batch):
        optimizer.zero_grad()
        F.cross_entropy(model(x[start : start + batch]), y[start : start + batch]).backward()
        optimizer.step()


@torch.no_grad()
def evaluate(model: nn.Module, batch: int = 1000) -> dict[str, float]:
    _, _, x, y = fashion_mnist()
    correct, loss = 0, 0.0
    for start in range(0, len(y), batch):
        out = model(x[start : start + batch])
        loss += F.cross_entropy(out, y[start : start + batch], reduction="sum").item()
        correct += (out.argmax(1) == y[start : start + batch]).sum().item()
    return {"accuracy": correct / len(y), "loss": loss / len(y)}


def write_result(path: str, record: dict) -> None:
    record = {**record, "internal_s": time.perf_counter() - T0}
    Path(path).write_text(json.dumps(record, indent=1))
