"""The UCB exploration bonuses of Q-learning (Jin et al. 2018) and of FedQ (ICLR 2024).

Hoeffding: b_t = c sqrt(H^3 iota / t) (Jin et al. 2018, Algorithm 1). FedQ-Hoeffding adds in one
round the weighted bonuses of the samples t^{k-1} + 1 .. t^k (ICLR 2024, Eq. (5)):
    beta^k / 2 = sum_{t = t^{k-1}+1}^{t^k} theta_{t^k}^t b_t.
Bernstein: beta_t = c min{ sqrt(H iota (W + H) / t) + iota B / t, sqrt(H^3 iota / t) }, where W is
the empirical variance of the next-state values and B the burn-in constant: sqrt(H^7 S A) for
UCB-Bernstein (Jin et al. 2018, Algorithm 2, with c1 = c2 = c) and sqrt(H^7 S A) + sqrt(M S A H^6)
for FedQ-Bernstein (ICLR 2024, Eq. (8)). The paper typesets the first term ambiguously; its
proof (Eq. (45)) uses sqrt(H iota (W + H) / t), as Jin et al. do, and so do we. The experiments of
both FedQ papers use c = iota = 1.
"""

from __future__ import annotations

import numpy as np

from taciturn.rl.step_sizes import theta

_TERMS_PER_BATCH = 1 << 20  # bounds the memory of one vectorised bonus sum


def hoeffding(t: np.ndarray | float, horizon: int, c: float, iota: float) -> np.ndarray:
    """b_t = c sqrt(H^3 iota / t)."""
    return c * np.sqrt(horizon**3 * iota / np.asarray(t, dtype=np.float64))


def hoeffding_round(t0: np.ndarray, t1: np.ndarray, horizon: int, c: float, iota: float) -> np.ndarray:
    """sum_{t=t0+1}^{t1} theta_{t1}^t b_t for each pair (t0 < t1), summed term by term.

    The sum has t1 - t0 terms per cell, so a round costs as much as the samples it aggregates;
    cells are processed in batches of about 2^20 terms.
    """
    t0, t1 = np.asarray(t0, dtype=np.int64).ravel(), np.asarray(t1, dtype=np.int64).ravel()
    out = np.zeros(t0.shape)
    lengths = t1 - t0
    ends = np.cumsum(lengths)
    start = 0
    while start < len(t0):
        before = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + _TERMS_PER_BATCH)))
        n = lengths[start:stop]
        cell = np.repeat(np.arange(stop - start), n)
        first = np.cumsum(n) - n
        t = (t0[start:stop][cell] + np.arange(n.sum()) - first[cell] + 1).astype(np.float64)
        weights = theta(t, t1[start:stop][cell].astype(np.float64), horizon) * hoeffding(t, horizon, c, iota)
        out[start:stop] = np.bincount(cell, weights=weights, minlength=stop - start)
        start = stop
    return out


def bernstein(
    t: np.ndarray, variance: np.ndarray, horizon: int, burn_in: float, c: float, iota: float
) -> np.ndarray:
    """beta_t = c min{sqrt(H iota (W + H) / t) + iota B / t, sqrt(H^3 iota / t)}; beta_0 = 0."""
    t = np.asarray(t, dtype=np.float64)
    safe = np.maximum(t, 1.0)
    variance_term = np.sqrt(horizon * iota * (variance + horizon) / safe) + iota * burn_in / safe
    beta = c * np.minimum(variance_term, np.sqrt(horizon**3 * iota / safe))
    return np.where(t > 0, beta, 0.0)


def jin_burn_in(horizon: int, states: int, actions: int) -> float:
    """B of UCB-Bernstein: sqrt(H^7 S A)."""
    return float(np.sqrt(horizon**7 * states * actions))


def fedq_burn_in(horizon: int, states: int, actions: int, agents: int) -> float:
    """B of FedQ-Bernstein: sqrt(H^7 S A) + sqrt(M S A H^6)."""
    return jin_burn_in(horizon, states, actions) + float(np.sqrt(agents * states * actions * horizon**6))
