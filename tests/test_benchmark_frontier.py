"""benchmarks/frontier.py's logic against hand-computed cases (issue 43, items 3-4): bytes to a
target, the generated verdicts, equal searches, selection on tuning seeds only, the Pareto front,
the configurations it runs, and the demo's configs written from its results."""

from __future__ import annotations

import json
import sys

import pytest

from taciturn.experiments import types
from tests.benchmark_module import load_benchmark
from tests.conftest import TINY_EVENT_ADMM_SETTING

frontier = load_benchmark("frontier")
ea = frontier.ea
protocol = sys.modules["protocol"]  # the module frontier.py imports (its error classes)


def rows_of(accuracies, up_per_round, down_per_round, first_down=None):
    """Metrics rows as the runner writes them: round 0 is the initial model, nothing sent."""
    rows, up, down = [], 0, 0
    for k, a in enumerate(accuracies):
        if k:
            up += up_per_round
            down += down_per_round if k > 1 or first_down is None else first_down
        rows.append(
            {
                "round": k,
                "accuracy": a,
                "messages_up": 2 * k,
                "messages_down": k,
                "bytes_up": up,
                "bytes_down": down,
            }
        )
    return rows


# ----- bytes to a target -----
def test_bytes_to_a_target_are_up_plus_down_when_the_trailing_mean_first_reaches_it():
    #           round: 0     1     2     3     4     5
    rows = rows_of([0.10, 0.50, 0.70, 0.90, 0.80, 0.84], 100, 40, first_down=0)
    # trailing means of 3: 0.1, 0.3, 0.4333, 0.7, 0.8, 0.8467; bytes up 100 k, down 0, 40, 80, 120
    assert frontier.SMOOTH == 3
    assert frontier.bytes_to_target(rows, 0.80) == 400 + 120  # round 4, not round 3's single 0.9
    assert frontier.bytes_to_target(rows, 0.70) == 300 + 80
    assert frontier.bytes_to_target(rows, 0.85) is None
    assert frontier.spent(rows, 0.80) == {
        "rounds": 4,
        "up": 400,
        "down": 120,
        "per_round": 130.0,
        "first_up": 100,
        "first_down": 0,  # a common start sends nothing down in round 1
        "messages_up": 8,
        "messages_down": 4,
    }
    assert frontier.spent(rows, 0.85) is None
    tie = rows_of([0.2, 0.3, 0.8394, 0.8406, 0.84], 10, 10)  # issue 42's exact tie reaches 0.84
    assert frontier.bytes_to_target(tie, 0.84) == 80


# ----- verdicts -----
NAMES = ("taciturn's best (x)", "the best uncompressed baseline (y)")


def test_a_saving_is_met_only_where_the_whole_paired_interval_lies_at_or_below_its_bound():
    ours = [50.0, 100.0, 40.0, 80.0, 60.0]
    half = [2 * v for v in ours]  # every seed: exactly half the bytes
    met = frontier.compare_saving(ours, half, half, 0.35, NAMES)
    assert met["status"] == "met"
    assert met["sentence"] == (
        "taciturn's best (x) needs 50% fewer bytes than the best uncompressed baseline (y) (better): ratio "
        "0.50 [0.50, 0.50], 5 of 5 seeds agree (paired 95% t-interval over 5 seeds; Wilcoxon p = 0.0625); "
        ">= 35% fewer bytes: met (the whole interval at or below 0.65)."
    )
    close = [v / 0.95 for v in ours]  # 5% fewer on every seed: the whole interval above 0.90
    assert frontier.compare_saving(ours, close, close, 0.10, NAMES)["status"] == "not met"
    assert (
        "not met (the whole interval above 0.90)"
        in frontier.compare_saving(ours, close, close, 0.10, NAMES)["sentence"]
    )
    spread = [v / r for v, r in zip(ours, (0.7, 1.1, 0.8, 1.0, 0.9), strict=True)]  # ratios around 0.9
    unsure = frontier.compare_saving(ours, spread, spread, 0.10, NAMES)
    assert unsure["status"] == "no conclusion" and "reaches both sides of 0.90" in unsure["sentence"]
    missed = frontier.compare_saving([50.0, None, 40.0, 80.0, 60.0], half, half, 0.35, NAMES)
    assert missed["status"] == "not met" and "reached the target on 4 of 5 report seeds" in missed["sentence"]


