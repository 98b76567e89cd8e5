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


def test_a_grid_point_with_the_same_algorithm_as_one_already_run_takes_its_rows(bench, monkeypatch):
    """Delta_z on its own axis at the median quantile is the constant-Delta method at the median:
    one training, two candidates; at another quantile the thresholds differ and both run."""
    row = {"accuracy": 0.5, "messages_up": 0, "messages_down": 0, "bytes_up": 0, "bytes_down": 0}
    calibration = bench.Run(
        "calibration", "calibration", 0, [row], 1, 10, 10, 0.0,
        {key: [float(i) for i in range(100)] for key in ("absolute", "relative", "progress")},
        [float(i) for i in range(10)],
    )  # fmt: skip
    monkeypatch.setattr(bench, "calibrate", lambda setting, rho, seed: calibration)
    trained = []

    def run_one(setting, method, point, seed, thresholds):
        trained.append((method, point["quantile"]))
        rows = [row | {"messages_up": len(trained)}]
        return bench.Run(method, bench.knob_label(point), seed, rows, 1, 10, 10, 1.0)

    monkeypatch.setattr(bench, "run_one", run_one)
    grid = {"rho_grid": [0.1], "quantiles": [0.5, 0.9]}
    grid |= {"fractions": [0.5, 1.0], "fedadmm_fractions": [0.5, 1.0]}
    setting = bench.setting_a(quick=False) | grid  # every method's budget: 2 grid points
    runs, _ = bench.event_runs(setting, 0.1, seed=0)
    by_name = {(r.method, r.knob): r for r in runs}
    assert ("event_admm_dz", 0.5) not in trained and ("event_admm_dz", 0.9) in trained
    assert len(trained) == 2 * len(bench.EVENT) - 1
    assert set(by_name) == {(m, f"rho=0.1,quantile={q}") for m in bench.EVENT for q in (0.5, 0.9)}
    same = by_name[("event_admm_dz", "rho=0.1,quantile=0.5")]
    assert same.rows == by_name[("event_admm", "rho=0.1,quantile=0.5")].rows
    assert same.rows != by_name[("event_admm_dz", "rho=0.1,quantile=0.9")].rows
