"""Federate your own nn.Module on your own tensors, then export the trained model and reload it."""

import torch
from safetensors.torch import load_file
from torch import nn

import taciturn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.layers(x)


torch.manual_seed(0)
x = torch.randn(1200, 20)
y = (x[:, :4] * 2).argmax(dim=1)  # four classes
data = taciturn.data.from_tensors(x[:1000], y[:1000], x[1000:], y[1000:])  # train, then test
config = {"rounds": 10, "partition": {"kind": "dirichlet", "num_clients": 20, "alpha": 1.0}}
config["algorithm"] = {"fraction": 0.5, "local": {"epochs": 5, "lr": 0.1}}
result = taciturn.run(config, model=Net(), data=data, out="runs/own_model", overwrite=True)
print(result.metrics[-1]["accuracy"], result.dir)  # also: runs/own_model/report.html

taciturn.export(result.dir, "runs/own_model.safetensors", overwrite=True)  # as `taciturn export`
model = Net()
model.load_state_dict(load_file("runs/own_model.safetensors"))  # your class, your names