def test_a_baseline_that_missed_the_target_is_charged_its_whole_run_which_can_support_met_never_not_met():
    ours = [50.0, 100.0, 40.0, 80.0, 60.0]
    theirs = [100.0, None, 80.0, 160.0, 120.0]
    total = [300.0, 200.0, 300.0, 300.0, 300.0]  # seed 2's whole run: 200 bytes, less than its cost
    met = frontier.compare_saving(ours, theirs, total, 0.35, NAMES)
    assert met["status"] == "met" and met["censored"] == 1
    assert met["paired"]["per_seed"][1] == pytest.approx(-0.6931471805599453)  # log(100 / 200)
    assert "missed the target on 1 of 5 seeds" in met["sentence"]
    above = frontier.compare_saving(
        ours, [52.0, None, 42.0, 82.0, 62.0], [1e9, 101.0, 1e9, 1e9, 1e9], 0.10, NAMES
    )
    assert above["paired"]["ci"][0] > 0.9 and above["status"] == "no conclusion"  # only a lower bound
    never = frontier.compare_saving(ours, [None] * 5, [10.0] * 5, 0.10, NAMES)  # ours: 4-10x their runs
    assert never["censored"] == 5 and never["status"] == "no conclusion"
    assert "worse" not in never["sentence"] and "more bytes" not in never["sentence"]  # no direction
    lower_bound = "to a lower bound of the best uncompressed baseline (y)'s bytes, so no direction follows"
    assert lower_bound in never["sentence"]


def test_the_verdict_of_a_target_needs_both_savings():
    met = {"status": "met", "sentence": "A."}
    unsure = {"status": "no conclusion", "sentence": "B."}
    missed = {"status": "not met", "sentence": "C."}
    also = {"status": "met", "sentence": "D."}
    both = frontier.verdict("Setting B, 84%", {"baseline_best": met, "baseline_compressed_best": also})
    assert both["status"] == "met"
    assert both["sentence"] == (
        "Setting B, 84%: taciturn's best configuration needs at least 35% fewer bytes than the best "
        "uncompressed baseline and at least 10% fewer than the best compressed baseline: **met**. A. D."
    )
    twice = frontier.verdict("x", {"baseline_best": missed, "baseline_compressed_best": missed})
    assert twice["sentence"].endswith("**not met**. C.")  # one reason, said once
    assert frontier.verdict("x", {"baseline_best": met, "baseline_compressed_best": unsure})["status"] == (
        "no conclusion"
    )
    assert frontier.verdict("x", {"baseline_best": unsure, "baseline_compressed_best": missed})["status"] == (
        "not met"
    )


def test_taciturns_own_method_is_set_beside_the_best_compressed_baseline_by_the_same_test(monkeypatch):
    monkeypatch.setattr(frontier, "describe", lambda point: point["method"] if point else "none")
    theirs = {"label": "b", "per_seed": [100.0, 120.0, 90.0, 110.0, 105.0], "total": [1e9] * 5}
    labels = {"a": {"method": "event_admm"}, "b": {"method": "fedavg"}}
    half = {"label": "a", "per_seed": [50.0, 61.0, 44.0, 56.0, 52.0]}
    met = frontier.own_method("Setting B, 84%", half, theirs, labels)
    assert met["status"] == "met" and met["paired"]["ci"][1] <= 0.9
    assert met["sentence"].startswith("Setting B, 84%: event_admm at its best (event_admm)")
    thrice = {"label": "a", "per_seed": [3 * v for v in theirs["per_seed"]]}
    assert frontier.own_method("x", thrice, theirs, labels)["status"] == "not met"
    none = frontier.own_method("x", None, theirs, labels)
    assert none["sentence"] == (
        "x: event_admm at its best reached the target with none of its configurations on the tuning seed."
    )
    alone = frontier.own_method("x", half, None, labels)
    assert alone["status"] == "no conclusion" and "has no compressed baseline" in alone["why"]


