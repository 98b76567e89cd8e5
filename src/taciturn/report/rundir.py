"""The run directory: the contract that every tool (report, compare, resume) reads.

config.toml         the resolved config (every default filled in)
run.json            the SHA-256 of the validated config, the primary metric, the engine, the model's shape
metrics.jsonl       one object per evaluated round (cumulative bytes, messages and time)
ledger.csv          bytes and messages per round, client and direction
events.jsonl        rejected updates and failed clients, with reasons
partition.json      per-client sample counts and class histogram
checkpoints/        round_NNNNNN/{server,clients}.safetensors + progress.json + manifest.json
plots/*.png         accuracy vs round, accuracy vs bytes, bytes per round, partition, client distribution
best/               the best global model ([checkpoint] best): model.safetensors, best.json, manifest.json
tensorboard/        TensorBoard's event files ([tracking] tensorboard)
mlflow.db           MLflow's store ([tracking] mlflow, unless mlflow_uri names another)
report.html         self-contained report
run.log             the log
manifest.json       every file and folder taciturn wrote here, with digests and this user's MAC

The folder is the user's. Every file in it is opened through core/folder.py, never through a link;
taciturn writes over or deletes only what its manifest lists (report/manifest.py), deletes only when
told to overwrite a run, and never writes into a non-empty folder that is not a run unless told to.
While a process writes the folder it holds an OS lock (flock) on the folder itself: unlinking a
file cannot release it, and the kernel releases it when the process dies. Appended files (JSON
lines, CSV) are synced before each checkpoint is committed, and the checkpoint records their length
and digest: on resume they are checked and cut back to that length, which drops rows of rounds that
will run again and a torn last line (a crash mid-write), with a note in the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taciturn.core.errors import TaciturnError
from taciturn.core.folder import Folder, FolderError
from taciturn.report.manifest import NAME as MANIFEST
from taciturn.report.manifest import Manifest, ManifestError

log = logging.getLogger("taciturn")

CONFIG, INFO, METRICS, LEDGER, EVENTS = (
    "config.toml",
    "run.json",
    "metrics.jsonl",
    "ledger.csv",
    "events.jsonl",
)
PARTITION, REPORT, LOG = "partition.json", "report.html", "run.log"
APPENDED = (METRICS, LEDGER, EVENTS)
# The files a run writes at the top of its folder (fedq runs add their MDP; disk stores their slots):
# one that exists and is not in the manifest is the user's, and a run there is refused.
TOP_FILES = (
    CONFIG,
    INFO,
    *APPENDED,
    PARTITION,
    REPORT,
    LOG,
    "mdp.safetensors",
    "client_state.bin",
    "client_state.layout.json",
    "mlflow.db",  # [tracking] mlflow's default store
)
# The folders a run makes at the top of its folder whose contents it replaces as a whole (the best
# model, committed like a checkpoint): one that exists and is not in the manifest is the user's.
TOP_FOLDERS = ("best",)
BEST_RECORD = "best/best.json"
# What `taciturn report` reads, checked against the manifest first.
REPORTED = (CONFIG, INFO, *APPENDED, PARTITION, "mdp.safetensors")
CHECKPOINT = re.compile(r"round_(\d{6})")
TEMPORARY = re.compile(r"round_\d{6}\.tmp")


class RunDirError(TaciturnError, OSError):
    """A run directory that cannot be used as asked: taken, not a run, locked, or damaged."""


def config_digest(config: Any) -> str:
    """SHA-256 of a validated config (pydantic model): run.json keeps it, resume compares it."""
    tree = config.model_dump(mode="json")
    return hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class _Session:
    """One process's hold on a run folder: the lock, the folder's descriptor and its manifest."""

    path: Path
    fd: int
    created: bool  # the lock made the folder
    depth: int = 1
    manifest: Manifest | None = None
    had_manifest: bool = False
    claimed: dict[str, bool] = field(default_factory=dict)  # made by this process: path -> is a folder
    dirty: bool = False  # digests entered that manifest.json does not hold yet

    def __post_init__(self) -> None:
        self.raw = Folder(self.path, self.fd)  # the manifest's own writes (the fd stays the session's)
        self.fs = Folder(self.path, self.fd, owner=self)
        self.manifest = Manifest.load(self.raw)
        self.had_manifest = self.manifest is not None

    def listing(self) -> Manifest:
        """The manifest (a new one if the folder had none)."""
        if self.manifest is None:
            self.manifest = Manifest()
        return self.manifest

    # the Owner protocol of core/folder.py
    def creating(self, rel: str, is_dir: bool) -> None:
        self.claimed[rel] = is_dir
        if self.listing().add(rel, is_dir):
            self.listing().save(self.raw)

    def writing(self, rel: str) -> None:
        if rel not in self.claimed and not (self.manifest and self.manifest.lists(rel)):
            raise RunDirError(
                f"{self.path / rel} exists and taciturn did not write it (manifest.json does not list "
                "it); taciturn never writes over a file it did not create: move it away, or use another "
                "folder"
            )
        entry = self.listing().files.get(rel, {})
        if not entry.get("appended") and self.listing().changed(self.fs, rel):
            raise RunDirError(_changed(self.path / rel))

    def written(self, rel: str, data: bytes) -> None:
        self.listing().record(self.fs, rel, data=data)  # hashed as written, not read back
        self.dirty = True

    def save(self, sync: bool = False) -> None:
        self.listing().save(self.raw, sync)
        self.dirty = False


_held: dict[tuple[int, int], _Session] = {}  # (device, inode) of a folder -> this process's hold on it


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    config = property(lambda self: self.path / CONFIG)
    metrics = property(lambda self: self.path / METRICS)
    ledger = property(lambda self: self.path / LEDGER)
    events = property(lambda self: self.path / EVENTS)
    partition = property(lambda self: self.path / PARTITION)
    info = property(lambda self: self.path / INFO)
    checkpoints = property(lambda self: self.path / "checkpoints")
    plots = property(lambda self: self.path / "plots")
    report = property(lambda self: self.path / REPORT)
    log = property(lambda self: self.path / LOG)

    # ----- the folder, without links -----
    def _session(self) -> _Session | None:
        key = _identity(self.path)
        return None if key is None else _held.get(key)

    @property
    def fs(self) -> Folder:
        """The folder's files (core/folder.py); while this process holds the lock, every file it
        creates enters the manifest first, and a file the manifest does not list is not written."""
        session = self._session()
        return session.fs if session is not None else Folder(self.path)

    def rel(self, path: Path | str) -> str:
        return self.fs.rel(path)

    def exists(self) -> bool:
        kind = self.fs.kind(CONFIG)
        if kind not in (None, "file"):
            raise RunDirError(f"{self.config} is not a regular file (a link?); this is not a usable run")
        return kind == "file"

    def require(self) -> RunDir:
        """This folder, if it holds a run; else a clear error."""
        if not self.path.is_dir() or not self.exists():
            raise RunDirError(f"{self.path} is not a run directory (no config.toml)")
        return self

    # ----- the lock -----
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder's lock while writing it; a second process gets a clear error.

        An OS lock (flock) on the folder's own descriptor: no file in it can be unlinked to get
        around it, and the kernel releases it when the holder dies, so a crashed run never leaves a
        stale lock. Re-entrant within one process. If no run was started (a bad config, a foreign
        folder), what this process made there goes again, and the folder if the lock made it.
        """
        created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileExistsError, NotADirectoryError):
            raise RunDirError(f"{self.path} is a file, not a folder; choose another --out") from None
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino)
        if key in _held:
            os.close(fd)
            session = _held[key]
            session.depth += 1
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(
                    f"{self.path} is in use by another taciturn process (it holds the folder's lock); "
                    "wait for it to finish, or use another folder"
                ) from None
            try:
                session = _Session(self.path, fd, created)
            except BaseException:
                os.close(fd)
                raise
            _held[key] = session
        try:
            yield
        finally:
            session.depth -= 1
            if session.depth == 0:
                del _held[key]
                try:
                    if session.fs.kind(CONFIG) != "file":  # nothing started here
                        _abandon(session)
                    elif session.dirty:
                        session.save(sync=True)
                finally:
                    os.close(session.fd)  # releases the flock

    def held(self) -> bool:
        """Whether this process holds the folder's lock."""
        return self._session() is not None

    def _held_session(self) -> _Session:
        session = self._session()
        if session is None:
            raise RunDirError(f"{self.path}: taciturn writes a run folder only while it holds its lock")
        return session

    # ----- reading -----
    def read_text(self, path: Path | str) -> str:
        try:
            return self.fs.read_text(self.rel(path))
        except UnicodeDecodeError as error:
            raise RunDirError(
                f"{self.path / self.rel(path)} is not UTF-8 text ({error}); it is damaged"
            ) from None

    def read_bytes(self, path: Path | str) -> bytes:
        return self.fs.read_bytes(self.rel(path))

    def has(self, path: Path | str) -> bool:
        """Whether the file is there (a link or a folder in its place is an error naming it)."""
        rel = self.rel(path)
        kind = self.fs.kind(rel)
        if kind not in (None, "file"):
            raise RunDirError(f"{self.path / rel} is not a regular file (a link, a folder?); remove it")
        return kind == "file"

    def read_jsonl(self, path: Path | str) -> list[dict[str, Any]]:
        """Every row of a JSON-lines file; a line that is not a JSON object is an error naming it."""
        if not self.has(path):
            return []
        where = self.path / self.rel(path)
        return [
            _json_row(where, number, line)
            for number, line in enumerate(self.read_text(path).splitlines(), 1)
            if line.strip()
        ]

    def read_metrics(self) -> list[dict[str, Any]]:
        return self.read_jsonl(METRICS)

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
            part = json.loads(self.read_text(PARTITION))
        except ValueError as error:
            raise RunDirError(f"{self.partition} is not valid JSON ({error}); rerun or restore it") from None
        if not _valid_partition(part):
            raise RunDirError(
                f"{self.partition} is damaged: it needs strings dataset, source, kind; integers num_clients, "
                "num_classes; a count per client in sizes and histogram (per class, or one column of sizes)"
            )
        return part

    def read_info(self) -> dict[str, Any]:
        """run.json (an empty dict when there is none)."""
        if not self.has(INFO):
            return {}
        try:
            info = json.loads(self.read_text(INFO))
        except ValueError as error:
            raise RunDirError(f"{self.info} is not valid JSON ({error})") from None
        if not isinstance(info, dict):
            raise RunDirError(f"{self.info} is not a JSON object; it is damaged")
        return info

    def primary_metric(self) -> str:
        """The evaluation metric plots and summaries lead with ("accuracy" unless run.json says)."""
        metric = self.read_info().get("primary_metric", "accuracy")
        if not isinstance(metric, str):
            raise RunDirError(f"{self.info}: primary_metric must be a string")
        return metric

    def read_ledger(self, up_to_round: int | None = None) -> Any:
        """The cumulative ledger (core/ledger.py) of the rounds up to ``up_to_round``."""
        from taciturn.core.ledger import Ledger

        if not self.has(LEDGER):
            return Ledger()
        with self.fs.open(LEDGER, "r", newline="") as f:
            return Ledger.read_csv(f, up_to_round)

    # ----- writing (under the lock) -----
    def write_text(self, path: Path | str, text: str) -> Path:
        """Write a whole file, durably, its digest in the manifest (files report and resume read)."""
        return self.write_bytes(path, text.encode())

    def write_bytes(self, path: Path | str, data: bytes) -> Path:
        rel = self.rel(path)
        session = self._held_session()
        session.fs.write_bytes(rel, data, sync=True)  # the session enters its digest
        session.save(sync=True)
        return self.path / rel

    def write_json(self, path: Path | str, tree: Any) -> Path:
        return self.write_text(path, json.dumps(tree))

    def append_jsonl(self, path: Path | str, row: dict[str, Any]) -> None:
        self.fs.append_text(self.rel(path), json.dumps(row, sort_keys=False) + "\n")

    def append_ledger(self, ledger: Any, round: int, by_client: bool = True) -> None:
        """Append one round's rows of ``ledger`` (core/ledger.py) to ledger.csv (``by_client=False``:
        one row per direction, as private runs keep it)."""
        new = not self.has(LEDGER)
        with self.fs.open(LEDGER, "a", newline="") as f:
            ledger.write_csv(f, round, header=new, by_client=by_client)

    def log_handler(self) -> logging.Handler:
        """A handler that appends the log to run.log (never through a link)."""
        handler = _QuietHandler(self.fs.text_stream(LOG))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        return handler

    def lists(self, path: Path | str) -> bool:
        """Whether the manifest lists ``path`` as a file or folder taciturn wrote."""
        manifest = self._manifest()
        return manifest is not None and manifest.lists(self.rel(path))

    def claim(self, *names: str) -> None:
        """Enter files another process will create here (a disk store's slots) in the manifest."""
        session = self._held_session()
        for name in names:
            session.creating(self.rel(name), False)

    # ----- starting afresh -----
    def is_run(self) -> bool:
        """A folder taciturn made: its config.toml is a resolved config (it has type, name and seed)."""
        try:
            tree = tomllib.loads(self.fs.read_text(CONFIG))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return False
        return {"type", "name", "seed"} <= tree.keys()

    def check_free(self, overwrite: bool) -> None:
        """Refuse to start a new run over an existing run, or in a folder of other files, unless told
        to; with ``overwrite``, refuse where a file taciturn writes is there and is not its own."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path} is a file, not a folder; choose another --out")
        if not self.path.exists():
            return
        session = self._held_session()
        others = sorted(n for n in session.fs.listdir() if n not in (MANIFEST, *session.claimed))
        if not overwrite:
            if self.is_run():
                raise RunDirError(
                    f"{self.path} already holds a run; continue it with `taciturn resume {self.path}` "
                    "or pass --overwrite to replace it"
                )
            if others:
                shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
                raise RunDirError(
                    f"{self.path} is not empty and is not a taciturn run (it holds {shown}); choose an empty "
                    "or new folder, or pass --overwrite (taciturn then deletes only the files its "
                    "manifest.json lists as its own, and never writes over any other)"
                )
            return
        listed = session.manifest
        for rel in listed.files if listed else ():
            if listed.changed(session.fs, rel):
                raise RunDirError(_changed(self.path / rel))
        for name in (*TOP_FILES, *TOP_FOLDERS):
            if session.fs.kind(name) is not None and not (listed and listed.lists(name)):
                raise RunDirError(
                    f"{self.path / name} is not a file taciturn wrote (no manifest.json lists it), and a "
                    "run writes there: move it away, or choose another --out"
                )
        self.check_own_files()  # what --overwrite will delete: taciturn's own files, not links to others

    def check_own_files(self) -> None:
        """Every file and folder the manifest lists is still a plain file or folder (or gone), and
        every file a run rewrites still holds what taciturn wrote: a link in their place, or a file
        the user changed since, is refused before any work, by name."""
        manifest = self._manifest()
        if manifest is None:
            return
        fs = self.fs
        for rel, wanted in [(f, "file") for f in manifest.files] + [(f, "dir") for f in manifest.folders]:
            if fs.kind(rel) not in (None, wanted):
                raise RunDirError(
                    f"{self.path / rel} is not the {'file' if wanted == 'file' else 'folder'} taciturn "
                    "wrote there (a link, or something else): taciturn never writes, reads or deletes "
                    "through it; remove it yourself, or use another folder"
                )
        for rel, entry in manifest.files.items():
            # the files a run or a report writes over (the report, plots, a store's slots); what they
            # only read or append to is checked by the checkpoints and `verify`, with their own words
            rewritten = not (entry.get("appended") or rel in REPORTED or rel.startswith("checkpoints/"))
            if rewritten and manifest.changed(fs, rel):
                raise RunDirError(_changed(self.path / rel))

    def reset(self, config: Any, toml: str) -> None:
        """Start the folder afresh for ``config`` (validated) written as ``toml``: what the previous
        manifest lists is deleted (nothing else), and a new manifest, signed by this user, starts
        with config.toml and run.json (the config's digest)."""
        session = self._held_session()
        previous = session.manifest
        if previous is not None:
            keep = session.claimed  # made by this process for the new run (e.g. a disk store's slots)
            _delete(session.fs, [f for f in previous.files if f not in keep], previous.folders - set(keep))
        fresh = Manifest(signed=True)
        for rel, is_dir in session.claimed.items():
            fresh.add(rel, is_dir)
        session.manifest = fresh
        session.save()
        self.write_text(CONFIG, toml)
        self.write_json(INFO, {"type": config.type, "config_sha256": config_digest(config)})

    def update_info(self, extra: dict[str, Any]) -> None:
        self.write_json(INFO, self.read_info() | extra)

    def check_config(self, config: Any) -> None:
        """The config read back from config.toml is the one the run was started with."""
        recorded = self.read_info().get("config_sha256")
        if recorded is None:
            raise RunDirError(
                f"{self.info} does not record the config's digest (a run from an older taciturn, or "
                f"damaged): start it again with `taciturn run {self.config} --out {self.path} --overwrite`"
            )
        if recorded != config_digest(config):
            raise RunDirError(
                f"{self.config} is not the config this run was started with (its digest differs from the "
                f"one in {self.info}): it was edited or replaced; restore it, or start a new run with it"
            )

    def signed(self) -> bool:
        """Whether this user's taciturn wrote the run as it stands: the manifest's MAC checks with
        this user's key, and config.toml and run.json are the files it lists."""
        manifest = self._manifest()
        if manifest is None or not manifest.mac_valid:
            return False
        try:
            manifest.check(self.fs, [CONFIG, INFO])
        except (ManifestError, OSError):
            return False
        return all("sha256" in manifest.files.get(name, {}) for name in (CONFIG, INFO))

    def _manifest(self) -> Manifest | None:
        session = self._session()
        if session is not None:
            return session.manifest
        return Manifest.load(self.fs)

    def verify(self) -> None:
        """Check what `taciturn report` reads against the manifest; a changed file is named."""
        manifest = self._manifest()
        if manifest is None:
            raise RunDirError(
                f"{self.path} has no {MANIFEST}: it was not written by this version of taciturn, or the "
                "manifest was removed; its files cannot be checked"
            )
        manifest.check(self.fs, list(REPORTED))

    # ----- resume support -----
    def sync(self) -> None:
        """Flush the appended files to disk (called before a checkpoint is committed)."""
        for name in APPENDED:
            if self.has(name):
                self.fs.fsync(name)

    @property
    def appended(self) -> tuple[str, ...]:
        """The files a run appends to as it goes."""
        return APPENDED

    def committed(
        self, tmp: str, rel: str, files: dict[str, dict[str, Any]], appended: dict[str, tuple[int, str]]
    ) -> None:
        """A checkpoint renamed from ``tmp`` into place at ``rel``, holding ``files`` (name -> sha256
        and bytes), taken with the appended files at ``appended`` (name -> (bytes, sha256)): the
        manifest follows, durably."""
        session = self._held_session()
        manifest = session.listing()
        manifest.move(tmp, rel)
        for name, entry in files.items():
            manifest.files[f"{rel}/{name}"] = dict(entry)
        for name, (size, digest) in appended.items():
            if size or self.has(name):
                manifest.set_appended(name, size, digest)
        if self.has(LOG):
            manifest.record(session.fs, LOG, "appended")
        session.claimed = {
            (rel + key[len(tmp) :] if key == tmp or key.startswith(tmp + "/") else key): is_dir
            for key, is_dir in session.claimed.items()
        }
        session.save(sync=True)

    def started(self) -> None:
        """A process writes the run from now on: until ``finished``, appended files may grow."""
        session = self._held_session()
        session.listing().complete = False
        session.save()

    def finished(self) -> None:
        """The run ended: the appended files (run.log too) and the scratch files enter the manifest as
        they are, for `report` to check and for `--overwrite` to know they are still taciturn's."""
        session = self._held_session()
        manifest = session.listing()
        for name in (*APPENDED, LOG):
            if self.has(name):
                manifest.record(session.fs, name, "appended")
        for rel, entry in list(manifest.files.items()):  # what the run rewrote as it went (a
            # resumed run rewrites the scratch files of the run before it: their digest is renewed)
            if ("sha256" not in entry or entry.get("scratch")) and session.fs.kind(rel) == "file":
                manifest.record(session.fs, rel, "scratch")
        manifest.complete = True
        session.save(sync=True)

    def truncate_to(self, lengths: dict[str, int]) -> None:
        """Cut the appended files back to their lengths at a checkpoint (``lengths``: name -> bytes),
        forgetting what was recorded after it; a torn last line is noted in the log."""
        fs = self.fs
        for name, size in lengths.items():
            if not self.has(name) or fs.size(name) == size:
                continue
            with fs.open(name, "rb") as f:
                f.seek(size)
                if not f.read().endswith(b"\n"):
                    log.warning("%s: cut a torn last line (the run was stopped mid-write)", self.path / name)
            fs.truncate(name, size)
        session = self._session()
        if session is not None:  # the manifest now holds them as they are at the checkpoint
            for name in lengths:
                if self.has(name):
                    session.listing().record(session.fs, name, "appended")
            session.listing().complete = False
            session.save(sync=True)

    def checkpoint_dir(self, round: int) -> Path:
        return self.checkpoints / f"round_{round:06d}"

    def committed_checkpoints(self) -> list[tuple[int, Path]]:
        fs = self.fs
        kind = fs.kind("checkpoints")
        if kind is None:
            return []
        if kind != "dir":
            raise RunDirError(f"{self.checkpoints} is not a folder (a link?); taciturn will not read it")
        found = ((CHECKPOINT.fullmatch(n), n) for n in fs.listdir("checkpoints"))
        return sorted(
            (int(m.group(1)), self.checkpoints / n) for m, n in found if m and fs.is_dir(f"checkpoints/{n}")
        )

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The newest committed checkpoint; temporaries a crash left behind are removed."""
        fs = self.fs
        if fs.is_dir("checkpoints"):
            for name in fs.listdir("checkpoints"):
                if TEMPORARY.fullmatch(name) and fs.is_dir(f"checkpoints/{name}"):
                    log.warning("removing %s, a checkpoint a crash left unfinished", self.checkpoints / name)
                    self.remove(f"checkpoints/{name}")
        done = self.committed_checkpoints()
        return done[-1] if done else None

    def prune_checkpoints(self, keep: int) -> None:
        for _, old in self.committed_checkpoints()[:-keep]:
            self.remove(old)

    def remove(self, path: Path | str) -> bool:
        """Delete the files and folders the manifest lists at or below ``path`` (nothing else); True
        if the folder went, False if files taciturn did not write kept it (they are named in the log)."""
        session = self._held_session()
        rel = self.rel(path)
        files, folders = session.listing().under(rel)
        _delete(session.fs, files, set(folders), session.listing())
        for name in files + folders:
            if not session.fs.exists(name):
                session.listing().forget(name)
        session.save()
        if session.fs.exists(rel):
            log.warning(
                "kept %s: it holds files taciturn did not write (%s)",
                self.path / rel,
                ", ".join(session.fs.listdir(rel)[:5]),
            )
            return False
        return True


class _QuietHandler(logging.StreamHandler):
    """run.log's handler: a write that fails (a full disk) is dropped, not printed as a traceback;
    the run's next file write names the problem."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def _changed(path: Path) -> str:
    return (
        f"{path} changed since taciturn wrote it (its SHA-256 is not the one in manifest.json), so it "
        "may hold your work now: taciturn will not write over it or delete it; move it away (or "
        "delete it yourself), then run again"
    )


def _delete(fs: Folder, files: list[str], folders: set[str], manifest: Manifest | None = None) -> None:
    """Remove listed files (never through a link; with ``manifest``, never one that changed since
    taciturn wrote it), then listed folders that are left empty, deepest first; the folders that
    still hold something stay."""
    for rel in sorted(files):
        if manifest is not None and manifest.changed(fs, rel):
            log.warning("kept %s: %s", fs.where(rel), "it changed since taciturn wrote it")
            continue
        fs.unlink(rel)
    for rel in sorted(folders, key=lambda f: f.count("/"), reverse=True):
        fs.rmdir(rel)


def _abandon(session: _Session) -> None:
    """A lock released with no run started: remove what this process made, and the folder if the
    lock made it and nothing else is there."""
    fs = session.fs
    with contextlib.suppress(OSError):
        _delete(
            fs,
            [rel for rel, is_dir in session.claimed.items() if not is_dir],
            {rel for rel, is_dir in session.claimed.items() if is_dir},
        )
        if not session.had_manifest:
            fs.unlink(MANIFEST)
        if session.created:
            session.path.rmdir()


def _json_row(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as error:
        raise RunDirError(f"{path} line {number} is not valid JSON ({error}); the file is damaged") from None
    if not isinstance(row, dict):
        raise RunDirError(f"{path} line {number} is not a JSON object; the file is damaged")
    return row


COMPARISON_FILES = ("report.html", "summary.json", "compare.html")


def check_comparison_folder(out: Path) -> None:
    """A comparison (`taciturn compare`, `taciturn demo`) writes report.html, summary.json and PNGs
    into ``out``: refuse a folder holding anything else than those and run directories."""
    if not out.exists():
        return
    if not out.is_dir():
        raise RunDirError(f"{out} is a file, not a folder; choose another --out")
    fs = Folder(out)
    foreign = sorted(
        name
        for name in fs.listdir()
        if not (fs.kind(name) == "dir" and RunDir(out / name).is_run())
        and not (fs.kind(name) == "file" and (name in COMPARISON_FILES or name.endswith(".png")))
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


__all__ = ["FolderError", "RunDir", "RunDirError", "check_comparison_folder", "config_digest"]
