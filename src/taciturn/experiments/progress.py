"""A rich progress bar for a run: round, the test metric and bytes so far."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from taciturn.core.ledger import Direction, Ledger


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def show_progress() -> bool:
    """Whether ``taciturn.run`` shows its progress bar by default: in a terminal or a notebook."""
    console = Console()
    return console.is_terminal or console.is_jupyter


class RoundProgress:
    def __init__(self, rounds: int, done: int, enabled: bool = True, metric: str = "accuracy"):
        self.enabled, self.metric = enabled, metric
        self.progress = Progress(
            TextColumn("[bold]round"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn(f"{metric} {{task.fields[score]}}"),
            TextColumn("up {task.fields[up]}  down {task.fields[down]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        self.task = self.progress.add_task(
            "run", total=rounds, completed=done, score="-", up="0 B", down="0 B"
        )

    def __enter__(self) -> RoundProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, round: int, row: dict[str, Any] | None, ledger: Ledger) -> None:
        fields = {
            "up": human_bytes(ledger.totals(Direction.UP).bytes_sent),
            "down": human_bytes(ledger.totals(Direction.DOWN).bytes_sent),
        }
        if row is not None:
            fields["score"] = f"{row[self.metric]:.4f}"
        self.progress.update(self.task, completed=round, **fields)
