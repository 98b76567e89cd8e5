"""Checkpoints: server state, client states and progress counters, committed atomically and verified.

A checkpoint is a folder written under a temporary name (``round_NNNNNN.tmp``), its files and a
``manifest.json`` of their SHA-256 digests and sizes fsynced, then renamed into place and the parent
folder fsynced: a run killed at any moment leaves the previous checkpoint intact, and a leftover
temporary is ignored (and removed) on resume. Loading checks every file against the manifest and
the state's arrays against the shapes the run expects, so a damaged or edited checkpoint is a clear
error naming the file, never a silent resume. Everything goes through the safetensors codec.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taciturn.core.codec import decode, encode
from taciturn.core.errors import TaciturnError
from taciturn.core.folder import Folder
from taciturn.core.message import Message
from taciturn.core.packing import pack, unpack
from taciturn.core.state_store import ClientStateStore
from taciturn.report.rundir import RunDir, RunDirError

MANIFEST = "manifest.json"


class CheckpointError(RunDirError):
    """A checkpoint that is incomplete, damaged or not the run's."""


def commit(
    folder: Path,
    write: Callable[[Folder], None],
    rundir: RunDir | None = None,
    pinned: tuple[str, ...] = (),
    rows: bool = True,
) -> None:
    """Write a checkpoint with ``write(tmp_folder)``, then make it durable and put it in place.

    With ``rundir`` (the run the checkpoint belongs to), the manifest also records the digest of
    config.toml and of the ``pinned`` files beside it (e.g. a fedq run's MDP), and (``rows``) the
    length and digest of every appended file (metrics, ledger, events) as they stand: on resume, an
    edit to any of them is caught, and whatever was appended after the checkpoint is cut off. The
    best model (experiments/best.py) is committed without ``rows``: no resume starts from it. Every
    file goes through core/folder.py (no links) and enters the run's manifest before it exists.
    """
    if rundir is None:  # a checkpoint outside a run (tools, tests): its parent folder is the root
        folder = Path(folder).absolute()
        folder.parent.mkdir(parents=True, exist_ok=True)
        fs, rel = Folder(folder.parent), folder.name
    else:
        fs, rel = rundir.fs, rundir.rel(folder)
    tmp = rel + ".tmp"
    if fs.exists(tmp) and (rundir is None or not rundir.remove(tmp)):
        raise CheckpointError(
            f"{fs.where(tmp)} is in the way of a checkpoint and holds files taciturn did not write"
        )
    appended: dict[str, tuple[int, str]] = {}
    with fs.sub(tmp, create=True) as out:
        write(out)
        names = _files(out)
        if rundir is not None:  # files a store wrote from another process (a Ray keeper)
            rundir.claim(*(f"{tmp}/{name}" for name in names))
        files = {}
        for name in names:
            files[name] = {"sha256": out.digest(name), "bytes": out.size(name)}
            out.fsync(name)
        manifest: dict[str, Any] = {"files": files}
        if rundir is not None:
            if rows:
                rundir.sync()  # the rows up to this checkpoint are on disk before it is
            manifest["pinned"] = {name: fs.digest(name) for name in ("config.toml", *pinned)}
            for name in rundir.appended if rows else ():
                size = fs.size(name) if fs.exists(name) else 0
                appended[name] = (size, fs.digest(name, size) if size else hashlib.sha256().hexdigest())
            manifest["appended"] = {name: {"bytes": b, "sha256": d} for name, (b, d) in appended.items()}
        manifest["sha256"] = _self_digest(manifest)
        out.write_text(MANIFEST, json.dumps(manifest, indent=1), sync=True)
        for sub in sorted({n.rsplit("/", 1)[0] for n in names if "/" in n}):
            out.fsync_dir(sub)
        out.fsync_dir()
    if fs.exists(rel) and (rundir is None or not rundir.remove(rel)):
        raise CheckpointError(
            f"{fs.where(rel)} is in the way of a checkpoint and holds files taciturn did not write"
        )
    fs.rename(tmp, rel)
    fs.fsync_dir(rel.rsplit("/", 1)[0] if "/" in rel else "")
    if rundir is not None:
        rundir.committed(tmp, rel, files, appended)


