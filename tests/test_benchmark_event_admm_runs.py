"""benchmarks/event_admm.py keeps finished runs in a JSON-lines log, so its grids run over several
sessions, and a run of some settings keeps the results of the others."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_module import load_benchmark

TINY = {
    "name": "T",
    "prefix": "quick-",
    "rounds": 3,
    "data": {"dataset": "digits"},
    "partition": {"kind": "one_class", "num_clients": 10},
    "model": {"kind": "mlp", "hidden": [8]},
    "local": {"epochs": 1, "batch_size": 64, "lr": 0.05, "momentum": 0.0},
}


@pytest.fixture
def bench(tmp_path, monkeypatch):
    module = load_benchmark("event_admm")
    monkeypatch.setattr(module, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    return module


def test_a_finished_run_is_read_back_from_the_log_instead_of_run_again(bench, monkeypatch):
    calibration = bench.calibrate(TINY, 0.1, seed=0)
    fedavg = bench.run_one(TINY, "fedavg", {"fraction": 1.0}, seed=0)
    log = bench.runs_log(TINY)
    assert [json.loads(line)["name"] for line in log.read_text().splitlines()] == [
        "quick-T-calibration-rho=0.1-s0",
        "quick-T-fedavg-fraction=1.0-s0",
    ]
    assert set(calibration.trigger_ratios) == {"absolute", "relative", "progress"}
    assert len(calibration.trigger_ratios["absolute"]) == 3 * 10  # every agent fires in every round
    assert fedavg.trigger_ratios == {}  # only a calibration's ratios set thresholds

    def no_new_runs(*args, **kwargs):
        raise AssertionError("a stored run was run again")

    monkeypatch.setattr(bench, "start", no_new_runs)
    again = bench.calibrate(TINY, 0.1, seed=0)
    assert (again.rows, again.trigger_ratios, again.z_changes) == (
        calibration.rows,
        calibration.trigger_ratios,
        calibration.z_changes,
    )
    thresholds = bench.thresholds_from(calibration, "absolute", 0.9)
    assert bench.thresholds_from(again, "absolute", 0.9) == thresholds
    assert bench.run_one(TINY, "fedavg", {"fraction": 1.0}, seed=0).rows == fedavg.rows
    with pytest.raises(AssertionError, match="run again"):  # another seed is another run
        bench.run_one(TINY, "fedavg", {"fraction": 1.0}, seed=1)


def test_running_one_setting_keeps_the_other_settings_results_made_with_the_same_seeds_and_grid(tmp_path):
    bench = load_benchmark("event_admm")
    out = tmp_path / "event_admm.json"
    grid = {"seeds": 3, "rho_grid": [0.1, 1.0]}
    out.write_text(json.dumps(grid | {"A": {"ceiling": 0.8}, "B": {"ceiling": 0.5}}))
    now = {"seeds": 3, "rho_grid": [0.1, 1.0], "B": {"ceiling": 0.6}}
    assert bench.with_earlier_settings(now, out) == now | {"A": {"ceiling": 0.8}}  # B is the new one
    other_seeds = {"seeds": 5, "rho_grid": [0.1, 1.0], "B": {"ceiling": 0.6}}
    assert bench.with_earlier_settings(other_seeds, out) == other_seeds
    assert bench.with_earlier_settings(now, tmp_path / "absent.json") == now
