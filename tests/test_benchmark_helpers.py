"""benchmarks/intervals.py and benchmarks/sweep.py against hand-computed cases."""

import math

import pytest

from tests.benchmark_module import load_benchmark

intervals = load_benchmark("intervals")
sweep = load_benchmark("sweep")


def test_t_interval_matches_the_t_table():
    # mean 2, s = 1, n = 3: 2 +- t_{0.975, 2} / sqrt(3), t_{0.975, 2} = 4.30265 (any t table)
    lo, hi = intervals.t_interval([1.0, 2.0, 3.0])
    assert (lo + hi) / 2 == pytest.approx(2.0)
    assert (hi - lo) / 2 == pytest.approx(4.30265 / math.sqrt(3), abs=1e-5)
    # mean 5, s^2 = 32 / 7, n = 8, t_{0.975, 7} = 2.36462
    lo, hi = intervals.t_interval([2, 4, 4, 4, 5, 5, 7, 9])
    assert (hi - lo) / 2 == pytest.approx(2.36462 * math.sqrt(32 / 7) / math.sqrt(8), abs=1e-5)
    assert intervals.t_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)


def test_bootstrap_of_two_values_is_the_exact_percentile_interval():
    # resampled means of [0, 1] are 0, 1/2, 1 with probability 1/4, 1/2, 1/4: the 2.5% and 97.5%
    # percentiles are 0 and 1 (each end has ~25% of the mass, far above 2.5%)
    assert intervals.bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    # the same seed gives the same interval
    values = [0.3, 1.2, 0.7, 2.5, 1.1]
    assert intervals.bootstrap_interval(values, seed=4) == intervals.bootstrap_interval(values, seed=4)


def test_bootstrap_over_groups_resamples_each_group_on_its_own():
    # difference of means of [0, 1] and [10, 10]: the second group never varies, the first gives
    # means 0, 1/2, 1 with probability 1/4, 1/2, 1/4, so the interval is exactly [10 - 1, 10 - 0]
    lo, hi = intervals.bootstrap_groups([[0.0, 1.0], [10.0, 10.0]], lambda a, b: b.mean() - a.mean())
    assert (lo, hi) == (9.0, 10.0)
    with pytest.raises(intervals.IntervalError):
        intervals.bootstrap_groups([[0.0, 1.0], [10.0]], lambda a, b: b.mean() - a.mean())


def test_too_few_seeds_is_a_clear_error():
    with pytest.raises(intervals.IntervalError, match="at least two"):
        intervals.t_interval([1.0])
    with pytest.raises(intervals.IntervalError):
        intervals.t_interval([1.0, float("nan")])


def test_a_conclusion_only_where_intervals_separate():
    assert intervals.separated((0, 1), (1.5, 2)) and intervals.separated((1.5, 2), (0, 1))
    assert not intervals.separated((0, 1), (0.9, 2))
    assert intervals.verdict("a", (0, 1), "b", (2, 3)) == "a beats b (95% intervals separate)"
    assert intervals.verdict("a", (0, 1), "b", (2, 3), lower_is_better=False).startswith("b beats a")
    assert "overlap" in intervals.verdict("a", (0, 2), "b", (1, 3))


def test_grids_are_products_and_budgets_must_match():
    event = sweep.grid("event_admm", rho=[0.1, 1.0], quantile=[0.5, 0.9])
    assert event.points == (
        {"rho": 0.1, "quantile": 0.5},
        {"rho": 0.1, "quantile": 0.9},
        {"rho": 1.0, "quantile": 0.5},
        {"rho": 1.0, "quantile": 0.9},
    )
    fedavg = sweep.grid("fedavg", fraction=[0.1, 0.3, 0.5, 1.0])
    assert sweep.budget([event, fedavg]) == 4
    with pytest.raises(sweep.BudgetError, match="unequal tuning budgets"):
        sweep.budget([event, sweep.grid("fedprox", fraction=[0.5, 1.0])])


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
    assert list(bench.smoothed(run.rows)) == pytest.approx([0.5, 0.7, 1.9 / 3, 2.2 / 3, 2.1 / 3, 0.8])
    assert run.first_reaching(0.75) is run.rows[5]  # not round 2's single 0.9
    assert run.first_reaching(0.85) is None


def test_the_tuned_configuration_reaches_the_target_in_every_seed_with_fewest_mean_events():
    bench = event_benchmark()
    up = [0.8, 0.8, 0.8]
    runs = [
        # fast: reaches 0.8 at round 3 (30 events) in seed 0 but never in seed 1: not eligible
        fake_run(bench, "fedavg", "fast", 0, up, 10),
        fake_run(bench, "fedavg", "fast", 1, [0.1, 0.1, 0.1], 10),
        # steady: round 1 in every seed, 20 and 40 events per round
        fake_run(bench, "fedavg", "steady", 0, up, 20),
        fake_run(bench, "fedavg", "steady", 1, up, 40),
        fake_run(bench, "fedavg", "steady", 2, up, 30),
    ]
    best = bench.tuned(runs, "fedavg", 0.8, "events")
    assert best["knob"] == "steady" and best["values"] == [20.0, 40.0, 30.0] and best["mean"] == 30.0
    assert best["ci"] == pytest.approx(
        [30 - 4.30265 * 10 / math.sqrt(3), 30 + 4.30265 * 10 / math.sqrt(3)], abs=1e-4
    )
    assert bench.tuned(runs, "fedavg", 0.9, "events") is None


def test_savings_are_claimed_only_where_intervals_separate():
    bench = event_benchmark()
    best = {m: {"0.8": None} for m in bench.METHODS}
    best["fedavg"]["0.8"] = {"mean": 100.0, "ci": [90.0, 110.0]}
    best["event_admm"]["0.8"] = {"mean": 50.0, "ci": [40.0, 60.0]}
    best["event_admm_relative"]["0.8"] = {"mean": 95.0, "ci": [80.0, 100.0]}
    out = bench.saving(best, 0.8)
    assert out["event_admm"] == {"saving": 0.5, "separated": True}
    assert out["event_admm_relative"] == {"saving": pytest.approx(0.05), "separated": False}
    lines = bench.conclusions({"0.8": out}, [0.8], best)
    assert lines == [
        "At 80%, event_admm needs 50% fewer events than the best baseline (95% intervals separate)."
    ]
    best["fedavg"]["0.8"] = None  # no baseline reached it: no events to compare, and it is said
    lines = bench.conclusions({"0.8": bench.saving(best, 0.8)}, [0.8], best)
    assert lines == [
        "At 80%, no baseline method reached the target in every seed; event_admm, event_admm_relative did.",
        "No event variant's 95% interval separates from the best baseline's: no claim on events.",
    ]


def test_the_pareto_front_drops_dominated_configurations():
    bench = event_benchmark()
    runs = [
        fake_run(bench, "fedavg", "a", 0, [0.7], 10),  # 10 events, 0.7
        fake_run(bench, "fedavg", "b", 0, [0.8], 20),  # 20 events, 0.8
        fake_run(bench, "fedavg", "c", 0, [0.75], 30),  # dominated by b
    ]
    assert [p["knob"] for p in bench.pareto(runs)["fedavg"]] == ["a", "b"]


def test_every_method_gets_the_same_tuning_budget():
    bench = event_benchmark()
    for quick in (True, False):
        for setting in (bench.setting_a(quick), bench.setting_b(quick)):
            sizes = {len(g) for g in bench.grids(setting).values()}
            assert len(sizes) == 1
