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
    # issue 44: Adam kept across rounds with schedules over steps and rounds; AdamW; Nesterov; bf16
    {
        "name": "fedavg",
        "local": {
            "optimizer": "adam",
            "optimizer_state": "keep",
            "schedule": {"kind": "cosine", "warmup": 1},
            "round_schedule": {"kind": "step", "gamma": 0.5},
        },
    },
    {"name": "scaffold", "local": {"optimizer": "adamw", "weight_decay": 0.1, "clip_norm": 0.5}},
    {"name": "fedprox", "mu": 0.1, "local": {"momentum": 0.9, "nesterov": True, "optimizer_state": "keep"}},
]


def run(tmp_path, executor_class, algorithm, rounds=3, store="memory", model=None, channel=None):
    tmp_path = tmp_path / executor_class.__name__ if hasattr(executor_class, "__name__") else tmp_path / "x"
    config = tiny_config(
        engine={"executor": "sequential", "store": store},
        channel=channel or {},
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
@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("train_group", {}),
        ("train_each", {}),
        ("train_each", {"momentum": 0.9, "weight_decay": 1e-3}),
    ],
    ids=["low-rank", "fused", "fused-momentum-decay"],
)
def test_written_out_mlp_algebra_agrees_with_sequential(tmp_path, monkeypatch, hidden, path, local):
    """Low-rank across clients (plain SGD, where it pays) and fused per-client steps (otherwise)."""
    from taciturn.engine import lowrank, mlp_steps

    mlp = {"kind": "mlp", "hidden": hidden}
    algorithm = {"name": "fedavg", "fraction": 1.0, "local": {"lr": 0.2, **local}}
    reference, ref_reports, _ = run(tmp_path, SequentialExecutor, algorithm, model=mlp)
    module = lowrank if path == "train_group" else mlp_steps
    calls, original = [], getattr(module, path)
    monkeypatch.setattr(module, path, lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(lowrank, "pays", lambda *a: path == "train_group")
    vectorized, reports, _ = run(tmp_path, VectorizedExecutor, algorithm, model=mlp)
    assert calls  # the path under test was taken
    for name in reference:
        torch.testing.assert_close(vectorized[name], reference[name], **TOLERANCE)
    for a, b in zip(ref_reports, reports, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-5)


def test_clients_with_fewer_steps_are_masked_not_padded(tmp_path):
    """Dirichlet clients have different sizes, hence different step counts; each takes exactly its own."""
    reference, _, pipe = run(tmp_path, SequentialExecutor, {"name": "fedavg", "fraction": 1.0}, rounds=1)
    vectorized, _, _ = run(tmp_path, VectorizedExecutor, {"name": "fedavg", "fraction": 1.0}, rounds=1)
    assert len({pipe.data.client_size(c) for c in range(8)}) > 1  # the premise: unequal clients
    for name in reference:
        torch.testing.assert_close(vectorized[name], reference[name], **TOLERANCE)


def parallel(workers, vectorized=False):
    from taciturn.engine.parallel import ParallelExecutor

    def make(pipeline):
        return ParallelExecutor(pipeline, workers, vectorized=vectorized)

    make.__name__ = f"parallel{workers}{'_vectorized' if vectorized else ''}"
    return make


@pytest.mark.parametrize(
    ("algorithm", "model"),
    [
        ({"name": "fedavg", "local": {"lr": 0.2}}, {"kind": "mlp", "hidden": [16]}),  # low-rank per worker
        ({"name": "scaffold", "local": {"momentum": 0.5}}, None),  # vmap in each worker, state on disk
    ],
    ids=["fedavg-mlp", "scaffold"],
)
def test_parallel_vectorized_agrees_with_sequential(tmp_path, algorithm, model):
    reference, ref_reports, _ = run(tmp_path, SequentialExecutor, algorithm, store="disk", model=model)
    result, reports, _ = run(tmp_path, parallel(2, vectorized=True), algorithm, store="disk", model=model)
    for name in reference:
        torch.testing.assert_close(result[name], reference[name], **TOLERANCE)
    for a, b in zip(ref_reports, reports, strict=True):
        assert (a.selected, a.accepted, a.failed) == (b.selected, b.accepted, b.failed)


def test_vectorized_trains_a_round_in_one_group_whatever_the_parameter_order(tmp_path):
    """Decoded messages once came back in hash order, which split every round into groups of one."""
    from taciturn.engine import vectorized

    exp = prepare(tiny_config(model={"kind": "mlp", "hidden": [4]}), tmp_path)
    params = exp.task.init_params(torch.Generator().manual_seed(0))
    backwards = dict(reversed(list(params.items())))
    works = [(None, vectorized.LocalTraining(params=p, consts={})) for p in (params, backwards, params)]
    assert list(vectorized._groups(works).values()) == [[0, 1, 2]]


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
        ({"all_threads": 1.0, "one_thread": 2.1}, 2, 10, "sequential"),  # threads already scale
        ({"all_threads": 1.0, "one_thread": 1.9}, 2, 10, "parallel"),  # a small saving is still tried
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


@pytest.mark.parametrize(
    ("one_thread", "cores", "expected"),
    [(1.2, 2, "parallel_vectorized"), (2.1, 2, "vectorized"), (1.2, 1, "vectorized")],
)
@pytest.mark.parametrize("algebra", ["low-rank", "fused"])
def test_plain_mlp_sgd_runs_as_written_out_algebra(monkeypatch, one_thread, cores, expected, algebra):
    from taciturn.engine import choice

    monkeypatch.setattr(choice, "_probe", lambda *a: {"all_threads": 1e-3, "one_thread": one_thread * 1e-3})
    monkeypatch.setattr(choice, "available_cores", lambda: cores)
    picked = choice.choose(None, (torch.zeros(1),), 50, steps=6, vectorized=True, mlp_algebra=algebra)
    assert (picked.executor, picked.workers) == (expected, 2 if expected.startswith("parallel") else 0)
    assert algebra.split("-")[0] in picked.reason


def test_low_rank_pays_while_corrections_cost_less_than_dense_products(tmp_path):
    """784-200-200-10: dense 198,800 multiply-adds a row; corrections s/2 * 1,594: break-even s = 249.4."""
    from taciturn.engine import lowrank

    config = tiny_config(
        data={"dataset": "synthetic", "num_samples": 400, "num_features": 784, "num_classes": 10},
        model={"kind": "mlp", "hidden": [200, 200]},
    )
    exp = prepare(config, tmp_path)
    assert lowrank.applies(exp.algorithm, exp.task)
    assert lowrank.pays(exp.task, 249) and not lowrank.pays(exp.task, 250)


def test_auto_engine_runs_and_logs_its_choice(tmp_path):
    from taciturn.experiments.runner import start

    rundir = start(tiny_config(engine={"executor": "auto"}, rounds=2), tmp_path / "run", progress=False)
    assert "executor:" in rundir.log.read_text()
    assert rundir.read_metrics()[-1]["round"] == 2


def test_auto_engine_picks_the_low_rank_workers_for_a_small_client_mlp(tmp_path, monkeypatch):
    from taciturn.engine import choice
    from taciturn.engine.trial import MIN_ROUNDS
    from taciturn.experiments.runner import start

    monkeypatch.setattr(choice, "available_cores", lambda: 2)
    monkeypatch.setattr(choice, "_probe", lambda *a: {"all_threads": 1e-2, "one_thread": 1.2e-2})
    config = tiny_config(  # 8 samples a round against layers 10-256-3: the corrections cost less
        engine={"executor": "auto"},
        model={"kind": "mlp", "hidden": [256]},
        algorithm={"name": "fedavg", "fraction": 0.5, "local": {"steps": 1, "batch_size": 8}},
        rounds=MIN_ROUNDS,
    )
    rundir = start(config, tmp_path / "run", progress=False)
    log = rundir.log.read_text()
    assert "executor: vectorized or parallel_vectorized with 2 workers" in log and "low-rank algebra" in log
    assert "executor trial" in log  # the first rounds measured both (tests/test_trial.py)
    assert rundir.read_metrics()[-1]["round"] == MIN_ROUNDS


@pytest.mark.parametrize(
    "executor", [VectorizedExecutor, parallel(2), parallel(2, vectorized=True)], ids=lambda e: e.__name__
)
def test_every_executor_commits_exactly_the_accepted_clients_state(tmp_path, executor):
    """Under drops, each executor stores the new control variates of the clients whose uplink arrived,
    and only theirs, as the sequential executor does (whose semantics tests/test_acceptance.py checks)."""
    algorithm = {"name": "scaffold", "fraction": 1.0}
    lossy = {"drop_up": 0.4, "drop_down": 0.2}
    reference, ref_reports, ref_pipe = run(tmp_path, SequentialExecutor, algorithm, 4, "disk", channel=lossy)
    result, reports, pipe = run(tmp_path, executor, algorithm, 4, "disk", channel=lossy)
    assert any(len(r.accepted) < len(r.selected) for r in ref_reports)  # the premise: uplinks were lost
    for a, b in zip(ref_reports, reports, strict=True):
        assert (a.selected, a.accepted) == (b.selected, b.accepted)
    assert list(pipe.store.clients()) == list(ref_pipe.store.clients())
    for client in ref_pipe.store.clients():
        for key, value in ref_pipe.store.get(client).items():
            torch.testing.assert_close(pipe.store.get(client)[key], value, **TOLERANCE)
    for name in reference:
        torch.testing.assert_close(result[name], reference[name], **TOLERANCE)