def test_the_readmes_lines_are_generated_from_the_paired_intervals(monkeypatch):
    monkeypatch.setattr(frontier, "describe", lambda config: config["method"])
    theirs = [100.0, 120.0, 90.0, 110.0, 105.0]
    ours = [10.0, 13.0, 9.0, 12.0, 10.0]
    uncompressed = frontier.compare_saving(ours, theirs, theirs, 0.35, NAMES)
    itself = {"status": "not met", "paired": None, "censored": 0, "sentence": "s.", "itself": True}
    own = frontier.compare_saving([3 * v for v in ours], ours, ours, 0.10, NAMES)
    cells = {
        "best": {"label": "a"},
        "baseline_best": {"label": "b"},
        "baseline_compressed_best": {"label": "a"},
    }
    entry = {
        "comparisons": {"baseline_best": uncompressed, "baseline_compressed_best": itself},
        "own": own,
        "cells": cells,
        "configs": {"best": {"method": "fedavg"}},
        "verdict": {"status": "not met"},
    }
    results = {"settings": {"B": {"targets": [0.84], "per_target": {"0.84": entry}}}}
    u, o = uncompressed["paired"], own["paired"]
    assert (uncompressed["status"], own["status"]) == ("met", "not met")
    assert frontier.readme_block(results) == (
        f"- Setting B, 84%: **not met**. taciturn's best (fedavg) sends {u['mean']:.2f}x "
        f"[{u['ci'][0]:.2f}, {u['ci'][1]:.2f}] the bytes of the best uncompressed baseline "
        "(>= 35% fewer: met); it is the best compressed baseline itself (>= 10% fewer: not met); "
        f"event_admm at its best sends 3.00x [{o['ci'][0]:.2f}, {o['ci'][1]:.2f}] the bytes of the best "
        "compressed baseline."
    )
    # taciturn's best missed the target on a report seed; event ADMM reached it where the compressed
    # baseline did not (its bytes then only a lower bound); and a compressed baseline other than ours
    missed = frontier.compare_saving([10.0, None, 9.0, 12.0, 10.0], theirs, theirs, 0.35, NAMES)
    censored = frontier.compare_saving([3 * v for v in ours], [None, *ours[1:]], [5.0] * 5, 0.10, NAMES)
    entry["comparisons"] = {"baseline_best": missed, "baseline_compressed_best": missed}
    entry["own"] = censored
    c = censored["paired"]
    assert frontier.readme_block(results) == (
        "- Setting B, 84%: **not met**. taciturn's best (fedavg) reached the target on only 4 of 5 report "
        f"seeds, so neither saving is shown; event_admm at its best sends {c['mean']:.2f}x "
        f"[{c['ci'][0]:.2f}, {c['ci'][1]:.2f}] the bytes of the best compressed baseline (which missed the "
        "target on 1 of 5 seeds: a lower bound of its bytes)."
    )
    entry["comparisons"] = {"baseline_best": uncompressed, "baseline_compressed_best": own}
    entry["own"] = None
    assert frontier.readme_block(results).endswith(
        f"; it sends 3.00x [{o['ci'][0]:.2f}, {o['ci'][1]:.2f}] the bytes of the best compressed baseline "
        "(>= 10% fewer: not met)."
    )


# ----- searches -----
def test_every_family_searches_21_configurations_and_unequal_searches_are_refused():
    grids = frontier.family_grids([0.05, 0.1, 0.2, 0.5, 1.0])
    assert {m: len(g) for m, g in grids.items()} == dict.fromkeys(frontier.FAMILIES, 21)
    for family, grid in grids.items():  # uncompressed at every C, 0.05 included; the rest below C = 1
        full = [p for p in grid.points if p["compressor"] == "none" and not p.get("delta")]
        assert [p["fraction"] for p in full] == [0.05, 0.1, 0.2, 0.5, 1.0], family
        assert all(p["fraction"] < 1 for p in grid.points if p not in full), family
    assert {(p["delta"], p["compressor"]) for p in grids["event_admm"].points} == set(frontier.EVENT_PROFILES)
    assert {p["compressor"] for p in grids["scaffold"].points} == set(frontier.PROFILES)
    pools = frontier.pools(grids)
    assert {n: len(g) for n, g in pools.items()} == {
        "best": 105,
        "baseline_best": 20,
        "baseline_compressed_best": 84,
    }
    assert {p["compressor"] for p in pools["baseline_best"].points} == {"none"}
    assert {p["method"] for p in pools["baseline_compressed_best"].points} == set(frontier.BASELINES)
    with pytest.raises(protocol.BudgetError, match="unequal searches"):
        frontier.family_grids([0.1, 1.0], event_profiles=frontier.EVENT_PROFILES[:4])
    with pytest.raises(protocol.BudgetError, match="unequal searches"):
        frontier.family_grids([0.1, 1.0], profiles=frontier.PROFILES[:4])


