"""benchmarks/bass.py runs end to end (at a tiny scale) and writes the JSON schema of issue 7."""

import json
import math

import numpy as np
import pytest

from tests.benchmark_module import load_benchmark


class SilentProgress:
    """The rich progress bar's interface, showing nothing."""

    def add_task(self, *args, **kwargs):
        return 0

    def advance(self, *args):
        pass


def test_quick_benchmark_writes_final_regret_and_f1_per_setting(tmp_path, monkeypatch):
    bench = load_benchmark("bass")
    monkeypatch.setitem(bench.QUICK, "horizon", 100)  # smaller still than --quick: a test is not a smoke run
    monkeypatch.setattr(bench, "ALPHAS", (0.25,))
    monkeypatch.setattr(bench, "ALPHAS_ONLY", (0.25,))
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bass.json").read_text())
    methods = {"bass", "independent", "pooled", "oracle", "club", "sclub", "dynucb"}
    assert set(results["final_regret"]) == {"N2_C2", "N2_none", "N6_C2", "N6_none"}
    for by_method in results["final_regret"].values():
        assert methods <= set(by_method) and all(math.isfinite(v) and v >= 0 for v in by_method.values())
    for setting, by_method in results["final_regret"].items():  # same shape, and each median inside its IQR
        assert set(results["final_regret_median"][setting]) == set(by_method)
        for m, median in results["final_regret_median"][setting].items():
            q25, q75 = results["final_regret_iqr"][setting][m]
            assert q25 <= median <= q75
    assert set(results["f1_final"]) == {"N2_C2", "N6_C2"}
    assert all(0 <= f1 <= 1 for f1 in results["f1_final"].values())
    assert results["mb_shared"]["N6_C2"]["independent"] == 0 < results["mb_shared"]["N6_C2"]["pooled"]
    assert (tmp_path / "bass_regret.png").stat().st_size > 0


def runs(final_regret, **fields):
    """A method's simulate() output whose last record has these per-repetition values."""
    out = {
        "t": np.array([0, 10]),
        "cpu_s": 1.26,
        "regret": np.stack([np.zeros(len(final_regret)), final_regret]),
    }
    for name, last in fields.items():
        out[name] = np.stack([np.zeros(len(last)), np.asarray(last, dtype=float)])
    return out


def test_summarise_turns_the_repetitions_into_the_published_numbers():
    bench = load_benchmark("bass")
    traffic = {
        "bytes_up": [1e6, 3e6, 0, 0],
        "bytes_down": [0, 0, 2e6, 2e6],
        "messages_up": [1, 2, 3, 4],
        "messages_down": [0, 0, 0, 2],
    }
    results = {
        "N2_C2": {
            "bass": runs(np.array([1.0, 2.0, 3.0, 10.0]), f1=[0.5, 1.0, 1.0, 0.5], **traffic),
            "pooled": runs(np.full(4, 4.0), **traffic),
        },
        "N2_none": {"bass": runs(np.array([2.0, 2.0, 2.0, 6.0]), f1=[1, 1, 1, 1], **traffic)},
    }
    summary = bench.summarise(results)
    assert summary["final_regret"] == {"N2_C2": {"bass": 4.0, "pooled": 4.0}, "N2_none": {"bass": 3.0}}
    # population std of (1, 2, 3, 10) around 4: sqrt((9 + 4 + 1 + 36) / 4)
    assert summary["final_regret_std"]["N2_C2"]["bass"] == pytest.approx(math.sqrt(12.5), rel=1e-12)
    assert summary["final_regret_std"]["N2_C2"]["pooled"] == 0.0
    assert summary["final_regret_median"]["N2_C2"] == {"bass": 2.5, "pooled": 4.0}
    # linear interpolation: the 25th and 75th percentiles sit at positions 0.75 and 2.25 of (1, 2, 3, 10)
    assert summary["final_regret_iqr"]["N2_C2"]["bass"] == pytest.approx([1.75, 4.75], rel=1e-12)
    assert summary["final_regret_by_run"]["N2_C2"]["bass"] == [1.0, 2.0, 3.0, 10.0]
    # t interval: 4 +- t_{3, 0.975} s / 2 with s = sqrt(50 / 3) the sample std, t_{3, 0.975} = 3.18245
    half = 3.182446305284263 * math.sqrt(50 / 3) / 2
    assert summary["final_regret_ci"]["N2_C2"]["bass"] == pytest.approx([4 - half, 4 + half], rel=1e-9)
    assert summary["final_regret_ci"]["N2_C2"]["pooled"] == [4.0, 4.0]  # no spread: the point
    assert summary["f1_final"] == {"N2_C2": 0.75}  # only settings with clusters have an F1
    assert summary["f1_final_by_method"] == {"N2_C2": {"bass": 0.75}}
    assert summary["mb_shared"]["N2_C2"]["bass"] == pytest.approx(2.0, rel=1e-12)  # (1 + 3 + 2 + 2) / 4 MB
    assert summary["messages"]["N2_C2"]["pooled"] == pytest.approx(3.0, rel=1e-12)  # (1 + 2 + 3 + 6) / 4
    assert summary["cpu_s"]["N2_none"]["bass"] == 1.3


