"""Aggregators that look at each coordinate on its own.

* ``Mean``: the weighted mean sum_k w_k Delta_k / sum_k w_k (FedAvg; McMahan et al. 2017, Alg. 1).
* ``Median``: the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust
  Distributed Learning: Towards Optimal Statistical Rates", ICML 2018, Def. 1: g = med{g^i}, each
  coordinate separately; for an even count the mean of the two middle values).
* ``TrimmedMean``: the coordinate-wise beta-trimmed mean (same paper, Def. 2: for each coordinate
  remove the largest and smallest beta fraction, average the rest). beta m need not be an
  integer: k = floor(beta m) values go at each end, and at least one when beta > 0 (trim 0.2 of
  4 updates once removed none, and one x1000 outlier moved the mean 250-fold). With fewer than
  2k + 1 updates nothing is left to average: the round is skipped (``OutsideGuarantee``).
The robust rules ignore the sample weights (as in the paper): a weight is what a client could lie about.
"""

from __future__ import annotations

import math

import torch

from taciturn.server.transform import Aggregator, Info, OutsideGuarantee, State, Updates


class Mean(Aggregator):
    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]:
        w = updates.weights.to(updates.rows.dtype)
        return (w[:, None] * updates.rows).sum(0) / w.sum(), state, {}


class Median(Aggregator):
    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]:
        m = len(updates.rows)
        ordered = updates.rows.sort(dim=0).values  # (torch.quantile refuses inputs over 2^24 values)
        return (ordered[(m - 1) // 2] + ordered[m // 2]) / 2, state, {}


class TrimmedMean(Aggregator):
    def __init__(self, beta: float):
        self.beta = beta

    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]:
        m = len(updates.rows)
        k = trimmed_per_side(self.beta, m)
        if 2 * k >= m:
            raise OutsideGuarantee(
                f"trimmed mean with trim {self.beta} removes {k} value(s) at each end: it needs at least "
                f"{2 * k + 1} updates, {m} arrived"
            )
        ordered = updates.rows.sort(dim=0).values
        return ordered[k : m - k].mean(0), state, {"trimmed": float(2 * k)}


def trimmed_per_side(beta: float, m: int) -> int:
    """k: the values removed at each end of m (Def. 2: beta m, rounded down, at least 1 if beta > 0)."""
    k = math.floor(beta * m + 1e-9)
    return max(k, 1) if beta > 0 else 0