def fake_run(accuracies, per_round, seed=0):
    rows = rows_of(accuracies, per_round, per_round)
    return ea.Run("m", "k", seed, rows, 1, 10, len(rows) - 1, 0.0)


class Watched(dict):
    """A dict of runs that records the seeds read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seeds = set()

    def __getitem__(self, key):
        self.seeds.add(key[1])
        return super().__getitem__(key)


def test_choices_come_from_the_tuning_seeds_only_and_perturbing_report_seeds_moves_none():
    grids = frontier.family_grids(
        [0.5, 1.0], profiles=("none", "int8"), event_profiles=((0.0, "none"), (1.0, "int4"))
    )
    p = protocol.Protocol("tuning_seeds", (0,), (10, 11, 12, 13, 14))
    method_factor = {"fedavg": 1.0, "fedprox": 1.1, "scaffold": 2.0, "fedadmm": 1.2, "event_admm": 0.9}
    compressor_factor = {"none": 4.0, "int8": 1.0, "int4": 0.5}
    curve = [0.1, 0.5, 0.6, 0.7, 0.8, 0.8]  # trailing means ... 0.7, 0.7667: the ceiling

    def per_round(point):
        return (
            1000 * point["fraction"] * method_factor[point["method"]] * compressor_factor[point["compressor"]]
        )

    points = [q for g in grids.values() for q in g.points]
    runs = Watched(
        {
            (protocol.label(q), s): fake_run(curve, per_round(q), s)
            for q in points
            for s in (0, *p.report_seeds)
        }
    )
    choice = frontier.choose(runs, grids, p)
    assert runs.seeds == {0}
    assert choice["ceiling"] == pytest.approx(2.3 / 3)
    assert choice["targets"] == [0.66, 0.71, 0.74]  # 0.7667 less 10, 5 and 2 points, rounded down
    picked = {name: {t: c.point for t, c in by.items()} for name, by in choice["pools"].items()}
    expected = {
        "best": {"method": "event_admm", "compressor": "int4", "delta": 1.0, "fraction": 0.5},
        "baseline_best": {"method": "fedavg", "compressor": "none", "fraction": 0.5},
        "baseline_compressed_best": {"method": "fedavg", "compressor": "int8", "fraction": 0.5},
    }
    assert picked == {
        name: dict.fromkeys(["0.66", "0.71", "0.74"], point) for name, point in expected.items()
    }
    assert choice["families"]["scaffold"]["0.66"].point == {
        "method": "scaffold",
        "compressor": "int8",
        "fraction": 0.5,
    }
    # bytes to 0.66 at round 4 (trailing mean 0.7): fedavg none at C = 0.5 sends 2000 a round each way
    assert (
        choice["pools"]["baseline_best"]["0.66"].scores["method=fedavg,compressor=none,fraction=0.5"] == 16000
    )
    for q in points:  # the report seeds now favour the costliest configuration by far: nothing moves
        for s in p.report_seeds:
            runs[(protocol.label(q), s)] = fake_run([0.9] * 6, 1e9 if q["method"] != "scaffold" else 1.0, s)
    again = frontier.choose(runs, grids, p)
    assert {n: {t: c.point for t, c in by.items()} for n, by in again["pools"].items()} == picked


def test_the_pareto_front_keeps_the_points_nothing_beats_on_both_bytes_and_accuracy():
    points = [
        (10, 0.5, "a"),
        (20, 0.4, "b"),
        (20, 0.6, "c"),
        (30, 0.6, "d"),  # as accurate as c, for more bytes
        (5, 0.3, "e"),
        (40, 0.9, "f"),
        (10, 0.5, "g"),  # a's duplicate
    ]
    assert frontier.pareto_front(points) == [(5, 0.3, "e"), (10, 0.5, "a"), (20, 0.6, "c"), (40, 0.9, "f")]
    assert frontier.pareto_front([]) == []


# ----- the runs -----
def test_every_configuration_validates_and_the_compressors_fit_each_method():
    for build in frontier.SETTINGS.values():
        setting = build(False) | {"benchmark": "frontier"}
        for grid in frontier.family_grids([0.05, 0.1, 0.2, 0.5, 1.0]).values():
            for point in grid.points:  # validates every table, before any run
                ea.key_of(setting, frontier.spec_of(setting, point, 0, None))
    assert frontier.compression_of("topk", "fedavg") == {
        "up": [{"kind": "topk", "fraction": 0.05}, "fp16"],
        "down": ["int4"],
        "up_feedback": "ef21",
    }
    assert frontier.compression_of("qsgd", "scaffold") == {
        "up": [{"kind": "qsgd", "levels": 7}],
        "down": ["int4"],
        "up_feedback": "memory",
    }
    assert frontier.compression_of("int8", "fedavg") == {"up": ["int8"], "down": ["int8"]}
    setting = ea.setting_b(False) | {"benchmark": "frontier"}
    event = ea.tree_of(setting, frontier.spec_of(setting, frontier.calibration_point(0.1), 0, None))
    assert {k: event["algorithm"][k] for k in ("fraction", "start", "uplink", "delta")} == {
        "fraction": 0.1,
        "start": "common",
        "uplink": "change",
        "delta": 0.0,
    }
    admm = ea.tree_of(
        setting,
        frontier.spec_of(setting, {"method": "fedadmm", "compressor": "int4", "fraction": 0.1}, 0, None),
    )
    assert admm["algorithm"]["uplink"] == "change" and admm["compression"]["up_feedback"] == "memory"
    # an uncompressed baseline is event_admm.py's run: one key, so the two benchmarks share it
    fedavg = {"method": "fedavg", "compressor": "none", "fraction": 0.1}
    theirs = ea.Spec("fedavg", (("fraction", 0.1), ("lr", 0.01)), 3)
    assert ea.key_of(setting, frontier.spec_of(setting, fedavg, 3, None)) == ea.key_of(setting, theirs)


def calibration(ratios, z_changes):
    run = ea.Run("event_admm", "k", 0, [], 1, 10, 10, 0.0)
    run.trigger_ratios, run.z_changes = {"absolute": ratios}, z_changes
    return run


def test_delta_is_a_multiple_of_the_calibration_runs_median_at_the_points_c():
    # 10 rounds, one ratio a round: the first tenth (round 1) is skipped, median of the rest
    ratios = [100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    units = {0.1: calibration(ratios, [50.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]), 1.0: None}
    setting = ea.setting_b(False) | {"benchmark": "frontier"}
    point = {"method": "event_admm", "compressor": "topk", "delta": 1.0, "fraction": 0.1}
    spec = frontier.spec_of(setting, point, 0, units)
    assert spec.thresholds == (5.0, 2.0)
    config = frontier.config_of(setting, point, units)
    assert (config["algorithm"]["delta"], config["algorithm"]["delta_z"]) == (5.0, 2.0)
    assert config["compression"]["up_feedback"] == "memory"


# ----- results and the demo -----
def fake_setting_result(setting, configs, per_seed):
    targets = [0.8, 0.84]
    cells = {
        pool: {
            "label": pool,
            "per_seed": per_seed[pool],
            "reached": 5,
            "bytes": protocol.estimate(per_seed[pool]).as_dict(),
        }
        for pool in frontier.POOLS
    }
    entry = {"cells": cells, "configs": configs, "verdict": {"status": "met", "sentence": "s."}}
    workload = {k: setting[k] for k in ("rounds", "data", "partition", "model", "local", "mu")}
    return {"settings": workload, "targets": targets, "per_target": {str(t): entry for t in targets}}


def test_the_results_carry_one_entry_per_setting_and_target_and_the_demo_is_written_from_them(tmp_path):
    setting = ea.setting_b(False) | {"benchmark": "frontier"}
    units = {0.1: calibration([1.0] * 10, [1.0] * 10)}
    winner = frontier.config_of(
        setting, {"method": "event_admm", "compressor": "topk", "delta": 1.0, "fraction": 0.1}, units
    )
    baseline = frontier.config_of(
        setting, {"method": "scaffold", "compressor": "none", "fraction": 0.1}, units
    )
    compressed = frontier.config_of(
        setting, {"method": "fedavg", "compressor": "int4", "fraction": 0.1}, units
    )
    configs = {"best": winner, "baseline_best": baseline, "baseline_compressed_best": compressed}
    per_seed = {
        "best": [1.0, 2.0, 3.0, 2.0, 2.0],
        "baseline_best": [5.0] * 5,
        "baseline_compressed_best": [3.0] * 5,
    }
    results = frontier.flatten({"B": fake_setting_result(setting, configs, per_seed)})
    assert results["targets"] == ["B@0.8", "B@0.84"]
    assert set(results) == {"targets", "best", "baseline_best", "baseline_compressed_best", "verdict"}
    best = results["best"]["B@0.84"]
    assert best["config"]["method"] == "event_admm" and best["bytes_mean"] == 2.0
    assert best["bytes_ci"] == pytest.approx(list(protocol.t_interval(per_seed["best"])))
    assert results["baseline_best"]["B@0.8"]["bytes_ci"] == [5.0, 5.0]
    results["settings"] = {"B": fake_setting_result(setting, configs, per_seed)}
    written = frontier.write_demo(json.loads(json.dumps(results)), tmp_path)  # as read back from JSON
    assert [p.name for p in written] == ["demo_baseline.toml", "demo_winner.toml"]
    base, win = (types.load(p) for p in written)
    assert (base.algorithm.name, win.algorithm.name) == ("scaffold", "event_admm")
    assert win.algorithm.fraction == 0.1 and win.algorithm.start == "common" and win.algorithm.delta == 1.0
    assert [p.kind for p in win.compression.up] == ["topk", "fp16"] and not base.compression.enabled
    for part in ("rounds", "seed", "data", "partition", "model", "eval"):  # like with like, equal rounds
        assert getattr(base, part) == getattr(win, part), part
    assert base.rounds == 100 and base.partition.num_clients == 100
    assert "B@0.84" in written[1].read_text().splitlines()[0]
    with pytest.raises(ValueError, match="no pair"):
        frontier.demo_configs(results, "B", target="B@0.9")


def test_a_run_stored_by_event_admm_is_read_back_by_the_frontier_and_a_compressed_one_is_not(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(ea, "RUNS", tmp_path / "runs" / "event_admm")
    monkeypatch.setattr(ea, "RESULTS", tmp_path / "results")
    tiny = TINY_EVENT_ADMM_SETTING | {"rounds": 2}
    fedavg = {"method": "fedavg", "compressor": "none", "fraction": 0.5}
    made = ea.run_one(tiny, ea.Spec("fedavg", (("fraction", 0.5), ("lr", 0.05)), 0))  # event_admm.py's
    mine = tiny | {"benchmark": "frontier", "shares": ("event_admm",)}

    def no_new_runs(*args, **kwargs):
        raise AssertionError("a stored run was run again")

    monkeypatch.setattr(ea, "start", no_new_runs)
    runs = frontier.run_points(mine, [fedavg], [0], None, jobs=1)
    assert runs[(protocol.label(fedavg), 0)].rows == made.rows
    assert not ea.runs_log(mine).exists()  # nothing new: the frontier's own log is still empty
    compressed = frontier.spec_of(mine, fedavg | {"compressor": "int8"}, 0, None)
    assert ea.key_of(mine, compressed) not in ea.stored_runs(mine)  # another config: another run
