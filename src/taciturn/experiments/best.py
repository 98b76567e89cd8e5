"""The best model so far and early stopping, both read off the rows of metrics.jsonl.

``[checkpoint] best = "<column>"`` keeps the global model of the evaluation with the best value of
that column in ``best/`` (``model.safetensors``, ``best.json``: round, metric, value), written
atomically and verified like a checkpoint (experiments/checkpoint.py ``commit``); ``taciturn export
--best`` writes it out. ``[stop]`` ends the run when ``metric`` has not improved by more than
``min_delta`` for ``patience`` evaluations in a row (Keras' EarlyStopping rule: an improvement is a
value better than the best so far by more than ``min_delta``); run.json and the report say where
and why. Round 0 (the starting model) counts as the first evaluation for both.

Both keep their counters in the run's progress counters (progress.json in every checkpoint), so a
resumed run makes exactly the decisions of an uninterrupted one. Lower is better for losses and
errors, higher for accuracies and Rouge; any other column needs its ``mode``.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from taciturn.core.codec import decode, encode
from taciturn.core.message import Message
from taciturn.core.params import Params
from taciturn.experiments import checkpoint
from taciturn.report.rundir import RunDir, RunDirError

BEST = "best"  # the folder under the run directory
LOWER = ("loss", "error", "mae", "mse", "rmse", "epsilon", "perplexity")
HIGHER = ("accuracy", "rouge", "f1", "auc", "precision", "recall", "score")


def direction(metric: str, mode: str | None) -> Literal["min", "max"]:
    """``mode`` if given, else what the metric's name says (losses down, accuracies up)."""
    if mode is not None:
        return mode  # type: ignore[return-value]
    name = metric.lower()
    if any(word in name for word in LOWER):
        return "min"
    if any(word in name for word in HIGHER):
        return "max"
    raise ValueError(
        f"cannot tell whether {metric!r} is better high or low: set its mode ([checkpoint] best_mode, "
        "[stop] mode) to 'min' or 'max'"
    )


def check_columns(wanted: dict[str, str], columns: Iterable[str]) -> None:
    """Every ``key -> metric`` of ``wanted`` names a column of the run's metrics rows (did-you-mean)."""
    known = sorted(set(columns))
    for key, metric in wanted.items():
        if metric not in known:
            close = difflib.get_close_matches(metric, known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"the rows have {', '.join(known)}"
            raise ValueError(f"[{key}] {metric!r} is not a column of metrics.jsonl: {hint}")


def better(value: float, than: float | None, mode: str, margin: float = 0.0) -> bool:
    if than is None:
        return True
    return value < than - margin if mode == "min" else value > than + margin


def _value(row: dict[str, Any], metric: str) -> float | None:
    value = row.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None  # not evaluated in this row (e.g. train_loss at round 0), or not finite
    return float(value)


class BestModel:
    """Keeps the best global model in ``best/`` (counters["best"]: its round and value)."""

    def __init__(self, metric: str, mode: str | None, rundir: RunDir):
        self.metric, self.mode, self.rundir = metric, direction(metric, mode), rundir

    def seen(self, row: dict[str, Any], params: Params, counters: dict[str, Any]) -> None:
        value = _value(row, self.metric)
        held = counters.get("best")
        if value is None or not better(value, None if held is None else held["value"], self.mode):
            return
        counters["best"] = {"round": row["round"], "value": value}
        record = {"round": row["round"], "metric": self.metric, "mode": self.mode, "value": value}
        weights = Message.from_tensors({k: v.detach().cpu().contiguous() for k, v in params.items()})

        def write(tmp: Path) -> None:
            (tmp / "model.safetensors").write_bytes(encode(weights))
            (tmp / "best.json").write_text(json.dumps(record))

        checkpoint.commit(self.rundir.path / BEST, write)


class EarlyStop:
    """Ends a run after ``patience`` evaluations without an improvement of more than ``min_delta``
    (counters["stop"]: the best value, its round and the evaluations waited since)."""

    def __init__(self, metric: str, mode: str | None, patience: int, min_delta: float):
        self.metric, self.mode = metric, direction(metric, mode)
        self.patience, self.min_delta = patience, min_delta

    def seen(self, row: dict[str, Any], counters: dict[str, Any]) -> str | None:
        """Why the run stops after this row, or None."""
        value = _value(row, self.metric)
        if value is None:
            return None
        held = counters.get("stop") or {"value": None, "round": None, "waited": 0}
        if better(value, held["value"], self.mode, self.min_delta):
            counters["stop"] = {"value": value, "round": row["round"], "waited": 0}
            return None
        waited = held["waited"] + 1
        counters["stop"] = held | {"waited": waited}
        if waited < self.patience:
            return None
        return (
            f"{self.metric} has not improved by more than {self.min_delta:g} for {waited} evaluations "
            f"(best {held['value']:.4g} at round {held['round']})"
        )


def read_best(path: Path | str) -> tuple[dict[str, Any], Params]:
    """The kept best model of a run: its record (round, metric, mode, value) and its parameters."""
    folder = Path(path) / BEST
    if not (folder / "best.json").is_file():
        raise RunDirError(
            f"{path} keeps no best model: run it with [checkpoint] best = '<metric>' (e.g. 'accuracy')"
        )
    checkpoint.verify(folder)
    record = json.loads((folder / "best.json").read_text())
    return record, decode((folder / "model.safetensors").read_bytes()).tensors()
