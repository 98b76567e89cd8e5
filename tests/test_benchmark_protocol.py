"""benchmarks/protocol.py against hand-computed cases (issue 42).

t quantiles from any t table: t_{0.975, 2} = 4.30265, t_{0.975, 4} = 2.77645, t_{0.975, 7} = 2.36462.
"""

import math

import numpy as np
import pytest

from tests.benchmark_module import load_benchmark

protocol = load_benchmark("protocol")
T2, T4, T7 = 4.30265273, 2.77644511, 2.36462425


# ----- seeds -----
def test_tuning_and_report_seeds_never_overlap_and_a_claim_needs_five_report_seeds():
    with pytest.raises(protocol.ProtocolError, match=r"seeds \[2\] are both tuning and report"):
        protocol.Protocol("tuning_seeds", (0, 1, 2), (2, 3, 4, 5, 6))
    with pytest.raises(protocol.ProtocolError, match="at least 5"):
        protocol.Protocol("tuning_seeds", (0,), (1, 2, 3))
    with pytest.raises(protocol.ProtocolError, match="repeat"):
        protocol.Protocol("tuning_seeds", (0,), (1, 1, 2, 3, 4))
    with pytest.raises(protocol.ProtocolError, match="needs tuning seeds"):
        protocol.Protocol("tuning_seeds", (), (1, 2, 3, 4, 5))
    smoke = protocol.Protocol("tuning_seeds", (0,), (1, 2), smoke=True)  # --quick: labelled, two seeds
    record = smoke.record({"a": 2, "b": 2})
    assert record == {
        "selection": "tuning_seeds",
        "tuning_seeds": [0],
        "report_seeds": [1, 2],
        "configs_per_method": {"a": 2, "b": 2},
        "smoke": True,
    }
    assert "Smoke run" in protocol.protocol_lines(record)


def test_searches_of_unequal_size_are_refused_unless_a_reason_is_recorded():
    event = protocol.grid("event", rho=[0.1, 1.0], delta=[1, 2])
    fedavg = protocol.grid("fedavg", fraction=[0.1, 0.3, 0.5, 1.0])
    assert event.points[1] == {"rho": 0.1, "delta": 2}
    assert protocol.label(event.points[1]) == "rho=0.1,delta=2"
    assert protocol.budget([event, fedavg]) == {"event": 4, "fedavg": 4}
    short = protocol.grid("fedprox", fraction=[0.5, 1.0])
    with pytest.raises(protocol.BudgetError, match="unequal searches"):
        protocol.budget([event, short])
    sizes = protocol.budget([event, short], unequal_because="fedprox has one knob")
    record = protocol.Protocol("none", (), range(5)).record(sizes, "fedprox has one knob")
    assert record["unequal_because"] == "fedprox has one knob"


# ----- selection -----
def test_selection_never_looks_at_report_seeds_so_perturbing_them_moves_nothing():
    p = protocol.Protocol("tuning_seeds", (100, 101), (0, 1, 2, 3, 4))
    search = protocol.grid("m", c=[0.1, 0.5, 1.0])
    results = {(c, s): 10 * c + s % 7 for c in (0.1, 0.5, 1.0) for s in (100, 101, 0, 1, 2, 3, 4)}
    seen = []

    def score(point, seed):
        seen.append(seed)
        return results[(point["c"], seed)]

    choice = protocol.select(search, score, p)
    assert set(seen) == {100, 101}
    assert choice.point == {"c": 0.1} and choice.searched == 3
    assert choice.scores["c=0.5"] == pytest.approx((5 + 100 % 7 + 5 + 101 % 7) / 2)
    for s in p.report_seeds:  # make c = 1.0 the best on every report seed, by far
        results[(1.0, s)] = -1e9
    assert protocol.select(search, score, p) == choice


def test_a_point_that_fails_on_a_tuning_seed_is_out_and_ties_go_to_the_earlier_point():
    p = protocol.Protocol("tuning_seeds", (0, 1), range(10, 15))
    values = {("a", 0): 5.0, ("a", 1): None, ("b", 0): 3.0, ("b", 1): 3.0, ("c", 0): 2.0, ("c", 1): 4.0}
    choice = protocol.select(protocol.grid("m", k=["a", "b", "c"]), lambda pt, s: values[(pt["k"], s)], p)
    assert choice.scores == {"k=a": None, "k=b": 3.0, "k=c": 3.0}
    assert choice.label == "k=b"  # b and c tie at 3: the earlier one
    nothing = protocol.select(protocol.grid("m", k=["a"]), lambda pt, s: values[(pt["k"], s)], p)
    assert nothing.point is None
    fixed = protocol.Protocol("none", (), range(5))
    assert protocol.select(protocol.grid("m", k=["a"]), None, fixed).label == "k=a"
    with pytest.raises(protocol.BudgetError, match="nothing tunes"):
        protocol.select(protocol.grid("m", k=["a", "b"]), None, fixed)


