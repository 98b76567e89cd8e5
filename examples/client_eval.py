"""Client-side evaluation: the global model on sampled clients' own held-out data, and how its
accuracy spreads over clients (the numbers federated papers report beside the global test set)."""

import torch
from torch import nn

import taciturn

torch.manual_seed(0)
x = torch.randn(1200, 20)
y = (x[:, :4] * 2).argmax(dim=1)
data = taciturn.data.from_tensors(x[:1000], y[:1000], x[1000:], y[1000:])
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
config = {
    "rounds": 8,
    "partition": {"kind": "dirichlet", "num_clients": 20, "alpha": 0.3},  # strong label skew
    "algorithm": {"fraction": 0.5, "local": {"epochs": 2, "lr": 0.1}},
    "eval": {"clients": 0.5, "client_holdout": 0.2},  # 10 clients score on a fifth of their data
}
result = taciturn.run(config, model=model, data=data, out="runs/client_eval", overwrite=True, progress=False)
last = result.metrics[-1]
print(last["accuracy"], last["client_accuracy"], last["client_accuracy_p10"], last["client_accuracy_min"])
print(last["client_accuracy_by_client"])  # {client id: its accuracy}; the plot is in report.html
