"""benchmarks/deploy.py's own arithmetic: per-round times from a deployed run's log, intervals and
the paired ratio, and the per-client files it writes from a partition."""

import math

import numpy as np
import pytest

pytest.importorskip("flwr")

from taciturn.data.clients import read_files
from tests.benchmark_module import load_benchmark
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("deploy")


def test_round_times_come_from_the_executors_log_lines(bench, tmp_path):
    executor = "INFO taciturn.deploy.grid_executor"
    (tmp_path / "run.log").write_text(
        "2026-12-05 09:16:40,000 INFO taciturn: run w2: fedavg on clients, rounds 1..3\n"
        f"2026-12-05 09:16:45,500 {executor}: round 1: 10 of 10 picked clients trained\n"
        "2026-12-05 09:16:45,600 INFO taciturn: round 1: accuracy 0.5, loss 1.2, 0.8 MB up\n"
        f"2026-12-05 09:16:49,750 {executor}: round 2: 9 of 10 picked clients trained\n"
        f"2026-12-05 09:16:53,000 {executor}: round 3: 10 of 10 picked clients trained\n"
    )
    assert bench.logged_rounds(tmp_path) == pytest.approx([4.25, 3.25])  # round 1 (warm-up) left out


def test_the_ratio_is_paired_by_round(bench):
    stats = bench.round_stats([4.0, 6.0, 5.0], [2.0, 3.0, 2.5])  # twice as long every round
    assert stats["ratio"]["mean"] == pytest.approx(2.0) and stats["ratio"]["ci"] == pytest.approx([2.0, 2.0])
    low, high = stats["round_s_ci"]["deployed"]
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 1
    assert (low, high) == pytest.approx((5.0 - half, 5.0 + half))


def test_each_client_gets_its_rows_and_a_share_of_the_test_set(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "NODES", 5)
    config = tiny_config(partition={"kind": "dirichlet", "num_clients": 10, "alpha": 1.0, "min_size": 5})
    folders = bench.write_clients(config, tmp_path)
    assert len(folders) == 5 and all(len(list((tmp_path / f"node-{k}").iterdir())) == 2 for k in range(1, 6))
    clients = read_files(tmp_path / "all")
    from taciturn.core.rng import Streams
    from taciturn.experiments.runner import build_task

    _, data = build_task(config, Streams(config.seed))
    for c, client in enumerate(clients):
        rows = data.client_indices(c)
        assert np.array_equal(client.x_train.numpy(), data.dataset.x_train[rows].numpy())
    assert sum(len(c.y_test) for c in clients) == len(data.dataset.y_test)
