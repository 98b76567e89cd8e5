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
        "clean_cell": robustness.cell([0.5]),
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
    results["target"] = robustness.target(results)
    results["claims"] = robustness.privacy_claims(results)
    assert results["target"][0]["status"] == "n/a" and results["claims"] == []  # one seed: no claim
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


def test_the_target_pairs_the_chosen_rule_with_clean_seed_by_seed_and_holds_only_by_its_interval(robustness):
    clean = [0.80, 0.82, 0.84]
    c = robustness.cell
    results = {
        "clean_cell": c(clean),
        "attacks": {
            "sign_flip": {
                "0.2": {
                    "mean": c([0.10, 0.12, 0.14]),
                    "median": c([0.78, 0.80, 0.82]),  # 2 points below clean on every seed: held
                    "krum": c([0.70, 0.73, 0.74]),
                },
                "0.1": {"mean": c([0.9, 0.9, 0.9])},
            },
            "scale": {
                "0.2": {
                    "mean": c([0.05, 0.06, 0.07]),
                    "median": c([0.76, 0.78, 0.80]),  # 4 points below on every seed: not held
                }
            },
            "gaussian": {
                "0.2": {
                    "mean": c([0.5, 0.6, 0.7]),
                    "median": c([0.75, 0.82, 0.83]),  # 5, 0 and 1 points below: no conclusion
                }
            },
        },
        "tuning": {  # the tuning seeds choose the rule: median everywhere
            "sign_flip": {"mean": 0.1, "median": 0.77, "krum": 0.71},
            "scale": {"mean": 0.0, "median": 0.7},
            "gaussian": {"mean": 0.6, "median": 0.8},
        },
    }
    rows = robustness.target(results)
    assert [(r["attack"], r["rule"], r["status"]) for r in rows] == [
        ("sign_flip", "median", "held"),
        ("scale", "median", "not held"),
        ("gaussian", "median", "no conclusion"),
    ]
    assert rows[0]["gap"]["ci"] == pytest.approx([-0.02, -0.02])  # the same gap on every seed
    d = np.array([-0.05, 0.0, -0.01])  # gaussian's paired differences, by hand
    half = 4.302653 * d.std(ddof=1) / np.sqrt(3)
    assert rows[2]["gap"]["ci"] == pytest.approx([d.mean() - half, d.mean() + half], rel=1e-6)
    assert rows[0]["sentences"][0] == (
        "sign_flip at 20% attackers, the rule chosen on the tuning seeds: median is worse than clean FedAvg "
        "on final accuracy (lower): difference -0.020 [-0.020, -0.020], 3 of 3 seeds agree (paired 95% "
        "t-interval over 3 seeds; Wilcoxon p = 0.25). Within 3 points of clean: **held** (the whole paired "
        "interval at or above -3 points)."
    )
    assert rows[0]["sentences"][1].startswith(
        "sign_flip at 20% attackers: median is better than the plain mean"
    )
    assert "| sign_flip | 0.120 | median | 0.800 [0.750, 0.850] | -2.0 [-2.0, -2.0] | held |" in (
        robustness.target_table(rows)
    )
    assert robustness.readme_lines(rows).splitlines()[1] == (
        "- scale: **not held** with median (-4.0 [-4.0, -4.0] points against clean; undefended 0.060)."
    )
    # a rule best on the tuning seeds is read on the report seeds, even where another is higher there
    results["tuning"]["sign_flip"] = {"mean": 0.1, "median": 0.70, "krum": 0.72}
    krum = robustness.target(results)[0]
    assert (krum["rule"], krum["status"]) == ("krum", "not held")
    assert robustness.within("x", [0.8], [0.8], 0.03) == ("n/a", None)  # one seed: no interval
    results["tuning"]["scale"] = {"mean": 0.9, "median": 0.7}  # no defence chosen: nothing to set it beside
    plain = robustness.target(results)[1]
    assert plain["rule"] == "mean" and plain["against_undefended"] is None and len(plain["sentences"]) == 1
    # d = -0.75, -0.76, -0.77: mean -76 points, half-width 4.302653 x 1 / sqrt(3) = 2.48 points
    assert robustness.readme_lines([plain]) == (
        "- scale: **not held** with no defence (the tuning seeds chose the plain mean) (-76.0 [-78.5, -73.5] "
        "points against clean; undefended 0.060)."
    )


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
