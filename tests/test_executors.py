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
    {"name": "fedavg"},  # plain SGD on a ReLU network: the vectorized executor's low-rank path
    {"name": "fedprox", "mu": 0.1},
    {"name": "scaffold", "local": {"momentum": 0.5}},
    {"name": "scaffold", "option": "I"},
    {"name": "fedadmm", "rho": 0.1},
    {"name": "event_admm", "rho": 0.1, "delta": 0.05, "local": {"momentum": 0.9}},
]


def run(tmp_path, executor_class, algorithm, rounds=3, store="memory", model=None):
    tmp_path = tmp_path / executor_class.__name__ if hasattr(executor_class, "__name__") else tmp_path / "x"
    config = tiny_config(
        engine={"executor": "sequential", "store": store},
        model=model or {"kind": "logreg"},
        algorithm={
            "fraction": 0.5,
            **algorithm,
            "local": {"epochs": 2, "batch_size": 16, **algorithm.get("local", {})},
        },
    )
    exp = prepare(config, tmp_path)
    pipeline = exp.federation.executor.pipeline
    exp.federation.executor = executor_class(pipeline)
    state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
    reports = []
    try:
        for r in range(1, rounds + 1):
            state, report = exp.federation.run_round(state, r)
            reports.append(report)
    finally:
        exp.federation.executor.close()
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


@pytest.mark.parametrize("hidden", [[16], [16, 8]])
def test_low_rank_path_agrees_with_sequential_on_mlps(tmp_path, hidden):
    from taciturn.engine import lowrank

    mlp = {"kind": "mlp", "hidden": hidden}
    algorithm = {"name": "fedavg", "fraction": 1.0, "local": {"lr": 0.2}}
    reference, _, _ = run(tmp_path, SequentialExecutor, algorithm, model=mlp)
    calls = []
    original = lowrank.train_group
    lowrank.train_group = lambda *a: calls.append(1) or original(*a)
    try:
        vectorized, _, _ = run(tmp_path, VectorizedExecutor, algorithm, model=mlp)
    finally:
        lowrank.train_group = original
    assert calls  # the low-rank path was taken
    for name in reference:
        torch.testing.assert_close(vectorized[name], reference[name], **TOLERANCE)


def test_clients_with_fewer_steps_are_masked_not_padded(tmp_path):
    """Dirichlet clients have different sizes, hence different step counts; each takes exactly its own."""
    reference, _, pipe = run(tmp_path, SequentialExecutor, {"name": "fedavg", "fraction": 1.0}, rounds=1)
    vectorized, _, _ = run(tmp_path, VectorizedExecutor, {"name": "fedavg", "fraction": 1.0}, rounds=1)
    assert len({pipe.data.client_size(c) for c in range(8)}) > 1  # the premise: unequal clients
    for name in reference:
        torch.testing.assert_close(vectorized[name], reference[name], **TOLERANCE)


def parallel(workers):
    from taciturn.engine.parallel import ParallelExecutor

    def make(pipeline):
        return ParallelExecutor(pipeline, workers)

    make.__name__ = f"parallel{workers}"
    return make


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a["name"] + str(len(a)))
def test_parallel_agrees_with_sequential(tmp_path, algorithm):
    reference, ref_reports, ref_pipe = run(tmp_path, SequentialExecutor, algorithm, store="disk")
    result, reports, pipe = run(tmp_path, parallel(2), algorithm, store="disk")
    for name in reference:
        torch.testing.assert_close(result[name], reference[name], **TOLERANCE)
    for a, b in zip(ref_reports, reports, strict=True):
        assert (a.selected, a.accepted, a.failed) == (b.selected, b.accepted, b.failed)
    assert [r["messages_sent"] for r in ref_pipe.channel.ledger.rows()] == [
        r["messages_sent"] for r in pipe.channel.ledger.rows()
    ]
    for client in ref_pipe.store.clients():  # workers wrote client state where the server can read it
        for key, value in ref_pipe.store.get(client).items():
            torch.testing.assert_close(pipe.store.get(client)[key], value, **TOLERANCE)


def test_parallel_refuses_client_state_it_cannot_share(tmp_path):
    from taciturn.engine.parallel import ParallelExecutor

    exp = prepare(tiny_config(algorithm={"name": "scaffold"}), tmp_path)
    with pytest.raises(ValueError, match="disk store"):
        ParallelExecutor(exp.federation.executor.pipeline, 2)


def test_balance_spreads_work_evenly():
    from taciturn.engine.parallel import balance

    shares = balance([3, 1, 4, 5, 9], [10, 50, 20, 30, 40], 2)
    loads = [sum({3: 10, 1: 50, 4: 20, 5: 30, 9: 40}[c] for c in share) for share in shares]
    assert sorted(c for share in shares for c in share) == [1, 3, 4, 5, 9]
    assert max(loads) - min(loads) <= 10


@pytest.mark.parametrize(
    ("timing", "cores", "clients", "expected"),
    [
        ({"all_threads": 1.0, "one_thread": 1.9}, 2, 10, "sequential"),  # threads already scale
        ({"all_threads": 1.0, "one_thread": 1.2}, 2, 10, "parallel"),  # they do not: use processes
        ({"all_threads": 1.0, "one_thread": 1.2}, 1, 10, "sequential"),  # one core
        ({"all_threads": 1.0, "one_thread": 1.2}, 2, 1, "sequential"),  # one client a round
    ],
)
def test_executor_choice_follows_the_measurements(monkeypatch, timing, cores, clients, expected):
    from taciturn.engine import choice

    timing = {k: v * 1e-3 for k, v in timing.items()}
    monkeypatch.setattr(choice, "_probe", lambda *a: timing)
    monkeypatch.setattr(choice, "available_cores", lambda: cores)
    picked = choice.choose(None, (torch.zeros(1),), clients, steps=20, vectorized=True)
    assert picked.executor == expected
    assert picked.reason  # always says why


def test_auto_engine_runs_and_logs_its_choice(tmp_path):
    from taciturn.experiments.runner import start

    rundir = start(tiny_config(engine={"executor": "auto"}, rounds=2), tmp_path / "run", progress=False)
    assert "executor:" in rundir.log.read_text()
    assert rundir.read_metrics()[-1]["round"] == 2
