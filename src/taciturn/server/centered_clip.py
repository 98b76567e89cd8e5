"""Centered clipping: Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
Optimization", ICML 2021, Eq. (CC) / Alg. 2:

    v_{l+1} = v_l + (1/n) sum_i (x_i - v_l) min(1, tau / ||x_i - v_l||),   l = 0 .. L-1,

started from v_0 = the previous round's aggregate (their momentum-based history; the state of
this piece, zero at first). One iteration (L = 1) is what the paper runs and analyses (Thm. IV).
"""

from __future__ import annotations

import torch

from taciturn.server.clipping import clip_rows
from taciturn.server.transform import Aggregator, Info, State, Updates


class CenteredClip(Aggregator):
    def __init__(self, tau: float, iterations: int = 1):
        self.tau, self.iterations = tau, iterations

    def init(self, dim: int) -> State:
        return {"center": torch.zeros(dim)}

    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]:
        v = state["center"].to(updates.rows.dtype)
        for _ in range(self.iterations):
            clipped, _ = clip_rows(updates.rows - v, self.tau)
            v = v + clipped.mean(0)
        return v, {"center": v.clone()}, {}
