"""Per-client norm bounding: each update scaled to an L2 norm of at most C.

* ``NormBound``: a fixed C. Each row becomes Delta_k * min(1, C / ||Delta_k||) (McMahan, Ramage,
  Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018, Alg. 1,
  ClipFn "flat clipping"; as a defence against scaled updates, Sun et al., "Can You Really
  Backdoor Federated Learning?", 2019, Sec. 4 "norm thresholding").
* ``AdaptiveClip``: C follows a target quantile gamma of the update norms (Andrew, Thakkar,
  McMahan, Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
  Alg. 1 / Eq. 2, the geometric update): with b = the fraction of this round's updates whose norm
  is at most C, C <- C * exp(-eta_C (b - gamma)). Their DP version noises the count of unclipped
  updates before use (Alg. 1, "b~ = (sum b_i + N(0, sigma_b^2)) / m") and spends budget on it;
  taciturn does not combine adaptive clipping with [privacy] (experiments/config.py refuses it),
  so the count here is exact and the piece is a robustness defence, not a DP one.
"""

from __future__ import annotations

import math

import torch

from taciturn.server.transform import Info, ServerTransform, State, Updates


def clip_rows(rows: torch.Tensor, bound: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows scaled to norm <= bound, and which rows were already within it."""
    norms = rows.norm(dim=1)
    within = norms <= bound
    scale = torch.where(within, torch.ones_like(norms), bound / norms.clamp_min(1e-30))
    return rows * scale[:, None], within


class NormBound(ServerTransform):
    """``count``: report how many updates were clipped. Under DP that count is an exact function of
    the clients' data that no noise covers, so DP's chain does not release it."""

    def __init__(self, clip: float, count: bool = True):
        self.clip, self.count = clip, count

    def init(self, dim: int) -> State:
        return {}

    def update(self, updates: Updates, state: State, rng: torch.Generator) -> tuple[Updates, State, Info]:
        rows, within = clip_rows(updates.rows, self.clip)
        info = {"clip_norm": self.clip} | ({"clipped": float((~within).sum())} if self.count else {})
        return Updates(rows, updates.weights), state, info


class AdaptiveClip(ServerTransform):
    def __init__(self, initial: float, target_quantile: float, lr: float):
        self.initial, self.gamma, self.lr = initial, target_quantile, lr

    def init(self, dim: int) -> State:
        return {"clip": torch.tensor(self.initial, dtype=torch.float64)}

    def update(self, updates: Updates, state: State, rng: torch.Generator) -> tuple[Updates, State, Info]:
        clip = state["clip"]
        rows, within = clip_rows(updates.rows, float(clip))
        m = len(within)
        b = float(within.sum()) / m
        new_clip = clip * math.exp(-self.lr * (b - self.gamma))  # Andrew et al. 2021, Eq. 2
        info = {"clip_norm": float(clip), "clipped": float(m - within.sum())}
        return Updates(rows, updates.weights), {"clip": new_clip}, info
