"""benchmarks/fedq_instances.py (FedQ across MDP instances) against hand-computed cases.

t quantiles from any t table: t_{0.975, 1} = 12.7062, t_{0.975, 2} = 4.30265, t_{0.975, 3} = 3.18245.
"""

import hashlib
import math

import numpy as np
import pytest

from taciturn.rl import random_mdp
from tests.benchmark_module import load_benchmark

across = load_benchmark("fedq_instances")
T1, T2, T3 = 12.7062047, 4.30265273, 3.18244631


def test_each_instance_has_its_own_run_seeds():
    assert across.instance_seeds(0, 1) == [0]
    assert across.instance_seeds(3, 2) == [6, 7]
    seeds = [s for i in range(10) for s in across.instance_seeds(i, 3)]
    assert sorted(seeds) == list(range(30))  # no two (instance, path) pairs share a stream


def test_instance_i_is_the_mdp_taciturn_run_draws_with_mdp_seed_i_and_instances_differ():
    """Instance i: random_mdp from SeedSequence(i, spawn_key=(round 0, server 0, blake2b('mdp')))."""
    bench = load_benchmark("fedq")
    purpose = int.from_bytes(hashlib.blake2b(b"mdp", digest_size=8).digest(), "little")
    mdps = [bench.make_mdp(2, 3, 2, seed=i) for i in range(10)]
    for i, mdp in enumerate(mdps):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(i, spawn_key=(0, 0, purpose))))
        reference = random_mdp(3, 2, 2, rng)
        assert np.array_equal(mdp.rewards, reference.rewards)
        assert np.array_equal(mdp.transitions, reference.transitions)
        again = bench.make_mdp(2, 3, 2, seed=i)
        assert np.array_equal(mdp.rewards, again.rewards) and np.array_equal(
            mdp.transitions, again.transitions
        )
    for a in range(10):
        for b in range(a):
            assert not np.array_equal(mdps[a].rewards, mdps[b].rewards)
    assert len({m.min_gap() for m in mdps}) == 10


def test_sweep_points_fix_the_other_two_quantities_at_two():
    assert across.config("M", 4) == (2, 2, 4)  # (S, A, M)
    assert across.config("S", 6) == (6, 2, 2)
    assert across.config("A", 8) == (2, 8, 2)
    with pytest.raises(ValueError, match="swept"):
        across.config("H", 2)


def test_window_and_delta_labels():
    assert across.window_label(5e5, 1e7) == "5e+05-1e+07"
    assert across.window_label(250, 5000) == "250-5e+03"
    assert across.delta_labels((0.01, 0.05)) == ["<0.01", "0.01-0.05", ">=0.05"]
    assert [across.delta_bin(d) for d in (0.005, 0.01, 0.049, 0.05, math.inf)] == [
        "<0.01",
        "0.01-0.05",
        "0.01-0.05",
        ">=0.05",
        ">=0.05",
    ]


def test_summary_is_the_mean_with_its_t_interval_over_finite_values():
    # [1, 2, 3, 4]: mean 2.5, s = sqrt(5/3), sem = s / 2, half width t_{0.975, 3} * sem
    s = across.summary([1.0, 2.0, 3.0, 4.0])
    half = T3 * math.sqrt(5 / 3) / 2
    assert s["mean"] == 2.5 and s["median"] == 2.5 and (s["min"], s["max"], s["n"]) == (1.0, 4.0, 4)
    assert s["lo"] == pytest.approx(2.5 - half, abs=1e-6) and s["hi"] == pytest.approx(2.5 + half, abs=1e-6)
    # nan (a fit without two points) is left out and n says so: [1, 3], s = sqrt 2, sem = 1
    s = across.summary([1.0, math.nan, 3.0])
    assert s["n"] == 2 and s["mean"] == 2.0
    assert s["lo"] == pytest.approx(2 - T1, abs=1e-6) and s["hi"] == pytest.approx(2 + T1, abs=1e-6)
    assert across.summary([5.0])["lo"] is None and across.summary([5.0])["mean"] == 5.0
    assert across.summary([])["n"] == 0 and across.summary([])["mean"] is None


def test_a_paired_difference_is_claimed_only_when_its_interval_excludes_zero():
    # differences 2, 3, 4: mean 3, s = 1, half width t_{0.975, 2} / sqrt 3 = 2.4841 -> [0.516, 5.484]
    d = across.difference([3.0, 4.0, 5.0], [1.0, 1.0, 1.0])
    assert d["lo"] == pytest.approx(3 - T2 / math.sqrt(3), abs=1e-6) and d["sign"] == "above"
    # Wilcoxon beside it, exact: all three signs positive, two-sided p = 2 / 2^3
    assert d["wilcoxon_p"] == pytest.approx(0.25) and d["agree"] == 3
    assert across.difference_sentence("a", "b", d, " (rounds)") == (
        "a - b (rounds): +3 [+0.516, +5.48] over 3 instances (paired; Wilcoxon p = 0.25; 3 of 3 agree); "
        "a is above b (95% interval excludes 0)"
    )
    assert across.difference([1.0, 1.0, 1.0], [3.0, 4.0, 5.0])["sign"] == "below"
    d = across.difference([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])  # -1, 0, 1
    assert d["sign"] is None
    assert across.difference_sentence("a", "b", d).endswith("the interval contains 0: no difference detected")