def test_the_pilot_picks_the_lowest_regret_relative_to_each_settings_best(monkeypatch):
    """Variant 1 is twice as bad as variant 2 in one setting, 1.67 times better in the other: relative
    scores 1.33 against 1.5 pick variant 1, though variant 2 has the lower mean of raw regrets."""
    bench = load_benchmark("bass")
    monkeypatch.setattr(bench, "METHODS", ("club",))
    monkeypatch.setattr(bench, "EXTRA", ())
    monkeypatch.setattr(bench, "ALPHAS", (0.1,))
    monkeypatch.setitem(bench.THRESHOLDS, "club", ("club", "gamma", (1.0, 2.0)))
    regret = {("N2_C2", 1.0): 1.0, ("N2_C2", 2.0): 2.0, ("N6_none", 1.0): 100.0, ("N6_none", 2.0): 60.0}
    calls = []

    def config(setting, method, variant, seed, scale):
        calls.append((seed, scale["repetitions"]))
        return setting, variant[1]

    def simulate(key):  # two runs with the same regret: the upper bound of the interval is the mean
        return {"regret": np.array([[0.0, 0.0], [regret[key], regret[key]]])}

    monkeypatch.setattr(bench, "config", config)
    monkeypatch.setattr(bench, "simulate", simulate)

    scale = {"horizon": 10, "pilot": {"settings": ("N2_C2", "N6_none"), "repetitions": 3}, "repetitions": 10}
    chosen, table = bench.pilot(scale, SilentProgress())
    assert chosen == {"club": (0.1, 1.0)}
    assert table == {
        "club": {
            "N2_C2": {"(0.1, 1.0)": 1.0, "(0.1, 2.0)": 2.0},
            "N6_none": {"(0.1, 1.0)": 100.0, "(0.1, 2.0)": 60.0},
        }
    }
    assert set(calls) == {(bench.PILOT_SEED, 3)}  # other seeds than the reported runs, the pilot's size


def test_the_table_bolds_the_best_method_that_is_not_told_the_clusters():
    bench = load_benchmark("bass")
    methods = bench.METHODS + bench.EXTRA
    regret = {m: 5.0 + i for i, m in enumerate(methods)} | {"oracle": 1.0, "club": 2.0}
    results = {
        "N2_C2": {
            m: runs(
                np.full(2, regret[m]),
                f1=[1, 1],
                bytes_up=[0, 0],
                bytes_down=[0, 0],
                messages_up=[0, 0],
                messages_down=[0, 0],
            )
            for m in methods
        }
    }
    text = bench.tables_markdown(bench.summarise(results), {"club": (0.25, 2.0), "pooled": (0.4, None)}, {})
    row = next(line for line in text.splitlines() if line.startswith("| N2_C2 |") and "<br>" in line)
    cells = dict(zip(methods, row.split(" | ")[1:], strict=True))
    assert cells["club"].startswith("**2 [2, 2]**") and cells["oracle"].startswith("1 [1, 1]<br>")
    assert sum("**" in c for c in cells.values()) == 1
    assert "club 0.25, 2.0, pooled 0.4." in text


