"""Krum and Multi-Krum: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent", NeurIPS 2017.

With n updates of which at most f are Byzantine, each update V_i scores
    s(i) = sum_{i -> j} ||V_i - V_j||^2                                   (Sec. 4, Krum's score)
over the n - f - 2 updates closest to it (i -> j); Krum returns the update of lowest score.
Multi-Krum (Sec. 4, "Multi-Krum") averages the ``select`` updates of lowest score (select = 1 is
Krum; None: m = n - f, the paper's choice; never more than n - f, so that it cannot be made to
average in an attacker for lack of honest updates).

Both need n > 2 f + 2 (Prop. 1): with fewer updates, f colluders who send one vector twice score
0 against each other and win. The config is refused before work when the round's size is known
to be too small (experiments/engine_setup.py); a round that shrank below it (dropped or rejected
uplinks) is skipped with the reason (``OutsideGuarantee``).
"""

from __future__ import annotations

import torch

from taciturn.server.transform import Aggregator, Info, OutsideGuarantee, State, Updates


def krum_scores(rows: torch.Tensor, byzantine: int) -> torch.Tensor:
    """Each row's sum of squared distances to its n - f - 2 nearest others (n > 2 f + 2)."""
    distances = torch.cdist(rows.double(), rows.double()).pow(2)
    neighbours = len(rows) - byzantine - 2
    closest = distances.sort(dim=1).values[:, 1 : 1 + neighbours]  # column 0 is the distance to itself
    return closest.sum(dim=1)


class Krum(Aggregator):
    def __init__(self, byzantine: int, select: int | None = 1):
        self.byzantine, self.select = byzantine, select

    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]:
        n, f = len(updates.rows), self.byzantine
        if n <= 2 * f + 2:
            raise OutsideGuarantee(
                f"Krum tolerates f = {f} attackers only among n > 2f + 2 = {2 * f + 2} updates; {n} arrived"
            )
        scores = krum_scores(updates.rows, f)
        select = n - f if self.select is None else min(self.select, n - f)
        chosen = scores.argsort(stable=True)[:select]
        return updates.rows[chosen].mean(0), state, {"krum_selected": float(len(chosen))}
