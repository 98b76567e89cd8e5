"""A map-style torch Dataset of (x, y) items, a regression loss and a metric of your own."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import taciturn


class Sines(Dataset):
    """y = sin(3 x): items are (x, y) pairs, as torch.utils.data expects."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, 1, generator=g) * 2 - 1
        self.y = torch.sin(3 * self.x)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def mae(outputs, targets):
    return (outputs - targets).abs().mean(dim=1)  # per sample: averaged over the test set


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
config = {
    "rounds": 10,
    "partition": {"kind": "iid", "num_clients": 10},
    "algorithm": {"fraction": 0.5, "local": {"epochs": 10, "lr": 0.05, "momentum": 0.9}},
}
result = taciturn.run(
    config,
    model=model,
    data=(Sines(800, 1), Sines(200, 2)),
    loss=F.mse_loss,
    metrics={"mae": mae},
    out="runs/sines",
    overwrite=True,
)
print([round(row["mae"], 3) for row in result.metrics])