# ----- thresholds -----
def test_an_exact_tie_at_a_target_reaches_it_where_cumulative_sums_did_not():
    """Issue 42's event_admm_dz cell: 0.8394, 0.8406, 0.84 average to 0.84 exactly; the trailing
    mean from cumulative sums gave 0.8399999999999999 after these first rounds and counted one
    round late."""
    accuracy = [0.2, 0.3, 0.8394, 0.8406, 0.84]
    cumulative = np.concatenate([[0.0], np.cumsum(accuracy)])
    assert (cumulative[5] - cumulative[2]) / 3 < 0.84  # the defect this protocol removes
    means = protocol.trailing_mean(accuracy, 3)
    assert means[:2] == [0.2, 0.25] and means[2] == pytest.approx((0.2 + 0.3 + 0.8394) / 3)
    assert protocol.first_reaching(means, 0.84) == 4
    assert protocol.reaches(0.84 - 1e-12, 0.84) and not protocol.reaches(0.8399, 0.84)
    rows = [{"accuracy": a, "events": 10 * (i + 1)} for i, a in enumerate(accuracy)]
    assert protocol.cost_to_target(rows, 0.84, lambda r: r["events"], window=3) == 50.0
    assert protocol.cost_to_target(rows, 0.85, lambda r: r["events"], window=3) is None


def test_targets_round_down_and_a_multiple_counts_as_one():
    assert math.floor((0.82 - 0.05) * 100) == 76  # 76.99999999999999: floor alone gives 0.76
    assert protocol.floor_to(0.82 - 0.05) == 0.77
    assert protocol.floor_to(0.8613 - 0.01) == 0.85
    assert protocol.floor_to(0.8599) == 0.85


# ----- intervals and tests -----
def test_t_interval_matches_the_t_table():
    lo, hi = protocol.t_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, n = 3
    assert (lo + hi) / 2 == pytest.approx(2.0) and (hi - lo) / 2 == pytest.approx(T2 / math.sqrt(3), abs=1e-6)
    lo, hi = protocol.t_interval([2, 4, 4, 4, 5, 5, 7, 9])  # mean 5, s^2 = 32 / 7
    assert (hi - lo) / 2 == pytest.approx(T7 * math.sqrt(32 / 7) / math.sqrt(8), abs=1e-5)
    assert protocol.t_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)
    with pytest.raises(protocol.IntervalError, match="at least two"):
        protocol.t_interval([1.0])
    e = protocol.estimate([1.0, math.nan, 3.0])
    assert (e.n, e.mean) == (2, 2.0) and protocol.estimate([5.0]).lo is None
    half = T2 / math.sqrt(3)
    assert protocol.estimate([1.0, 2.0, 3.0]).text(2) == f"2.00 [{2 - half:.2f}, {2 + half:.2f}]"


def test_a_paired_t_interval_by_hand_with_wilcoxon_beside_it():
    # per-seed differences 1, 2, 3, 2, 2: mean 2, s^2 = (1 + 0 + 1 + 0 + 0) / 4 = 0.5, n = 5
    a, b = [11.0, 12.0, 13.0, 12.0, 12.0], [10.0, 10.0, 10.0, 10.0, 10.0]
    p = protocol.paired(a, b, ("a", "b"))
    half = T4 * math.sqrt(0.5) / math.sqrt(5)
    assert p.mean == 2.0 and (p.lo, p.hi) == pytest.approx((2 - half, 2 + half), abs=1e-6)
    assert p.wilcoxon_p == pytest.approx(1 / 16)  # exact: all five signs positive, two-sided 2 / 2^5
    assert (p.direction, p.agree, p.n) == (1, 5, 5)
    assert p.sentence("regret").startswith("a is worse than b on regret (higher): difference +2.000 [")
    assert "5 of 5 seeds agree" in p.sentence("regret") and "Wilcoxon p = 0.0625" in p.sentence("regret")
    # differences -1, 1, 0, -2, 2
    mixed = protocol.paired([1.0, 3.0, 2.0, 0.0, 2.0], [2.0, 2.0, 2.0, 2.0, 0.0], ("a", "b"))
    assert mixed.direction == 0 and mixed.sentence("loss").startswith("a against b on loss: no conclusion")


def test_a_ratio_is_the_geometric_mean_with_its_interval_taken_on_the_log():
    p = protocol.paired([50.0, 60.0, 40.0], [100.0, 100.0, 100.0], ("event", "fedavg"), ratio=True)
    logs = np.log([0.5, 0.6, 0.4])
    half = T2 * logs.std(ddof=1) / math.sqrt(3)
    assert p.mean == pytest.approx(math.exp(logs.mean()))
    assert (p.lo, p.hi) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert p.sentence("events").startswith("event needs 51% fewer events than fedavg (better): ratio 0.49 [")
    with pytest.raises(protocol.IntervalError, match="same seeds"):
        protocol.paired([1.0, 2.0], [1.0, 2.0, 3.0])


def test_seeds_for_power_matches_the_published_sample_sizes():
    """One-sample (paired) two-sided t-test at alpha = 0.05 and power 0.8: Cohen's d = 1 needs
    n = 10, d = 0.5 needs n = 34 (Cohen 1988, Table 2.4.1; G*Power gives the same)."""
    pilot = [-1.0, 0.0, 1.0]  # sample sd 1
    assert protocol.seeds_for_power(pilot, effect=1.0) == 10
    assert protocol.seeds_for_power(pilot, effect=0.5) == 34
    assert protocol.seeds_for_power([2.0, 2.0], effect=1.0) == 2  # no spread


