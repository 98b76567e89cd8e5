import os

import numpy as np
import pytest
import torch
from hypothesis import settings

from taciturn.experiments.config import RunConfig, validate

# Property tests are derandomised: the same examples on every run of `make test` (a failure
# reproduces); `make soak` (TACITURN_FUZZ_SCALE) multiplies the fuzz suite's examples.
settings.register_profile("taciturn", derandomize=True, deadline=None)
settings.load_profile("taciturn")
FUZZ_SCALE = int(os.environ.get("TACITURN_FUZZ_SCALE", "1"))


def fuzz_examples(n: int) -> int:
    return n * FUZZ_SCALE


def tiny_config(**overrides) -> RunConfig:
    """A run that takes a second: synthetic data, 8 clients, logistic regression."""
    tree = {
        "name": "tiny",
        "seed": 3,
        "rounds": 6,
        "data": {"dataset": "synthetic", "num_samples": 400, "num_features": 10, "num_classes": 3},
        "partition": {"kind": "dirichlet", "num_clients": 8, "alpha": 1.0, "min_size": 5},
        "model": {"kind": "logreg"},
        "algorithm": {"name": "fedavg", "fraction": 0.5, "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        "eval": {"every": 1},
        "checkpoint": {"every": 2},
        "engine": {"executor": "sequential"},
    }
    for dotted, value in overrides.items():
        *parents, last = dotted.split("__")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return validate(tree, "<test>")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("TACITURN_OFFLINE", "1")
    torch.set_num_threads(1)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
