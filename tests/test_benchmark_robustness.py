"""benchmarks/robustness.py: the code that turns runs into published numbers."""

import sys
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
        "tuning": {"scale": {"mean": 0.1, "median": 0.5}},
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


def test_a_stored_run_is_reused_only_for_the_same_config_and_code(robustness, tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    config = {"seed": 0, "rounds": 5, "attack": {"kind": "scale", "fraction": 0.2}}
    reordered = {"attack": {"fraction": 0.2, "kind": "scale"}, "rounds": 5, "seed": 0}
    for accuracy in (0.5, 0.61):  # the later line wins
        robustness.append_run(log, {"key": robustness.job_key(config), "accuracy": accuracy})
    robustness.append_run(log, {"key": robustness.job_key({"seed": 0, "rounds": 4}), "accuracy": 0.7})
    jobs = {"a": config, "b": {"seed": 0, "rounds": 5}, "c": reordered}
    # b: its config changed since, so it runs again; c: a's config, its keys in another order
    assert robustness.stored_accuracies(log, jobs) == {"a": 0.61, "c": 0.61}
    assert robustness.stored_accuracies(tmp_path / "none.jsonl", jobs) == {}
    run_key_module = sys.modules[robustness.run_key.__module__]
    monkeypatch.setattr(run_key_module, "CODE_VERSION", "other code")
    assert robustness.stored_accuracies(log, jobs) == {}  # the simulation code changed: all run again


def test_the_target_picks_the_best_rule_and_asks_its_interval_to_clear_clean_minus_3_points(robustness):
    results = {
        "clean": 0.80,
        "attacks": {
            "sign_flip": {
                "0.2": {
                    "mean": {"mean": 0.10, "ci95": [0.05, 0.15]},
                    "median": {"mean": 0.78, "ci95": [0.76, 0.80]},  # best; 0.76 < 0.77: not by interval
                    "krum": {"mean": 0.70, "ci95": [0.69, 0.71]},
                },
                "0.1": {"mean": {"mean": 0.9, "ci95": None}},
            },
            "scale": {
                "0.2": {
                    "mean": {"mean": 0.05, "ci95": None},
                    "median": {"mean": 0.76, "ci95": None},  # 4 points below: not held
                }
            },
        },
    }
    # the tuning seeds choose the rule: median for sign_flip, median for scale
    results["tuning"] = {
        "sign_flip": {"mean": 0.1, "median": 0.77, "krum": 0.71},
        "scale": {"mean": 0.0, "median": 0.7},
    }
    rows = robustness.target(results)
    assert rows == [
        ["sign_flip", "0.100", "median", "0.780 [0.760, 0.800]", "+2.0", "yes", "no"],
        ["scale", "0.050", "median", "0.760", "+4.0", "no", "n/a"],
    ]
    # a rule best on the tuning seeds is read on the report seeds, even where another is higher there
    results["tuning"]["sign_flip"] = {"mean": 0.1, "median": 0.70, "krum": 0.72}
    assert robustness.target(results)[0] == [
        "sign_flip",
        "0.100",
        "krum",
        "0.700 [0.690, 0.710]",
        "+10.0",
        "no",
        "no",
    ]


def test_every_grid_cell_has_one_run_per_seed_and_distinct_names(robustness):
    s = robustness.scale(quick=False)
    jobs = robustness.attack_jobs(s) | robustness.privacy_jobs(s)
    # 6 attacks x 3 fractions x 7 rules x 5 report seeds, 6 attacks x 7 rules x 2 tuning seeds at 20%,
    # 5 clean runs, 5 epsilons x 5 seeds
    assert len(jobs) == 6 * 3 * 7 * 5 + 6 * 7 * 2 + 5 + 5 * 5
    assert not set(s["tuning_seeds"]) & set(s["seeds"])
    assert len({name for name, _ in jobs.values()}) == len(jobs)
    _, config = jobs[("little_is_enough", 0.3, "krum", 2)]
    assert config["seed"] == 2 and config["aggregation"] == {"kind": "krum", "byzantine": 3}
    assert config["attack"] == {"kind": "little_is_enough", "fraction": 0.3}
