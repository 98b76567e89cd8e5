"""Q-learning's step sizes and the weights they induce (Jin et al. 2018, Sec. 4; FedQ, ICLR 2024, Sec. 3).

    alpha_t          = (H + 1) / (H + t)
    alpha^c(t1, t2)  = prod_{t=t1}^{t2} (1 - alpha_t)          (1 when t1 > t2)
    theta_t^i        = alpha_i prod_{i'=i+1}^{t} (1 - alpha_{i'}) = alpha_i alpha^c(i + 1, t)

Since 1 - alpha_t = (t - 1) / (H + t), the product is a ratio of Gamma functions,
Gamma(t2) Gamma(H + t1) / (Gamma(t1 - 1) Gamma(H + t2 + 1)), which is the product of H + 1
factors prod_{j=0}^{H} (t1 - 1 + j) / (t2 + j): exact to rounding for any t2 - t1, with no loop
over t and no large logarithms (lgamma differences lose ~1e-7 at t ~ 1e8). alpha_1 = 1, so
alpha^c(1, t2) = 0 through the factor j = 0.
"""

from __future__ import annotations

import numpy as np


def alpha(t: np.ndarray | float, horizon: int) -> np.ndarray:
    return (horizon + 1) / (horizon + np.asarray(t, dtype=np.float64))


def alpha_c(t1: np.ndarray | float, t2: np.ndarray | float, horizon: int) -> np.ndarray:
    """prod_{t=t1}^{t2} (1 - alpha_t), elementwise over arrays of t1 <= t2 + 1."""
    t1, t2 = np.asarray(t1, dtype=np.float64), np.asarray(t2, dtype=np.float64)
    product = np.ones(np.broadcast(t1, t2).shape)
    for j in range(horizon + 1):
        product *= (t1 - 1 + j) / (t2 + j)
    return product


def theta(i: np.ndarray | float, t: np.ndarray | float, horizon: int) -> np.ndarray:
    """theta_t^i: the weight of the i-th sample in the t-th estimate, for 1 <= i <= t."""
    return alpha(i, horizon) * alpha_c(np.asarray(i) + 1, t, horizon)