@pytest.mark.parametrize(("runs", "chosen"), [(3, 0.15), (10, 0.4)])
def test_a_pilot_of_ten_runs_sees_the_run_that_locks_and_three_do_not(monkeypatch, runs, chosen):
    """alpha 0.15 has regret 40 in nine runs of ten and 3000 in the eighth (a locked pool, issue 19;
    mean 336); alpha 0.4 has 100 in every run. Three pilot runs see only the good ones and choose
    0.15; ten runs see the locked one and choose 0.4 (FULL's pilot has ten)."""
    bench = load_benchmark("bass")
    monkeypatch.setattr(bench, "METHODS", ("oracle",))
    monkeypatch.setattr(bench, "EXTRA", ())
    monkeypatch.setattr(bench, "ALPHAS_ONLY", (0.15, 0.4))  # oracle has no threshold
    by_run = {0.15: np.array([40.0] * 7 + [3000.0] + [40.0] * 2), 0.4: np.full(10, 100.0)}

    def config(setting, method, variant, seed, scale):
        return variant[0], scale["repetitions"]

    def simulate(key):
        alpha, repetitions = key
        return {"regret": np.stack([np.zeros(repetitions), by_run[alpha][:repetitions]])}

    monkeypatch.setattr(bench, "config", config)
    monkeypatch.setattr(bench, "simulate", simulate)

    scale = bench.FULL | {"pilot": {"settings": ("N6_C2",), "repetitions": runs}}
    assert bench.pilot(scale, SilentProgress())[0] == {"oracle": (chosen, None)}
    assert bench.FULL["pilot"]["repetitions"] == 10


def test_the_pilot_charges_a_grid_point_for_a_run_that_locks_though_its_mean_is_lower(monkeypatch):
    """As BASS on N6_C2 (issue 19): alpha 0.25 has regret 60 in nine runs and 700 in one (mean 124),
    alpha 0.4 has 120 or 140 (mean 130). By the mean 0.25 wins; the upper ends of the 95% intervals,
    124 + 2.262 x 202.4 / sqrt(10) = 268.8 against 130 + 2.262 x 10.5 / sqrt(10) = 137.5, pick 0.4."""
    bench = load_benchmark("bass")
    monkeypatch.setattr(bench, "METHODS", ("oracle",))
    monkeypatch.setattr(bench, "EXTRA", ())
    monkeypatch.setattr(bench, "ALPHAS_ONLY", (0.25, 0.4))  # oracle has no threshold
    by_run = {0.25: np.array([60.0] * 9 + [700.0]), 0.4: np.array([120.0, 140.0] * 5)}
    monkeypatch.setattr(bench, "config", lambda setting, method, variant, seed, scale: variant[0])
    monkeypatch.setattr(bench, "simulate", lambda alpha: {"regret": np.stack([np.zeros(10), by_run[alpha]])})

    scale = bench.FULL | {"pilot": {"settings": ("N6_C2",), "repetitions": 10}}
    chosen, table = bench.pilot(scale, SilentProgress())
    assert table["oracle"]["N6_C2"] == {"(0.25, None)": 124.0, "(0.4, None)": 130.0}  # means: 0.25 lower
    assert chosen == {"oracle": (0.4, None)}


def test_every_method_searches_nine_configurations_on_tuning_seeds_apart_from_the_reported_runs():
    """Issue 42: BASS and its variants had 9 tuning configurations, the LinUCB baselines 3."""
    bench = load_benchmark("bass")
    assert {len(bench.grid(m)) for m in bench.METHODS + bench.EXTRA} == {9}
    p = bench.protocol(bench.FULL)
    assert p.tuning_seeds == tuple(range(1000, 1010)) and p.report_seeds == tuple(range(10))
    # more clusters than agents puts every agent in its own cluster: N2_C4 is N2_C2, so it is not run
    assert bench.settings(bench.FULL) == [
        "N2_C2",
        "N2_none",
        "N6_C2",
        "N6_C4",
        "N6_none",
        "N18_C2",
        "N18_C4",
        "N18_none",
    ]


def test_bass_is_compared_run_by_run_with_a_paired_interval():
    bench = load_benchmark("bass")
    # differences bass - club per run: -2, -4, -6, -4, -4: mean -4, s^2 = 2, t_{0.975, 4} = 2.77645
    results = {"N6_C2": {"bass": runs(np.array([8.0, 6, 4, 6, 6])), "club": runs(np.full(5, 10.0))}}
    out = bench.comparisons(results)["N6_C2"]["club"]
    half = 2.7764451 * math.sqrt(2 / 5)
    assert out["mean"] == -4.0 and out["ci"] == pytest.approx([-4 - half, -4 + half], abs=1e-6)
    assert out["direction"] == -1 and out["wilcoxon_p"] == pytest.approx(1 / 16)
    lines = bench.comparison_lines({"N6_C2": {"club": out}})
    assert lines[0].startswith("N6_C2: BASS has lower final regret than club, -4 [")
    assert lines[-1] == "No conclusion (the paired interval contains 0, or Wilcoxon's test disagrees): none."
