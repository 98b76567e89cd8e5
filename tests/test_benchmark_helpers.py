"""benchmarks/event_admm.py's protocol pieces against hand-computed cases (issue 42)."""

import math

import pytest

from tests.benchmark_module import load_benchmark

protocol = load_benchmark("protocol")


def event_benchmark():
    return load_benchmark("event_admm")


def fake_run(bench, method, knob, seed, accuracies, events_per_round):
    rows = [
        {
            "accuracy": a,
            "messages_up": events_per_round * (k + 1),
            "messages_down": 0,
            "bytes_up": 0,
            "bytes_down": 0,
        }
        for k, a in enumerate(accuracies)
    ]
    return bench.Run(method, knob, seed, rows, 1, 10, len(rows), 0.0)


def test_a_target_is_reached_by_the_trailing_mean_not_one_noisy_round():
    bench = event_benchmark()
    run = fake_run(bench, "fedavg", "fraction=1.0", 0, [0.5, 0.9, 0.5, 0.8, 0.8, 0.8], 10)
    # trailing means over 3: 0.5, 0.7, 0.633, 0.733, 0.7, 0.8
    assert bench.SMOOTH == 3
    assert run.smoothed() == pytest.approx([0.5, 0.7, 1.9 / 3, 2.2 / 3, 2.1 / 3, 0.8])
    assert run.cost(0.75) == 60  # round 6, not round 2's single 0.9
    assert run.cost(0.85) is None
    # the exact tie of issue 42: 0.8394, 0.8406, 0.84 reach 0.84 in the round they complete
    tie = fake_run(bench, "fedavg", "x", 0, [0.2, 0.3, 0.8394, 0.8406, 0.84], 10)
    assert tie.cost(0.84) == 50


def test_every_method_searches_21_configurations_and_the_baselines_reach_c_0_05():
    bench = event_benchmark()
    for quick in (True, False):
        for build in bench.SETTINGS.values():
            setting = build(quick)
            sizes = {len(g) for g in bench.searches(setting).values()}
            assert sizes == ({2} if quick else {21})
    b = bench.setting_b(False)
    searches = bench.searches(b)
    assert {p["fraction"] for p in searches["fedadmm"].points} == set(b["fractions"])  # FedADMM: the same C
    assert min(b["fractions"]) == 0.05 and min(bench.setting_c(False)["fractions"]) == 0.05
    assert {p["delta"] for p in searches["event_admm"].points} == set(b["ladder"]) and 0.0 in b["ladder"]
    assert (
        bench.setting_c(False)["model"]["kind"] == "cnn"
        and bench.setting_c(False)["partition"]["alpha"] == 0.1
    )


def calibration(bench, rounds=10):
    """A Delta = 0 run whose trigger ratios are 0..99 (10 a round) and z changes 0..9."""
    ratios = {key: [float(i) for i in range(10 * rounds)] for key in ("absolute", "relative", "progress")}
    return bench.Run(
        "event_admm",
        "rho=0.1,delta=0.0",
        0,
        [],
        1,
        10,
        rounds,
        0.0,
        ratios,
        [float(i) for i in range(rounds)],
    )


def test_delta_is_a_ladder_step_times_the_calibrations_median_after_its_first_tenth():
    bench = event_benchmark()
    run = calibration(bench)
    # skip the first round (a tenth of 10): ratios 10..99, median 54.5; z changes 1..9, median 5
    assert bench.unit_of(run, "absolute") == (54.5, 5.0)
    assert bench.thresholds("event_admm", {"rho": 0.1, "delta": 2.0}, run) == (109.0, 10.0)
    assert bench.thresholds("event_admm_dz", {"rho": 0.1, "delta": 2.0}, run) == (
        54.5,
        10.0,
    )  # Delta at the unit
    assert bench.thresholds("event_admm_relative", {"rho": 0.1, "delta": 0.0}, run) == (0.0, 0.0)


def test_every_event_variant_at_delta_zero_is_the_one_calibration_run():
    """Full communication is one algorithm whatever the trigger: one run, charged to every variant."""
    bench = event_benchmark()
    setting = bench.setting_b(True) | {"quick": True}
    keys = {
        bench.key_of(setting, bench.Spec(m, (("rho", 0.1), ("delta", 0.0)), 0, (0.0, 0.0)))
        for m in bench.EVENT
        if m != "event_admm_dz"
    }
    assert len(keys) == 1
    other = bench.key_of(
        setting, bench.Spec("event_admm_decay", (("rho", 0.1), ("delta", 1.0)), 0, (1.0, 0.1))
    )
    assert other not in keys
    assert bench.algorithm_table("scaffold_code", {"fraction": 0.1, "lr": 0.03}, setting)["option"] == (
        "event_admm_code"
    )


