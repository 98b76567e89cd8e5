"""Local training as in PyTorch: SCAFFOLD on a BatchNorm model with AdamW, learning-rate schedules and
bf16 autocast; the best model kept, early stopping, TensorBoard."""

import torch
from torch import nn

import taciturn

torch.manual_seed(0)
x = torch.randn(1200, 20)
y = (x[:, :4] * 2).argmax(dim=1)
data = taciturn.data.from_tensors(x[:1000], y[:1000], x[1000:], y[1000:])
model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
config = {
    "rounds": 12,
    "partition": {"kind": "dirichlet", "num_clients": 20, "alpha": 1.0},
    "algorithm": {
        "name": "scaffold",  # any algorithm federates BatchNorm: its math on the weights
        "fraction": 0.5,
        "server_schedule": {"kind": "cosine", "final": 0.5},  # the server learning rate over rounds
        "local": {
            "epochs": 2,
            "optimizer": "adamw",  # sgd | adam | adamw, with their options
            "lr": 0.01,
            "weight_decay": 0.01,
            "optimizer_state": "keep",  # Adam's moments are client state (default: reset each round)
            "schedule": {"kind": "cosine", "warmup": 2},  # over each round's local steps
            "round_schedule": {"kind": "exponential", "gamma": 0.97},  # the local lr over rounds
            "precision": "bf16",  # torch.autocast of the forward pass
        },
    },
    "checkpoint": {"best": "accuracy"},  # keep the most accurate model in runs/training/best/
    "stop": {"metric": "loss", "patience": 2, "min_delta": 0.01},  # end when the loss stalls
    "tracking": {"tensorboard": True},  # and "mlflow": True, with taciturn[mlflow]
}
result = taciturn.run(config, model=model, data=data, out="runs/training", overwrite=True, progress=False)
print(result.metrics[-1]["round"], max(row["accuracy"] for row in result.metrics))
best = result.best_model  # your Net with the weights of the best evaluation
taciturn.export(result.dir, "runs/training-best.safetensors", best=True, overwrite=True)  # export --best
