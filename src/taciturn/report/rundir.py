"""The run directory: the contract that every tool (report, compare, resume) reads.

config.toml         the resolved config (every default filled in)
metrics.jsonl       one object per evaluated round (cumulative bytes, messages and time)
ledger.csv          bytes and messages per round, client and direction
events.jsonl        rejected updates and failed clients, with reasons
partition.json      per-client sample counts and class histogram
checkpoints/        round_NNNNNN/{server,clients}.safetensors + progress.json
plots/*.png         accuracy vs round, accuracy vs bytes, bytes per round, partition
report.html         self-contained report
run.log             the log
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    config = property(lambda self: self.path / "config.toml")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    ledger = property(lambda self: self.path / "ledger.csv")
    events = property(lambda self: self.path / "events.jsonl")
    partition = property(lambda self: self.path / "partition.json")
    info = property(lambda self: self.path / "run.json")
    checkpoints = property(lambda self: self.path / "checkpoints")
    plots = property(lambda self: self.path / "plots")
    report = property(lambda self: self.path / "report.html")
    log = property(lambda self: self.path / "run.log")

    def exists(self) -> bool:
        return self.config.is_file()

    # ----- JSON lines -----
    @staticmethod
    def append_jsonl(path: Path, row: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row, sort_keys=False) + "\n")

    @staticmethod
    def read_jsonl(path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def read_metrics(self) -> list[dict[str, Any]]:
        return self.read_jsonl(self.metrics)

    def read_partition(self) -> dict[str, Any]:
        return json.loads(self.partition.read_text())

    def check_free(self, overwrite: bool) -> None:
        """Refuse to start a new run over an existing one unless told to overwrite it."""
        if self.exists() and not overwrite:
            raise FileExistsError(
                f"{self.path} already holds a run; continue it with `taciturn resume {self.path}` "
                "or pass --overwrite"
            )

    def reset(self, config_toml: str) -> None:
        """Start the folder afresh for a new run: old results removed, the resolved config written."""
        if self.path.exists():
            for stale in (self.metrics, self.ledger, self.events, self.log, self.report, self.info):
                stale.unlink(missing_ok=True)
            for folder in (self.checkpoints, self.plots):
                shutil.rmtree(folder, ignore_errors=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self.config.write_text(config_toml)

    def primary_metric(self) -> str:
        """The evaluation metric plots and summaries lead with ("accuracy" unless run.json says)."""
        if self.info.exists():
            return json.loads(self.info.read_text()).get("primary_metric", "accuracy")
        return "accuracy"

    # ----- resume support -----
    def truncate_after(self, round: int) -> None:
        """Forget everything recorded after ``round`` (used when resuming from its checkpoint)."""
        for path in (self.metrics, self.events):
            rows = [r for r in self.read_jsonl(path) if r["round"] <= round]
            _atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))
        if self.ledger.exists():
            lines = self.ledger.read_text().splitlines(keepends=True)
            kept = lines[:1] + [line for line in lines[1:] if int(line.split(",", 1)[0]) <= round]
            _atomic_write(self.ledger, "".join(kept))

    def checkpoint_dir(self, round: int) -> Path:
        return self.checkpoints / f"round_{round:06d}"

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        done = sorted(p for p in self.checkpoints.glob("round_*") if (p / "progress.json").is_file())
        return (int(done[-1].name.split("_")[1]), done[-1]) if done else None

    def prune_checkpoints(self, keep: int) -> None:
        done = sorted(self.checkpoints.glob("round_*"))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