def test_the_hierarchical_bootstrap_resamples_seeds_not_only_examples():
    """Seed 0 scores 0 on all its examples, seed 1 scores 1: resampling the examples within seeds
    gives the mean 0.5 every time (the old per-example interval, a point); resampling the seeds gives
    means 0, 0.5, 1 with probability 1/4, 1/2, 1/4, so the 95% interval is [0, 1]."""
    scores = [np.zeros(20), np.ones(20)]

    def statistic(seeds, picks):
        return {"mean": float(np.mean([scores[s][p].mean() for s, p in zip(seeds, picks, strict=True)]))}

    out = protocol.hierarchical_bootstrap([20, 20], statistic, resamples=400)
    assert out.point == {"mean": 0.5} and out.interval["mean"] == (0.0, 1.0)
    with pytest.raises(protocol.IntervalError, match="two seeds"):
        protocol.hierarchical_bootstrap([20], statistic)


def test_a_bootstrap_over_groups_resamples_each_group_on_its_own():
    # the second group never varies; the first's means are 0, 1/2, 1 w.p. 1/4, 1/2, 1/4
    lo, hi = protocol.bootstrap_groups([[0.0, 1.0], [10.0, 10.0]], lambda a, b: b.mean() - a.mean())
    assert (lo, hi) == (9.0, 10.0)


# ----- docs -----
def test_a_generated_block_is_replaced_and_the_text_around_it_kept(tmp_path):
    path = tmp_path / "b.md"
    path.write_text("# B\n\nintro\n\n<!-- x:begin -->\nold\n<!-- x:end -->\n\nafter\n")
    protocol.replace_section("x", "new", "X", path)
    assert path.read_text() == "# B\n\nintro\n\n<!-- x:begin -->\nnew\n<!-- x:end -->\n\nafter\n"
    protocol.replace_section("y", "fresh", "Y", path)
    assert path.read_text().endswith("## Y\n\n<!-- y:begin -->\nfresh\n<!-- y:end -->\n")
    assert protocol.markdown_table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_a_saved_figure_is_a_png_in_a_made_folder_and_is_closed(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = protocol.save_figure(fig, tmp_path / "img" / "a.png")
    assert path == tmp_path / "img" / "a.png"
    assert path.read_bytes().startswith(b"\x89PNG")
    assert not plt.fignum_exists(fig.number)


def test_a_t_interval_that_excludes_zero_is_no_claim_where_the_signed_ranks_disagree():
    """Issue 42's FedQ-B against UCB-B over ten MDP instances: the t-interval ends at -0.009, 6 of 10
    instances agree, Wilcoxon p = 0.084: no conclusion. With five seeds Wilcoxon cannot reject (its
    smallest p is 1/16), so there the t-interval alone decides."""
    fedq_b = [2.2183, 1.8626, 2.3486, 2.5642, 2.1181, 2.1055, 2.5673, 2.1881, 2.687, 2.5167]
    ucb_b = [2.3555, 1.8536, 2.4978, 2.512, 2.0963, 2.2816, 2.7384, 2.1355, 2.8242, 2.7576]
    p = protocol.paired(fedq_b, ucb_b, ("FedQ-B", "UCB-B"))
    assert p.hi < 0 and p.hi == pytest.approx(-0.0094, abs=1e-4) and p.agree == 6
    assert 0.05 < p.wilcoxon_p < 0.09  # 0.084 unrounded; 82 / 1024 with these four-digit values
    assert p.direction == 0 and p.signed_ranks_disagree
    assert "excludes 0 but Wilcoxon's test does not agree at 5%" in p.sentence("normalised regret")
    five = protocol.paired([11.0, 12.0, 13.0, 12.0, 12.0], [10.0] * 5)  # Wilcoxon p = 1/16 > 0.05
    assert five.direction == 1 and not five.signed_ranks_disagree


def test_an_interval_against_a_bound_counts_the_bound_on_the_claimed_side_only():
    def interval(lo, hi):
        return protocol.Paired("a", "b", "difference", 5, (lo + hi) / 2, lo, hi, None, 5, [])

    assert interval(0.5, 0.65).against(0.65, "below") == "yes"  # the bound itself is on the claimed side
    assert interval(0.5, 0.65 + 1e-12).against(0.65, "below") == "yes"  # within TOLERANCE of it
    assert interval(0.6, 0.7).against(0.65, "below") == "open"
    assert interval(0.65, 0.7).against(0.65, "below") == "open"  # touching from the other side: not "no"
    assert interval(0.66, 0.7).against(0.65, "below") == "no"
    assert interval(-0.03, -0.01).against(-0.03, "above") == "yes"
    assert interval(-0.05, -0.03).against(-0.03, "above") == "open"
    assert interval(-0.05, -0.031).against(-0.03, "above") == "no"
