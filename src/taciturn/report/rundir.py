"""The run directory: the contract that every tool (report, compare, resume) reads.

config.toml         the resolved config (every default filled in)
metrics.jsonl       one object per evaluated round (cumulative bytes, messages and time)
ledger.csv          bytes and messages per round, client and direction
events.jsonl        rejected updates and failed clients, with reasons
partition.json      per-client sample counts and class histogram
checkpoints/        round_NNNNNN/{server,clients}.safetensors + progress.json + manifest.json
plots/*.png         accuracy vs round, accuracy vs bytes, bytes per round, partition
report.html         self-contained report
run.log             the log
.taciturn.lock      the lock a writing process holds (flock: a crashed process releases it)

The folder is the user's: taciturn deletes only the files it writes (the names above), only when
told to overwrite a run, and never writes into a non-empty folder that is not a run unless told to.
Appended files (JSON lines, CSV) are synced before each checkpoint is committed, and the checkpoint
records their length and digest: on resume they are checked and cut back to that length, which
drops rows of rounds that will run again and a torn last line (a crash mid-write), with a note in
the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from taciturn.core.errors import TaciturnError

log = logging.getLogger("taciturn")

LOCK = ".taciturn.lock"
# Files taciturn writes at the top of a run directory (fedq runs add the MDP; disk stores their slots).
OWNED_FILES = (
    "config.toml",
    "metrics.jsonl",
    "ledger.csv",
    "events.jsonl",
    "partition.json",
    "run.json",
    "report.html",
    "run.log",
    "mdp.safetensors",
    "client_state.bin",
    "client_state.layout.json",
    "mlflow.db",  # [tracking] mlflow's default store
)
# Folders of files taciturn writes (by name pattern): the best model ([checkpoint] best), TensorBoard's
# event files ([tracking]); MLflow's store keeps every run, so an overwritten run adds one there.
OWNED_FOLDERS = {
    "best": ("model.safetensors", "best.json", "manifest.json"),
    "tensorboard": ("events.out.tfevents.*",),
}
CHECKPOINT = re.compile(r"round_(\d{6})")
TEMPORARY = re.compile(r"round_\d{6}\.tmp")


class RunDirError(TaciturnError, OSError):
    """A run directory that cannot be used as asked: taken, not a run, locked, or damaged."""


_held: dict[Path, tuple[int, int]] = {}  # resolved path -> (fd, depth): the locks this process holds


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

    def require(self) -> RunDir:
        """This folder, if it holds a run; else a clear error."""
        if not self.exists():
            raise RunDirError(f"{self.path} is not a run directory (no config.toml)")
        return self

    # ----- the lock -----
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder's lock while writing it; a second process gets a clear error.

        An OS lock (flock) on ``.taciturn.lock``: the kernel releases it when the holder dies, so
        a crashed run never leaves a stale lock. Re-entrant within one process. If no run was
        started (a bad config, a foreign folder), the lock file goes again, and the folder if the
        lock created it and it is empty.
        """
        created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        key = self.path.resolve()
        if key in _held:
            fd, depth = _held[key]
            _held[key] = (fd, depth + 1)
        else:
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(
                    f"{self.path} is in use by another taciturn process (it holds {self.path / LOCK}); "
                    "wait for it to finish, or use another folder"
                ) from None
            _held[key] = (fd, 1)
        try:
            yield
        finally:
            fd, depth = _held[key]
            if depth == 1:
                del _held[key]
                if not self.exists():  # nothing started here (a bad config, a foreign folder)
                    (self.path / LOCK).unlink(missing_ok=True)
                    if created:
                        _remove_if_empty(self.path)
                os.close(fd)  # releases the flock
            else:
                _held[key] = (fd, depth - 1)

    # ----- JSON lines -----
    @staticmethod
    def append_jsonl(path: Path, row: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row, sort_keys=False) + "\n")

    @staticmethod
    def read_jsonl(path: Path) -> list[dict[str, Any]]:
        """Every row of a JSON-lines file; a line that is not a JSON object is an error naming it."""
        if not path.exists():
            return []
        rows = []
        for number, line in enumerate(_read_text(path).splitlines(), 1):
            if line.strip():
                rows.append(_json_row(path, number, line))
        return rows

    def read_metrics(self) -> list[dict[str, Any]]:
        return self.read_jsonl(self.metrics)

    def numeric_metrics(self, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        """The metrics rows (at least one), each with a number under every key of ``keys``."""
        rows = self.read_metrics()
        if not rows:
            raise RunDirError(f"{self.metrics} has no rows; the run never evaluated its model")
        for number, row in enumerate(rows, 1):
            for key in keys:
                if not _is_number(row.get(key)):
                    raise RunDirError(
                        f"{self.metrics} line {number}: {key} is {row.get(key)!r}, not a number; "
                        "the file is damaged"
                    )
        return rows

    def read_partition(self) -> dict[str, Any]:
        """partition.json, checked: names are strings, counts are non-negative integers."""
        try:
            part = json.loads(_read_text(self.partition))
        except ValueError as error:
            raise RunDirError(f"{self.partition} is not valid JSON ({error}); rerun or restore it") from None
        if not _valid_partition(part):
            raise RunDirError(
                f"{self.partition} is damaged: it needs strings dataset, source, kind; integers num_clients, "
                "num_classes; a count per client in sizes and histogram (per class, or one column of sizes)"
            )
        return part

    # ----- starting afresh -----
    def is_run(self) -> bool:
        """A folder taciturn made: its config.toml is a resolved config (it has type, name and seed)."""
        try:
            tree = tomllib.loads(self.config.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return False
        return {"type", "name", "seed"} <= tree.keys()

    def check_free(self, overwrite: bool) -> None:
        """Refuse to start a new run over an existing run, or in a folder of other files, unless told to."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path} is a file, not a folder; choose another --out")
        if overwrite or not self.path.exists():
            return
        if self.is_run():
            raise RunDirError(
                f"{self.path} already holds a run; continue it with `taciturn resume {self.path}` "
                "or pass --overwrite to replace it"
            )
        others = sorted(p.name for p in self.path.iterdir() if p.name != LOCK)
        if others:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise RunDirError(
                f"{self.path} is not empty and is not a taciturn run (it holds {shown}); choose an empty "
                "or new folder, or pass --overwrite (taciturn then replaces only the files it writes)"
            )

    def reset(self, config_toml: str) -> None:
        """Start the folder afresh: the files a run writes are removed (nothing else), the config written."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name in OWNED_FILES:
            (self.path / name).unlink(missing_ok=True)
        if self.checkpoints.is_dir():
            for folder in self.checkpoints.iterdir():
                if folder.is_dir() and (
                    CHECKPOINT.fullmatch(folder.name) or TEMPORARY.fullmatch(folder.name)
                ):
                    shutil.rmtree(folder)
            _remove_if_empty(self.checkpoints)
        if self.plots.is_dir():
            for png in self.plots.glob("*.png"):
                png.unlink()
            _remove_if_empty(self.plots)
        for folder, written in OWNED_FOLDERS.items():  # the best model, the trackers' files
            if (self.path / folder).is_dir() and not (self.path / folder).is_symlink():
                for pattern in written:
                    for path in (self.path / folder).glob(pattern):
                        if path.is_file() and not path.is_symlink():
                            path.unlink()
                _remove_if_empty(self.path / folder)
        _write_synced(self.config, config_toml)

    def primary_metric(self) -> str:
        """The evaluation metric plots and summaries lead with ("accuracy" unless run.json says)."""
        if self.info.exists():
            try:
                info = json.loads(_read_text(self.info))
            except ValueError as error:
                raise RunDirError(f"{self.info} is not valid JSON ({error})") from None
            metric = info.get("primary_metric", "accuracy") if isinstance(info, dict) else None
            if not isinstance(metric, str):
                raise RunDirError(f"{self.info}: primary_metric must be a string")
            return metric
        return "accuracy"

    # ----- resume support -----
    def sync(self) -> None:
        """Flush the appended files to disk (called before a checkpoint is committed)."""
        for path in (self.metrics, self.ledger, self.events):
            if path.exists():
                with path.open("rb+") as f:
                    os.fsync(f.fileno())

    @property
    def appended(self) -> tuple[Path, ...]:
        """The files a run appends to as it goes."""
        return (self.metrics, self.ledger, self.events)

    def truncate_to(self, lengths: dict[str, int]) -> None:
        """Cut the appended files back to their lengths at a checkpoint (``lengths``: name -> bytes),
        forgetting what was recorded after it; a torn last line is noted in the log."""
        for name, size in lengths.items():
            path = self.path / name
            if not path.exists() or path.stat().st_size == size:
                continue
            with path.open("rb+") as f:
                f.seek(size)
                if not f.read().endswith(b"\n"):
                    log.warning("%s: cut a torn last line (the run was stopped mid-write)", path)
                f.truncate(size)
                os.fsync(f.fileno())

    def checkpoint_dir(self, round: int) -> Path:
        return self.checkpoints / f"round_{round:06d}"

    def committed_checkpoints(self) -> list[tuple[int, Path]]:
        if not self.checkpoints.is_dir():
            return []
        found = ((CHECKPOINT.fullmatch(p.name), p) for p in self.checkpoints.iterdir() if p.is_dir())
        return sorted((int(m.group(1)), p) for m, p in found if m)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The newest committed checkpoint; temporaries a crash left behind are removed."""
        if self.checkpoints.is_dir():
            for tmp in self.checkpoints.iterdir():
                if tmp.is_dir() and TEMPORARY.fullmatch(tmp.name):
                    log.warning("removing %s, a checkpoint a crash left unfinished", tmp)
                    shutil.rmtree(tmp)
        done = self.committed_checkpoints()
        return done[-1] if done else None

    def prune_checkpoints(self, keep: int) -> None:
        for _, old in self.committed_checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError as error:
        raise RunDirError(f"{path} is not UTF-8 text ({error}); it is damaged") from None


def _json_row(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as error:
        raise RunDirError(f"{path} line {number} is not valid JSON ({error}); the file is damaged") from None
    if not isinstance(row, dict):
        raise RunDirError(f"{path} line {number} is not a JSON object; the file is damaged")
    return row


def check_comparison_folder(out: Path) -> None:
    """A comparison (`taciturn compare`, `taciturn demo`) writes report.html, summary.json and PNGs
    into ``out``: refuse a folder holding anything else than those and run directories."""
    if not out.exists():
        return
    if not out.is_dir():
        raise RunDirError(f"{out} is a file, not a folder; choose another --out")
    foreign = sorted(
        p.name
        for p in out.iterdir()
        if not (p.is_dir() and RunDir(p).is_run())
        and p.name not in ("report.html", "summary.json", LOCK)
        and not (p.is_file() and p.suffix == ".png")
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise RunDirError(
            f"{out} holds files taciturn did not write ({shown}); a comparison would write over its "
            "report.html and plots there: choose an empty or new folder for --out"
        )


def _valid_partition(part: Any) -> bool:
    def counts(items: Any) -> bool:
        return isinstance(items, list) and all(type(c) is int and c >= 0 for c in items)

    if not isinstance(part, dict) or not all(
        isinstance(part.get(k), str) for k in ("dataset", "source", "kind")
    ):
        return False
    sizes, hist = part.get("sizes"), part.get("histogram")
    if not counts([part.get("num_clients"), part.get("num_classes")]) or not counts(sizes):
        return False
    width = part["num_classes"] or 1  # one column of sizes when the targets are not classes
    return (
        isinstance(hist, list)
        and len(hist) == len(sizes) > 0
        and all(counts(h) and len(h) == width for h in hist)
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
