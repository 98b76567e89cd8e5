"""Fits that summarise a FedQ run: how fast rounds (or regret) grow with log(episodes)."""

from __future__ import annotations

import numpy as np


def log_slope(episodes: np.ndarray, values: np.ndarray, start: float, stop: float = np.inf) -> float:
    """The least-squares slope of ``values`` against ln(episodes), over start <= episodes <= stop.

    The ICML 2025 paper fits rounds against log(#episodes) counted after 5e5 episodes: the slope
    is the coefficient of log T in the number of rounds (nan with fewer than two points). ``stop``
    closes the fit window, to see how the slope depends on where it is fitted.
    """
    episodes, values = np.asarray(episodes, dtype=np.float64), np.asarray(values, dtype=np.float64)
    keep = (episodes >= start) & (episodes <= stop)
    if keep.sum() < 2 or np.ptp(np.log(episodes[keep])) == 0:
        return float("nan")
    return float(np.polyfit(np.log(episodes[keep]), values[keep], 1)[0])


def steady_state_slope(horizon: int) -> float:
    """Rounds per unit of ln(episodes) once the counts under the policy grow in proportion.

    When every agent visits (x, pi_h(x)) at the same rate, the trigger fires once the agents
    together added N / (H (H + 1)) visits, so each round multiplies the episode count by
    1 + 1 / (H (H + 1)): 1 / ln(1 + 1 / (H (H + 1))) rounds per unit of ln(episodes), whatever
    M, S and A (our reading of the trigger rule, not a number from the papers; the ICML 2025 bound
    has an O(H^2) coefficient of log T, which this is).
    """
    return float(1.0 / np.log1p(1.0 / (horizon * (horizon + 1))))
