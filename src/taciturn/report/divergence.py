"""A run that diverged must not read as a normal run: the console, run.log and the report say so."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

FACTOR = 10.0  # a held-out loss this many times its starting value counts as divergence


def divergence(rows: Sequence[dict[str, Any]]) -> str | None:
    """Why the run diverged (a non-finite held-out loss, or one FACTOR times its first value), or None."""
    losses = [(r["round"], float(r["loss"])) for r in rows if isinstance(r.get("loss"), int | float)]
    if len(losses) < 2:
        return None
    (first_round, start), later = losses[0], losses[1:]
    for round, loss in later:
        if not math.isfinite(loss):
            return f"the held-out loss is {loss} at round {round}: the run diverged; lower the learning rate"
        if start > 0 and loss > FACTOR * start:
            return (
                f"the held-out loss rose from {start:.4g} (round {first_round}) to {loss:.4g} at round "
                f"{round}, over {FACTOR:g}x: the run is diverging; lower the learning rate"
            )
    return None


def row_line(row: dict[str, Any], metric: str) -> str:
    """One evaluated round for run.log."""
    shown = [f"{key} {row[key]:.4g}" for key in (metric, "loss") if isinstance(row.get(key), int | float)]
    return f"round {row['round']}: " + ", ".join([*shown, f"{row.get('bytes_up', 0) / 1e6:.3f} MB up"])
