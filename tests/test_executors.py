"""Every executor agrees with the sequential reference."""

import pytest
import torch

from taciturn.core.rng import SERVER
from taciturn.engine.executor import SequentialExecutor
from taciturn.engine.vectorized import VectorizedExecutor
from taciturn.experiments.runner import prepare
from tests.conftest import tiny_config

# Float32 sums in another order: vmap/bmm against a per-client loop.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

ALGORITHMS = [
    {"name": "fedavg", "local": {"momentum": 0.9, "clip_norm": 0.5, "weight_decay": 1e-3}},
    {"name": "fedprox", "mu": 0.1},
    {"name": "scaffold", "local": {"momentum": 0.5}},
    {"name": "scaffold", "option": "I"},
    {"name": "fedadmm", "rho": 0.1},
    {"name": "event_admm", "rho": 0.1, "delta": 0.05, "local": {"momentum": 0.9}},
]


def run(tmp_path, executor_class, algorithm, rounds=3):
    config = tiny_config(
        algorithm={
            "fraction": 0.5,
            **algorithm,
            "local": {"epochs": 2, "batch_size": 16, **algorithm.get("local", {})},
        }
    )
    exp = prepare(config, tmp_path)
    pipeline = exp.federation.executor.pipeline
    exp.federation.executor = executor_class(pipeline)
    state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
    reports = []
    for r in range(1, rounds + 1):
        state, report = exp.federation.run_round(state, r)
        reports.append(report)
    return exp.algorithm.global_params(state), reports, pipeline


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a["name"] + str(len(a)))
def test_vectorized_agrees_with_sequential(tmp_path, algorithm):
    reference, ref_reports, ref_pipe = run(tmp_path, SequentialExecutor, algorithm)
    vectorized, vec_reports, vec_pipe = run(tmp_path, VectorizedExecutor, algorithm)
    for name in reference:
        torch.testing.assert_close(vectorized[name], reference[name], **TOLERANCE)
    for a, b in zip(ref_reports, vec_reports, strict=True):
        assert (a.selected, a.accepted, a.failed) == (b.selected, b.accepted, b.failed)
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-4)
    # Same traffic; uplink sizes may differ by a few bytes where train_loss prints more digits.
    for a, b in zip(ref_pipe.channel.ledger.rows(), vec_pipe.channel.ledger.rows(), strict=True):
        assert {k: v for k, v in a.items() if "bytes" not in k} == {
            k: v for k, v in b.items() if "bytes" not in k
        }
        assert abs(a["bytes_sent"] - b["bytes_sent"]) <= 16
    for client in ref_pipe.store.clients():
        for key, value in ref_pipe.store.get(client).items():
            torch.testing.assert_close(vec_pipe.store.get(client)[key], value, **TOLERANCE)


def test_clients_with_fewer_steps_are_masked_not_padded(tmp_path):
    """Dirichlet clients have different sizes, hence different step counts; each takes exactly its own."""
    reference, _, pipe = run(tmp_path, SequentialExecutor, {"name": "fedavg", "fraction": 1.0}, rounds=1)
    vectorized, _, _ = run(tmp_path, VectorizedExecutor, {"name": "fedavg", "fraction": 1.0}, rounds=1)
    assert len({pipe.data.client_size(c) for c in range(8)}) > 1  # the premise: unequal clients
    for name in reference:
        torch.testing.assert_close(vectorized[name], reference[name], **TOLERANCE)