def test_choice_targets_and_the_best_baseline_come_from_the_tuning_runs_only(monkeypatch):
    """Two tuning seeds. FedAvg at C = 1 reaches 0.8 in round 1 on both (20 and 40 events a round);
    at C = 0.5 it is faster on seed 0 but never reaches on seed 1, so it is out."""
    bench = event_benchmark()
    p = protocol.Protocol("tuning_seeds", (0, 1), (10, 11, 12, 13, 14))
    fedavg = protocol.grid("fedavg", fraction=[0.5, 1.0])
    event = protocol.grid("event_admm", rho=[0.1], delta=[0.0, 2.0])
    monkeypatch.setattr(bench, "searches", lambda setting: {"fedavg": fedavg, "event_admm": event})
    up = [0.8, 0.8, 0.8]
    tuned = {
        ("fedavg", "fraction=0.5", 0): fake_run(bench, "fedavg", "fraction=0.5", 0, up, 5),
        ("fedavg", "fraction=0.5", 1): fake_run(bench, "fedavg", "fraction=0.5", 1, [0.1] * 3, 5),
        ("fedavg", "fraction=1.0", 0): fake_run(bench, "fedavg", "fraction=1.0", 0, up, 20),
        ("fedavg", "fraction=1.0", 1): fake_run(bench, "fedavg", "fraction=1.0", 1, up, 40),
        ("event_admm", "rho=0.1,delta=0.0", 0): fake_run(bench, "e", "", 0, up, 20),
        ("event_admm", "rho=0.1,delta=0.0", 1): fake_run(bench, "e", "", 1, up, 20),
        ("event_admm", "rho=0.1,delta=2.0", 0): fake_run(bench, "e", "", 0, [0.7, 0.9, 0.9], 5),
        ("event_admm", "rho=0.1,delta=2.0", 1): fake_run(bench, "e", "", 1, [0.7, 0.9, 0.9], 5),
    }
    choice = bench.choose({"target_offsets": [0.0, 0.05]}, tuned, p)
    # ceiling: the best mean (over tuning seeds) of best trailing means: 0.8 for C = 1 and Delta = 0;
    # Delta = 2's trailing means are 0.7, 0.8, 0.8333: ceiling 0.8333 -> targets 0.83 and 0.78
    assert choice["ceiling"] == pytest.approx(2.5 / 3) and choice["targets"] == [0.83, 0.78]
    at = choice["chosen"]["fedavg"]["0.78"]
    assert at.label == "fraction=1.0" and at.scores == {"fraction=0.5": None, "fraction=1.0": 30.0}
    assert choice["chosen"]["fedavg"]["0.83"].point is None
    assert choice["chosen"]["event_admm"]["0.78"].label == "rho=0.1,delta=2.0"  # 10 events (round 2) < 20
    assert choice["best_baseline"] == {"0.83": None, "0.78": "fedavg"}


