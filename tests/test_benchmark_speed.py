"""The speed benchmark's statistics and claims (the timings live in docs/benchmarks.md)."""

import math

import pytest

from tests.benchmark_module import load_benchmark


def test_ratio_interval_is_a_t_interval_of_paired_log_ratios():
    speed = load_benchmark("speed")
    # log ratios ln(1/2), 0, ln 2: mean 0, sd ln 2, n = 3, t(0.975, 2) = 4.302653
    r = speed.ratio_interval([1.0, 3.0, 8.0], [2.0, 3.0, 4.0])
    half = 4.302653 * math.log(2) / math.sqrt(3)
    assert r["mean"] == pytest.approx(1.0)
    assert r["median"] == pytest.approx(1.0)
    assert (r["low"], r["high"]) == pytest.approx((math.exp(-half), math.exp(half)), rel=1e-6)
    assert r["reps"] == 3


def test_claims_need_the_whole_interval_below_the_bar():
    speed = load_benchmark("speed")
    below = {"mean": 0.9, "low": 0.88, "high": 0.93, "reps": 5}
    straddles = {"mean": 0.93, "low": 0.9, "high": 0.96, "reps": 5}
    w3 = {"wall_s": {"taciturn": 5.6, "taciturn_vectorized": 5.4, "taciturn_parallel": 7.0, "floor": 6.0}}
    (w, auto) = speed.claims({"W": {"ratio_to_floor": {"taciturn": below}}, "W3": w3})
    assert w.startswith("W at or below 0.95x the floor: holds")
    assert "taciturn_vectorized" in auto and "holds (auto 5.60 s" in auto  # 5.6 / 5.4 = 1.037
    (w,) = speed.claims({"W": {"ratio_to_floor": {"taciturn": straddles}}})
    assert "does not hold" in w
    w3["wall_s"]["taciturn"] = 5.7  # 1.056x the fastest
    assert "does not hold" in speed.claims({"W3": w3})[0]


def test_what_auto_ran_is_read_from_the_run_log(tmp_path):
    speed = load_benchmark("speed")
    log = tmp_path / "run.log"
    log.write_text("2026 INFO taciturn: executor: sequential or parallel with 2 workers (probe...); client\n")
    assert speed.executor_decision(log) == "sequential or parallel with 2 workers"
    with log.open("a") as f:
        f.write(
            "2026 INFO taciturn.engine.trial: executor trial (best of 2): a 1 s, b 2 s (2.00x): keeping a\n"
        )
    assert speed.executor_decision(log) == "trial (best of 2): a 1 s, b 2 s (2.00x): keeping a"
    assert speed.executor_decision(tmp_path / "missing.log") == "?"