def test_slopes_are_said_to_differ_only_for_pairs_whose_intervals_separate():
    # "2": 1 +- 4.30265 * 0.1 / sqrt 3 = [0.752, 1.248]; "4": 1 +- 0.497 = [0.503, 1.497];
    # "8": [4.752, 5.248]: 2-4 overlap, 2-8 and 4-8 separate
    out = across.compare_values({"2": [1.0, 1.1, 0.9], "4": [1.0, 1.2, 0.8], "8": [5.0, 5.1, 4.9]})
    assert out["separated_pairs"] == [["2", "8"], ["4", "8"]]
    assert out["verdict"] == "differ: 2 vs 8, 4 vs 8 separate; paired 8-2: above 0"
    # 8 minus 2 by instance: 4.0, 4.0, 4.0 (up to rounding) -> an interval at 4, above 0
    extremes = out["largest_minus_smallest"]
    assert extremes["lo"] == pytest.approx(4.0) and extremes["hi"] == pytest.approx(4.0)
    assert extremes["sign"] == "above"
    out = across.compare_values({"2": [1.0, 1.1, 0.9], "4": [1.0, 1.2, 0.8]})
    assert out["separated_pairs"] == []
    # widest 2 * 0.4968; 4 minus 2 by instance: 0, 0.1, -0.1, mean 0
    assert out["verdict"] == "no pair separates (widest interval 0.994); paired 4-2: contains 0"
    assert across.compare_values({"2": [1.0], "4": [2.0]})["verdict"].startswith("fewer than two")


RUNS = [  # (S, A, M, instance) records as the benchmark writes them, one fit window "w"
    {"S": 2, "A": 2, "M": 2, "instance": 1, "delta_min": 0.2, "slopes": {"w": 7.0}},
    {"S": 2, "A": 2, "M": 2, "instance": 0, "delta_min": 0.1, "slopes": {"w": 6.0}},
    {"S": 2, "A": 2, "M": 4, "instance": 0, "delta_min": 0.1, "slopes": {"w": 6.5}},
    {"S": 2, "A": 2, "M": 4, "instance": 1, "delta_min": 0.2, "slopes": {"w": 6.9}},
    {"S": 4, "A": 2, "M": 2, "instance": 0, "delta_min": 0.03, "slopes": {"w": 9.0}},
    {"S": 4, "A": 2, "M": 2, "instance": 1, "delta_min": 0.005, "slopes": {"w": 12.0}},
]


def test_a_sweep_collects_each_values_runs_in_instance_order_and_shares_the_base_point():
    assert across.sweep_slopes(RUNS, "M", (2, 4), "w") == {"2": [6.0, 7.0], "4": [6.5, 6.9]}
    assert across.sweep_slopes(RUNS, "S", (2, 4), "w") == {"2": [6.0, 7.0], "4": [9.0, 12.0]}
    assert across.sweep_slopes(RUNS, "A", (2,), "w") == {"2": [6.0, 7.0]}


def test_the_sensitivity_table_pools_the_runs_of_each_delta_min_class():
    table = across.sensitivity(RUNS, ["w"])["w"]
    assert list(table) == ["<0.01", "0.01-0.05", ">=0.05"]
    assert (table["<0.01"]["mean"], table["<0.01"]["n"], table["<0.01"]["lo"]) == (12.0, 1, None)
    assert (table["0.01-0.05"]["mean"], table["0.01-0.05"]["n"]) == (9.0, 1)
    # 7.0, 6.0, 6.5, 6.9: mean 6.6, sum of squares 0.62, s = sqrt(0.62 / 3), sem = s / 2
    big = table[">=0.05"]
    half = T3 * math.sqrt(0.62 / 3) / 2
    assert big["n"] == 4 and big["mean"] == pytest.approx(6.6) and big["median"] == pytest.approx(6.7)
    assert big["lo"] == pytest.approx(6.6 - half, abs=1e-6) and big["hi"] == pytest.approx(
        6.6 + half, abs=1e-6
    )


def test_rounds_statistics_tests_each_sweep_at_each_window():
    stats = across.rounds_statistics(RUNS, (2, 4), ["w"])
    assert stats["slopes"]["w"]["S"]["4"]["mean"] == 10.5
    # M: [6, 7] against [6.5, 6.9] overlap; the A sweep has no A = 4 runs, so one value with an interval
    assert stats["equal_slopes"]["w"]["M"]["separated_pairs"] == []
    assert stats["slopes"]["w"]["A"]["4"]["n"] == 0
    assert stats["equal_slopes"]["w"]["A"]["verdict"].startswith("fewer than two")
    assert stats["equal_slopes"]["w"]["A"]["largest_minus_smallest"] is None  # no A = 4 instances to pair
    # M = 4 minus M = 2, instance by instance: 6.5 - 6.0, 6.9 - 7.0 = 0.5, -0.1: mean 0.2, s = 0.3 sqrt 2,
    # sem 0.3, half width t_{0.975, 1} * 0.3: the interval contains 0
    d = stats["equal_slopes"]["w"]["M"]["largest_minus_smallest"]
    assert d["mean"] == pytest.approx(0.2) and d["sign"] is None
    assert d["lo"] == pytest.approx(0.2 - 0.3 * T1, abs=1e-6) and d["hi"] == pytest.approx(
        0.2 + 0.3 * T1, abs=1e-6
    )