def test_savings_are_paired_ratios_and_claimed_only_where_the_interval_excludes_one():
    bench = event_benchmark()
    whole = [400.0] * 5
    fedadmm = {
        "knob": "k",
        "per_seed": [100.0, 120.0, 80.0, 100.0, 110.0],
        "reached": 5,
        "total_events": whole,
    }
    event = {"knob": "k", "per_seed": [50.0, 60.0, 40.0, 55.0, 50.0], "reached": 5, "total_events": whole}
    out = bench.compare(event, fedadmm, ("event_admm", "fedadmm"))
    ratios = [0.5, 0.5, 0.5, 0.55, 50 / 110]
    assert out["paired"]["mean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 5))
    assert out["paired"]["direction"] == -1 and out["claim"] is True  # whole interval below 0.65
    assert out["sentence"].startswith("event_admm needs 50% fewer events than fedadmm (better)")
    close = {"knob": "k", "per_seed": [90.0, 130.0, 70.0, 110.0, 100.0], "reached": 5}
    assert bench.compare(close, fedadmm, ("e", "f"))["paired"]["direction"] == 0
    short = {"knob": "k", "per_seed": [50.0, None, 40.0, 55.0, 50.0], "reached": 4}
    missed = bench.compare(short, fedadmm, ("e", "f"))
    assert missed["paired"] is None and missed["cell"] == "n/a (reached on 4 of 5 report seeds)"
    assert missed["direction"] == 0 and "not paired (e reached on 4 of 5" in missed["sentence"]
    lines = bench.conclusions({"fedadmm": {"event_admm": {"0.8": out}}}, [0.8])
    assert lines[0].startswith("At 80%, against fedadmm: event_admm needs 50% fewer events")
    assert lines[-1].endswith("against fedadmm: event_admm at 80%.")


def test_a_comparator_that_missed_the_target_is_charged_its_whole_run_so_only_a_saving_can_follow():
    """Issue 42's setting A: the best baseline chosen on the tuning seeds (FedADMM at C = 0.1) missed
    72% on 3 of 5 report seeds. Those seeds count its whole run's events, a lower bound of its cost."""
    bench = event_benchmark()
    event = {"knob": "k", "per_seed": [50.0, 60.0, 40.0, 55.0, 50.0], "reached": 5}
    base = {"knob": "k", "per_seed": [100.0, None, 80.0, None, None], "reached": 2}
    fewer = bench.compare(event, base | {"total_events": [999.0, 120.0, 999.0, 110.0, 100.0]}, ("e", "f"))
    assert fewer["paired"]["per_seed"][1] == pytest.approx(math.log(60 / 120))  # the whole run: 120
    assert fewer["direction"] == -1 and fewer["claim"] is True and fewer["censored"] == 3
    assert fewer["cell"].endswith("(separates; 3 of 5 seeds a lower bound)")
    assert fewer["sentence"].startswith("e needs 50% fewer events than f (better)")
    assert fewer["sentence"].endswith(
        "(f missed the target on 3 of 5 seeds: its whole run's events counted)."
    )
    short = {
        "knob": "k",
        "per_seed": [20.0, None, 15.0, None, None],
        "reached": 2,
        "total_events": [20.0] * 5,
    }
    more = bench.compare(event, short, ("e", "f"))  # 2-3x a lower bound of f's events: no direction
    assert more["paired"]["direction"] == 1 and more["direction"] == 0 and more["claim"] is False
    assert more["cell"].endswith("(3 of 5 seeds a lower bound)") and "separates" not in more["cell"]
    assert "to a lower bound of f's events, so no direction follows" in more["sentence"]
    assert "more events" not in more["sentence"] and "worse" not in more["sentence"]
    assert bench.conclusions({"f": {"e": {"0.72": more}}}, [0.72])[0].startswith("No paired interval")


def test_the_pareto_front_drops_dominated_configurations():
    bench = event_benchmark()
    tuned = {
        ("fedavg", "a", 0): fake_run(bench, "fedavg", "a", 0, [0.7], 10),  # 10 events, 0.7
        ("fedavg", "b", 0): fake_run(bench, "fedavg", "b", 0, [0.8], 20),  # 20 events, 0.8
        ("fedavg", "c", 0): fake_run(bench, "fedavg", "c", 0, [0.75], 30),  # dominated by b
    }
    assert [p["knob"] for p in bench.pareto(tuned)["fedavg"]] == ["a", "b"]


def test_a_target_the_initial_model_already_reaches_gives_no_ratio():
    bench = event_benchmark()
    zero = {"knob": "k", "per_seed": [0.0, 10.0], "reached": 2}
    base = {"knob": "k", "per_seed": [5.0, 10.0], "reached": 2, "total_events": [20.0, 20.0]}
    out = bench.compare(zero, base, ("e", "f"))
    assert out["paired"] is None and out["cell"] == "n/a (reached before any event)"


def test_the_readme_lines_count_the_generated_conclusions_per_comparator():
    """Each span is printed once: setting C's first render said "ratios 0.55-0.55" for two ratios."""
    bench = event_benchmark()
    fewer = {"paired": {"mean": 0.5}, "direction": -1, "claim": True}
    fewer_too = {"paired": {"mean": 0.503}, "direction": -1, "claim": True}  # 0.50 as printed
    fewer_small = {"paired": {"mean": 0.9}, "direction": -1, "claim": False}
    fewer_medium = {"paired": {"mean": 0.6}, "direction": -1, "claim": False}
    more = {"paired": {"mean": 1.4}, "direction": 1, "claim": False}
    unpaired = {"paired": None, "direction": 0, "claim": None}
    setting = {
        "targets": [0.7, 0.8],
        "best_baseline": {"0.7": "fedadmm", "0.8": None},
        "comparisons": {
            "best baseline": {
                "event_admm": {"0.7": fewer, "0.8": unpaired},
                "event_admm_randomized": {"0.7": fewer_too, "0.8": unpaired},
            },
            "scaffold_code": {
                "event_admm": {"0.7": fewer_small, "0.8": more},
                "event_admm_randomized": {"0.7": fewer_medium, "0.8": unpaired},
            },
        },
    }
    assert bench.readme_lines({"A": setting}).splitlines() == [
        "- Setting A, against the best baseline (fedadmm, chosen on the tuning seeds), 4 variant-target "
        "pairs: fewer events in 2 (ratio 0.50 in each), more in none, no direction or not paired in 2; "
        "the paper's >= 35% fewer events: in 2.",
        "- Setting A, against scaffold_code, 4 variant-target pairs: fewer events in 2 (ratios 0.60-0.90), "
        "more in 1 (ratio 1.40), no direction or not paired in 1; the paper's >= 35% fewer events: "
        "nowhere.",
        "- Setting B: not yet run under the protocol; no claim.",
        "- Setting C: not yet run under the protocol; no claim.",
    ]
