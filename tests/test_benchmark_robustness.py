"""benchmarks/robustness.py: the code that turns runs into published numbers."""

from pathlib import Path

import numpy as np
import pytest

from tests.benchmark_module import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def robustness():
    return load_benchmark("robustness")


def test_a_cell_is_the_mean_and_the_t_interval_over_seeds(robustness):
    c = robustness.cell([0.70, 0.72, 0.74])
    half = 4.302653 * 0.02 / np.sqrt(3)  # t_{2, 0.975} * s / sqrt(n), s = 0.02
    assert c["mean"] == pytest.approx(0.72)
    assert c["ci95"] == pytest.approx([0.72 - half, 0.72 + half], rel=1e-6)
    assert robustness.cell([0.5])["ci95"] is None  # one seed: a smoke run states no interval


def test_aggregators_are_told_the_attackers_count(robustness):
    rules = robustness.aggregators(3, 10)
    assert rules["krum"] == {"kind": "krum", "byzantine": 3}
    assert rules["trimmed_mean"]["trim"] == pytest.approx(0.3)  # beta = f / m: 3 of 10 cut at each end
    assert robustness.aggregators(1, 5)["trimmed_mean"]["trim"] == pytest.approx(0.2)
    assert set(rules) == {
        "mean",
        "norm_bound",
        "median",
        "trimmed_mean",
        "krum",
        "multi_krum",
        "centered_clip",
    }


def test_secagg_bytes_count_every_message_of_the_protocol(robustness):
    s = {"secagg_clients": [4], "secagg_dim": 1000}
    row = robustness.secagg(s)["4"]
    # each client uploads a masked vector of 1000 uint32 (4 kB) besides keys, shares and unmasking
    assert 4000 < row["bytes_per_client"] < 4000 + 2000
    assert row["plain_bytes_per_client"] > 4000 and row["dim"] == 1000


def test_docs_label_a_smoke_run_and_print_intervals_only_where_there_are_seeds(robustness, monkeypatch):
    written = {}
    monkeypatch.setattr(
        robustness, "replace_section", lambda name, body, title: written.update(name=name, body=body)
    )
    settings = {
        "train_size": 2000,
        "clients": 10,
        "per_round": 5,
        "rounds": 5,
        "seeds": [0],
        "dp_clients": 50,
        "dp_rounds": 5,
    }
    results = {
        "scale": "smoke",
        "settings": settings,
        "clean": 0.5,
        "attacks": {
            "scale": {"0.2": {"mean": robustness.cell([0.1]), "median": robustness.cell([0.4, 0.5, 0.6])}}
        },
        "privacy": {"inf": robustness.cell([0.5])},
        "secagg": {
            "10": {
                "dim": 7,
                "plain_bytes_per_client": 100,
                "bytes_per_client": 250.5,
                "down_bytes_per_client": 80.0,
                "sparse_bytes_per_client": 240.0,
                "sparse_down_bytes_per_client": 70.0,
            }
        },
    }
    robustness.docs(results, quick=True)
    assert written["name"] == "robustness_quick"
    assert "| 0.2 | 0.100 | 0.500 [0.252, 0.748] |" in written["body"]  # t_{2,.975} 0.1/sqrt(3) = 0.248
    assert "| 10 | 100 | 250 | 80 | 240 | 70 |" in written["body"]
    assert "--quick" in written["body"]
