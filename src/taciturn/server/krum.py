"""Krum and Multi-Krum: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent", NeurIPS 2017.

With n updates of which at most f are Byzantine, each update V_i scores
    s(i) = sum_{i -> j} ||V_i - V_j||^2                                   (Sec. 4, Krum's score)
over the n - f - 2 updates closest to it (i -> j); Krum returns the update of lowest score.
Multi-Krum (Sec. 4, "Multi-Krum") averages the ``select`` updates of lowest score (select = 1 is
Krum; select = n is the mean; None: m = n - f, the paper's choice). Krum needs n > 2 f + 2; with
fewer updates the neighbourhood is cut to at least one other update.
"""

from __future__ import annotations

import torch

from taciturn.server.transform import Aggregator, Info, State, Updates


def krum_scores(rows: torch.Tensor, byzantine: int) -> torch.Tensor:
    n = len(rows)
    distances = torch.cdist(rows.double(), rows.double()).pow(2)
    neighbours = max(min(n - byzantine - 2, n - 1), 1) if n > 1 else 0
    closest = distances.sort(dim=1).values[:, 1 : 1 + neighbours]  # column 0 is the distance to itself
    return closest.sum(dim=1)


class Krum(Aggregator):
    def __init__(self, byzantine: int, select: int | None = 1):
        self.byzantine, self.select = byzantine, select

    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]:
        scores = krum_scores(updates.rows, self.byzantine)
        n = len(scores)
        select = max(n - self.byzantine, 1) if self.select is None else min(self.select, n)
        chosen = scores.argsort(stable=True)[:select]
        return updates.rows[chosen].mean(0), state, {"krum_selected": float(len(chosen))}
