"""benchmarks/event_admm.py keeps every finished run, with its per-round log and config, in a
JSON-lines log keyed by config and code: a rerun reads it back, so the tables can be recomputed
from the log alone and grids run over several sessions (issue 42)."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_module import load_benchmark
from tests.conftest import TINY_EVENT_ADMM_SETTING

TINY = TINY_EVENT_ADMM_SETTING


@pytest.fixture
def bench(tmp_path, monkeypatch):
    module = load_benchmark("event_admm")
    monkeypatch.setattr(module, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    return module


def test_a_finished_run_is_read_back_from_the_log_instead_of_run_again(bench, monkeypatch):
    zero = bench.Spec("event_admm", (("rho", 0.1), ("delta", 0.0)), 0)
    fedavg = bench.Spec("fedavg", (("fraction", 1.0), ("lr", 0.05)), 0)
    calibration = bench.run_one(TINY, zero)
    first = bench.run_one(TINY, fedavg)
    records = [json.loads(line) for line in bench.runs_log(TINY).read_text().splitlines()]
    assert [(r["method"], r["knob"], r["seed"]) for r in records] == [
        ("event_admm", "rho=0.1,delta=0.0", 0),
        ("fedavg", "fraction=1.0,lr=0.05", 0),
    ]
    # every record holds what a recomputation needs: the config, and accuracy and traffic per round
    assert records[1]["config"]["algorithm"]["local"]["lr"] == 0.05 and "name" not in records[1]["config"]
    assert [row["round"] for row in records[1]["rows"]] == [0, 1, 2, 3]
    assert set(calibration.trigger_ratios) == {"absolute", "relative", "progress"}
    assert len(calibration.trigger_ratios["absolute"]) == 3 * 10  # every agent fires in every round
    assert first.trigger_ratios == {}  # only a Delta = 0 run's ratios set a unit

    def no_new_runs(*args, **kwargs):
        raise AssertionError("a stored run was run again")

    monkeypatch.setattr(bench, "start", no_new_runs)
    again = bench.run_one(TINY, zero)
    assert (again.rows, again.trigger_ratios, again.z_changes) == (
        calibration.rows,
        calibration.trigger_ratios,
        calibration.z_changes,
    )
    assert bench.unit_of(again, "absolute") == bench.unit_of(calibration, "absolute")
    # a variant at Delta = 0 is the same run under another name, read back too
    decay = bench.run_all(TINY, [bench.Spec("event_admm_decay", zero.point, 0)], jobs=1)
    assert next(iter(decay.values())).rows == calibration.rows
    with pytest.raises(AssertionError, match="run again"):  # another seed is another run
        bench.run_one(TINY, bench.Spec("fedavg", fedavg.point, 1))


def test_running_one_setting_keeps_the_others_made_on_the_same_seeds(tmp_path):
    bench = load_benchmark("event_admm")
    out = tmp_path / "event_admm.json"
    seeds = {"selection": "tuning_seeds", "tuning_seeds": [0, 1], "report_seeds": [10, 11, 12, 13, 14]}
    earlier = seeds | {"configs_per_method": {"fedavg": 21, "event_admm_dz": 21}}
    out.write_text(json.dumps({"protocol": earlier, "A": {"ceiling": 0.8}, "C": {"ceiling": 0.5}}))
    now = {"protocol": seeds | {"configs_per_method": {"fedavg": 21}}, "C": {"ceiling": 0.6}}
    merged = bench.with_earlier_settings(now, out)
    assert merged["A"] == {"ceiling": 0.8} and merged["C"] == {"ceiling": 0.6}  # C is the new one
    assert merged["protocol"]["configs_per_method"] == {"fedavg": 21, "event_admm_dz": 21}
    other = {"protocol": seeds | {"report_seeds": [20, 21, 22, 23, 24], "configs_per_method": {}}, "C": {}}
    assert bench.with_earlier_settings(other, out) == other
    assert bench.with_earlier_settings(now, tmp_path / "absent.json") == now
    before_the_protocol = tmp_path / "issue19.json"  # issue 19's file: no "protocol", other seeds
    before_the_protocol.write_text(json.dumps({"seeds": [0, 1, 2], "A": {"ceiling": 0.9}}))
    assert bench.with_earlier_settings(now, before_the_protocol) == now


def test_the_docs_block_names_the_settings_not_yet_run(monkeypatch):
    bench = load_benchmark("event_admm")
    monkeypatch.setattr(bench, "render_setting", lambda name, res: [f"[setting {name}]"])
    record = {"selection": "tuning_seeds", "tuning_seeds": [0, 1], "report_seeds": [10, 11, 12, 13, 14]}
    results = {"protocol": record | {"configs_per_method": {"fedavg": 21}}, "file": "f", "log": "l"}
    text = bench.render(results | {"A": {"command": "cA"}})
    assert "Commands (each setting keeps the run that made it): setting A, `cA`." in text
    assert "[setting A]" in text and text.endswith(
        'Settings B and C: not yet run under this protocol ("How to reproduce"); no claim is drawn for them.'
    )
    every = bench.render(results | {"A": {"command": "cA"}, "B": {"command": "cB"}, "C": {"command": "cC"}})
    assert "not yet run" not in every
    both = bench.render(results | {"A": {"command": "cA"}, "C": {"command": "cC"}})
    assert "setting A, `cA`; setting C, `cC`." in both and both.endswith("no claim is drawn for it.")


def test_a_run_that_diverged_is_kept_with_its_rows_up_to_where_it_stopped(bench, monkeypatch):
    """A configuration whose clients all fail in a round (SCAFFOLD going non-finite under int4 on
    setting C) stops with RunFailed: the benchmark keeps its rows so far, says
    why, and the run reaches no target after it, instead of the whole benchmark stopping."""
    from taciturn.experiments.runner import RunFailed

    real = bench.start

    def diverging(config, folder, **kwargs):
        def fail(end):
            if end.round == 2:
                raise RunFailed("every client failed in round 2; first error: CompressionError: ...")

        return real(config, folder, **kwargs | {"callbacks": (*kwargs["callbacks"], fail)})

    monkeypatch.setattr(bench, "start", diverging)
    spec = bench.Spec("fedavg", (("fraction", 1.0), ("lr", 0.05)), 0)
    run = bench.run_one(TINY, spec)
    (record,) = [json.loads(line) for line in bench.runs_log(TINY).read_text().splitlines()]
    assert record["stopped"].startswith("every client failed in round 2")
    assert [row["round"] for row in record["rows"]] == [0, 1, 2]  # round 2's row was written first
    assert run.rows == record["rows"] and run.cost(2.0) is None
    assert run.stopped == record["stopped"] == run.summary()["stopped"]  # shown, not only stored


def test_settings_b_and_c_read_back_the_frontiers_uncompressed_runs_and_log_only_their_own(
    bench, monkeypatch
):
    """The frontier runs the same configs on the same seeds (setting B and C, uncompressed): a run
    it stored is not made again, and event_admm.py's log stays its own."""
    assert all(bench.SETTINGS[name](False)["shares"] == ("frontier",) for name in "BC")
    frontiers = TINY | {"benchmark": "frontier"}
    fedavg = bench.Spec("fedavg", (("fraction", 1.0), ("lr", 0.05)), 0)
    made = bench.run_one(frontiers, fedavg)

    def no_new_runs(*args, **kwargs):
        raise AssertionError("a stored run was run again")

    monkeypatch.setattr(bench, "start", no_new_runs)
    mine = TINY | {"shares": ("frontier",)}
    assert bench.run_one(mine, fedavg).rows == made.rows
    assert not bench.runs_log(mine).exists()
    with pytest.raises(AssertionError, match="run again"):  # without the share it is not stored
        bench.run_one(TINY, fedavg)
