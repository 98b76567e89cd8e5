"""95% intervals for benchmark claims, and the rule that a claim needs them to separate.

* ``t_interval``: Student-t interval for the mean of independent repetitions (seeds),
  mean +- t_{n-1, (1+level)/2} * s / sqrt(n) with s the sample standard deviation (ddof = 1).
* ``bootstrap_interval``: percentile bootstrap (Efron & Tibshirani 1993, Sec. 13.3) of any
  statistic of the repetitions, for statistics that are not a plain mean (a slope, a median).
* ``separated``: two intervals that do not overlap. A benchmark prints "A beats B" only then;
  otherwise it prints the intervals and says they overlap.

Both intervals come from SciPy (``scipy.stats.t.interval``, ``scipy.stats.bootstrap``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from taciturn.core.errors import TaciturnError

LEVEL = 0.95
Interval = tuple[float, float]


class IntervalError(TaciturnError, ValueError):
    """Too few repetitions (or none finite) to state an interval."""


def _values(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
        raise IntervalError(
            f"an interval needs at least two finite repetitions, got {list(values)}: run more seeds"
        )
    return x


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The Student-t interval for the mean of ``values`` (one value per seed)."""
    x = _values(values)
    if np.all(x == x[0]):  # no spread: the interval is the point (SciPy would return nan)
        return float(x[0]), float(x[0])
    lo, hi = stats.t.interval(level, x.size - 1, loc=x.mean(), scale=stats.sem(x))
    return float(lo), float(hi)


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.mean,
    level: float = LEVEL,
    resamples: int = 9999,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of ``statistic`` over the repetitions, from a seeded stream."""
    x = _values(values)
    if np.all(x == x[0]):
        value = float(statistic(x))
        return value, value
    result = stats.bootstrap(
        (x,),
        lambda sample, axis: np.apply_along_axis(statistic, axis, sample),
        confidence_level=level,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def bootstrap_groups(
    groups: Sequence[Sequence[float]],
    statistic: Callable[..., float],
    level: float = LEVEL,
    resamples: int = 9999,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap of a statistic of several independent groups (e.g. the seeds at each
    width), each resampled on its own: ``statistic(*group_arrays)``, as ``scipy.stats.bootstrap``
    with several samples. Every group needs two or more repetitions."""
    arrays = [_values(g) for g in groups]
    result = stats.bootstrap(
        tuple(arrays),
        statistic,
        confidence_level=level,
        n_resamples=resamples,
        method="percentile",
        vectorized=False,
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def separated(a: Interval, b: Interval) -> bool:
    """True when the intervals do not overlap, the only case a benchmark states an ordering."""
    return a[1] < b[0] or b[1] < a[0]


def verdict(name_a: str, a: Interval, name_b: str, b: Interval, lower_is_better: bool = True) -> str:
    """One sentence: which of two methods is better, or that their intervals overlap."""
    if not separated(a, b):
        return f"{name_a} and {name_b}: intervals overlap, no conclusion"
    a_lower = a[1] < b[0]
    winner = name_a if a_lower == lower_is_better else name_b
    loser = name_b if winner == name_a else name_a
    return f"{winner} beats {loser} (95% intervals separate)"
