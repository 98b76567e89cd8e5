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


@pytest.fixture(autouse=True, scope="session")
def _own_key(tmp_path_factory):
    """The key that signs run folders (core/signing.py) lives in a temporary folder, never in the
    real user's config directory; subprocesses the tests start inherit it."""
    os.environ["TACITURN_KEY_DIR"] = str(tmp_path_factory.mktemp("signing-key"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("TACITURN_OFFLINE", "1")
    torch.set_num_threads(1)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def forge_manifest(run) -> None:
    """What someone who edits a run folder and wants it to pass can do: recompute the SHA-256 of
    every file manifest.json lists (without the owner's key, the MAC goes)."""
    import hashlib
    import json
    from pathlib import Path

    path = Path(run) / "manifest.json"
    if not path.exists():  # (the run folders of taciturn before issue 40 had none)
        return
    tree = json.loads(path.read_text())
    for name, entry in tree["files"].items():
        file = Path(run) / name
        if "sha256" in entry and file.is_file():
            data = file.read_bytes()
            entry |= {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    tree.pop("mac", None)
    path.write_text(json.dumps(tree))


def capture_uplinks(algorithm) -> dict:
    """Wraps algorithm.accumulate so that every arrival's tensors land in the returned dict, by
    client (later rounds overwrite earlier ones); the algorithm aggregates as before."""
    captured = {}
    original = algorithm.accumulate

    def capture(arrivals):
        captured.update({a.client: a.message.tensors() for a in arrivals})
        return original(arrivals)

    algorithm.accumulate = capture
    return captured


# A benchmarks/event_admm.py setting that runs in a second: digits, 10 one-class clients, a tiny MLP.
TINY_EVENT_ADMM_SETTING = {
    "name": "T",
    "quick": True,
    "rounds": 3,
    "data": {"dataset": "digits"},
    "partition": {"kind": "one_class", "num_clients": 10},
    "model": {"kind": "mlp", "hidden": [8]},
    "local": {"epochs": 1, "batch_size": 64, "lr": 0.05, "momentum": 0.0},
    "mu": 0.01,
}
