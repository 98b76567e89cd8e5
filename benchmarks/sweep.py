"""Equal tuning budgets: every method in a comparison is tuned over a grid of the same size.

A method's grid is the Cartesian product of the knobs that matter to it (participation C for
FedAvg, rho and C for FedADMM, rho and the trigger quantile for event-based ADMM, ...). A
comparison that gives one method more configurations than another measures the tuning, not the
method; ``budget`` refuses such a comparison before any run starts.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taciturn.core.errors import TaciturnError


class BudgetError(TaciturnError, ValueError):
    """Methods in one comparison were given tuning grids of different sizes."""


@dataclass(frozen=True)
class Grid:
    method: str
    points: tuple[dict[str, Any], ...]  # one dict of knob -> value per configuration

    def __len__(self) -> int:
        return len(self.points)


def grid(method: str, **axes: Sequence[Any]) -> Grid:
    """The Cartesian product of ``axes`` (knob name -> values), in the order given."""
    names = list(axes)
    points = tuple(dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values()))
    if not points:
        raise BudgetError(f"{method}: an empty axis leaves no configuration to run")
    return Grid(method, points)


def budget(grids: Sequence[Grid] | Mapping[str, Grid]) -> int:
    """The common number of configurations per method; BudgetError if the grids differ in size."""
    grids = list(grids.values()) if isinstance(grids, Mapping) else list(grids)
    sizes = {g.method: len(g) for g in grids}
    if len(set(sizes.values())) != 1:
        raise BudgetError(f"unequal tuning budgets {sizes}: give every method a grid of the same size")
    return next(iter(sizes.values()))