def _files(folder: Folder, below: str = "") -> list[str]:
    """Every regular file in ``folder`` (relative paths); a link or anything else is an error."""
    found = []
    for name in folder.listdir(below):
        rel = f"{below}/{name}" if below else name
        kind = folder.kind(rel)
        if kind == "dir":
            found += _files(folder, rel)
        elif kind == "file":
            found.append(rel)
        else:
            raise CheckpointError(f"{folder.where(rel)} is not a regular file (a link?) in a checkpoint")
    return found


def _locate(folder: Path, run: Path | None = None) -> tuple[Folder, str]:
    """The run folder a checkpoint folder lives in (``run``, by default two levels up:
    run/checkpoints/round_N), and its path there: every read goes from the run folder down, never
    through a link."""
    folder = Path(folder).absolute()
    rundir = RunDir(folder.parent.parent if run is None else Path(run).absolute())
    return rundir.fs, rundir.rel(folder)


def verify(folder: Path, run_dir: Path | None = None) -> dict[str, int]:
    """Check a checkpoint against its manifest (and the run files it records); return the lengths the
    appended files had when it was written. A mismatch is a clear error naming the file. ``run_dir``:
    the run folder it lives in, when it is not run/checkpoints/round_N (the best model: run/best)."""
    run, rel = _locate(folder, run_dir)
    folder = run.where(rel)
    try:
        manifest = json.loads(run.read_text(f"{rel}/{MANIFEST}"))
        if manifest.pop("sha256") != _self_digest(manifest):
            raise ValueError("its own digest does not match: it is damaged or edited")
        listed = {str(name): (str(f["sha256"]), int(f["bytes"])) for name, f in manifest["files"].items()}
        pinned = {str(name): str(digest) for name, digest in manifest.get("pinned", {}).items()}
        appended = {
            str(name): (str(f["sha256"]), int(f["bytes"])) for name, f in manifest.get("appended", {}).items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(
            f"checkpoint {folder} has no readable {MANIFEST} ({type(error).__name__}: {error}); "
            "delete this checkpoint folder to resume from an earlier one"
        ) from None
    for name, (digest, size) in listed.items():
        path = folder / name
        try:
            good = run.is_file(f"{rel}/{name}")
        except OSError:  # a name that leaves the folder, or a link on the way
            good = False
        if not good:
            raise CheckpointError(
                f"checkpoint file {path} is missing; delete {folder} to resume from an earlier one"
            )
        if run.size(f"{rel}/{name}") != size or run.digest(f"{rel}/{name}") != digest:
            raise CheckpointError(
                f"checkpoint file {path} does not match its SHA-256 in {MANIFEST} (damaged or edited); "
                f"delete {folder} to resume from an earlier checkpoint"
            )
    for name, digest in pinned.items():
        path = run.where(name)
        if Path(name).name != name or not _is_file(run, name) or run.digest(name) != digest:
            raise CheckpointError(
                f"{path} is missing or not the file checkpoint {folder} was written with (damaged or "
                "edited); restore it, or start the run again"
            )
    for name, (digest, size) in appended.items():
        path = run.where(name)
        have = run.size(name) if Path(name).name == name and _is_file(run, name) else 0
        if Path(name).name != name or have < size or (size and run.digest(name, size) != digest):
            raise CheckpointError(
                f"{path} lost or changed rows it had at checkpoint {folder.name} (damaged or edited); "
                "restore it, or start the run again"
            )
    return {name: size for name, (_, size) in appended.items()}


def _is_file(fs: Folder, rel: str) -> bool:
    kind = fs.kind(rel)
    if kind not in (None, "file"):
        raise CheckpointError(f"{fs.where(rel)} is not a regular file (a link?); taciturn will not read it")
    return kind == "file"


def save(
    folder: Path,
    server_state: Any,
    store: ClientStateStore,
    progress: dict[str, Any],
    extras: Mapping[str, Any] | None = None,
    rundir: RunDir | None = None,
    pinned: tuple[str, ...] = (),
) -> None:
    """``extras``: other state dataclasses to keep beside the server's (e.g. an analysis twin model);
    ``rundir`` and ``pinned``: the run and the files it depends on (``commit``)."""

    def write(tmp: Folder) -> None:
        tmp.write_bytes("server.safetensors", encode(pack(server_state)))
        for name, extra in (extras or {}).items():
            tmp.write_bytes(f"{name}.safetensors", encode(pack(extra)))
        store.save(tmp)
        tmp.write_text("progress.json", json.dumps(progress, indent=1))

    commit(folder, write, rundir, pinned)


def load(folder: Path, template: Any, store: ClientStateStore) -> tuple[Any, dict[str, Any]]:
    """The server state (checked against ``template``, a freshly initialised state), the client
    states (into ``store``) and the progress counters of a checkpoint (``verify`` it first)."""
    server_state = load_state(folder / "server.safetensors", template)
    run, rel = _locate(folder)
    try:
        with run.sub(rel) as source:
            store.load(source)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint {folder}: client states unreadable ({error})") from None
    return server_state, read_progress(folder)


def read_progress(folder: Path) -> dict[str, Any]:
    try:
        progress = json.loads(_read(folder / "progress.json"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint {folder}: progress.json unreadable ({error})") from None
    if not isinstance(progress, dict) or not isinstance(progress.get("round"), int):
        raise CheckpointError(f"checkpoint {folder}: progress.json has no integer round")
    return progress


def load_state(path: Path, template: Any) -> Any:
    """A state dataclass from ``path``; every array of ``template`` is there with its shape and dtype
    (a state may grow: more arrays, e.g. an optimizer's buffers, or rows of a history that starts
    empty)."""
    state = _read_state(path, type(template))
    expected, found = _shapes(template), _shapes(state)
    diff = sorted(k for k in expected if not _fits(found.get(k), expected[k]))
    if diff:
        shown = ", ".join(f"{k}: {found.get(k, 'missing')} (expected {expected[k]})" for k in diff[:4])
        raise CheckpointError(f"checkpoint file {path} does not fit this run's config: {shown}")
    return state


def _read_state(path: Path, cls: type) -> Any:
    try:
        return unpack(cls, decode(_read(path)))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint file {path} is not a valid {cls.__name__} ({error})") from None


def load_extra(folder: Path, name: str, template: Any) -> Any | None:
    """The extra state ``name`` saved with this checkpoint (checked against ``template``), or None."""
    run, rel = _locate(folder)
    return (
        load_state(folder / f"{name}.safetensors", template)
        if _is_file(run, f"{rel}/{name}.safetensors")
        else None
    )


def server_state_class(algorithm: Any) -> type:
    """The dataclass an algorithm's ``init_server`` returns (read from its annotation), so a
    checkpoint can be read without building the task."""
    return typing.get_type_hints(type(algorithm).init_server)["return"]


def load_server(folder: Path, algorithm: Any) -> Any:
    """Only the server state of a verified checkpoint (client states stay on disk)."""
    verify(folder)
    return _read_state(folder / "server.safetensors", server_state_class(algorithm))


def load_message(path: Path) -> Message:
    try:
        return decode(_read(path))
    except (OSError, TaciturnError) as error:
        raise CheckpointError(f"checkpoint file {path} is unreadable ({error})") from None


def _fits(found: tuple | None, expected: tuple) -> bool:
    """Same dtype and shape, where an empty dimension of the fresh state may have grown (history)."""
    if found is None or found[0] != expected[0] or len(found[1]) != len(expected[1]):
        return False
    return all(e in (f, 0) for f, e in zip(found[1], expected[1], strict=True))


def _shapes(state: Any) -> dict[str, tuple]:
    """name -> (dtype, shape) of every array in a state dataclass (dict fields flattened)."""
    found: dict[str, tuple] = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, item in items:
            if isinstance(item, torch.Tensor | np.ndarray):
                name = f.name if key is None else f"{f.name}/{key}"
                found[name] = (str(item.dtype).removeprefix("torch."), tuple(item.shape))
    return found


def _self_digest(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> bytes:
    """A file of a checkpoint (or beside one, in its run folder), read without following links."""
    path = Path(path).absolute()
    run, rel = _locate(path.parent)
    return run.read_bytes(f"{rel}/{path.name}")
