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
import os
import shutil
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taciturn.core.codec import decode, encode
from taciturn.core.errors import TaciturnError
from taciturn.core.message import Message
from taciturn.core.packing import pack, unpack
from taciturn.core.state_store import ClientStateStore
from taciturn.report.rundir import RunDir, RunDirError, fsync_dir

MANIFEST = "manifest.json"


class CheckpointError(RunDirError):
    """A checkpoint that is incomplete, damaged or not the run's."""


def commit(
    folder: Path, write: Callable[[Path], None], rundir: RunDir | None = None, pinned: tuple[str, ...] = ()
) -> None:
    """Write a checkpoint with ``write(tmp_folder)``, then make it durable and put it in place.

    With ``rundir`` (the run the checkpoint belongs to), the manifest also records the digest of
    config.toml and of the ``pinned`` files beside it (e.g. a fedq run's MDP), and the length and
    digest of every appended file (metrics, ledger, events) as they stand: on resume, an edit to
    any of them is caught, and whatever was appended after the checkpoint is cut off.
    """
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        files[path.relative_to(tmp).as_posix()] = {"sha256": _digest(path), "bytes": path.stat().st_size}
        _fsync_file(path)
    manifest: dict[str, Any] = {"files": files}
    if rundir is not None:
        rundir.sync()  # the rows up to this checkpoint are on disk before it is
        manifest["pinned"] = {name: _digest(rundir.path / name) for name in ("config.toml", *pinned)}
        manifest["appended"] = {
            p.name: {"bytes": size, "sha256": _digest(p, size)}
            for p in rundir.appended
            for size in [p.stat().st_size if p.exists() else 0]
        }
    manifest["sha256"] = _self_digest(manifest)
    with (tmp / MANIFEST).open("w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    for sub in {p.parent for p in tmp.rglob("*")}:
        fsync_dir(sub)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    fsync_dir(folder.parent)


def verify(folder: Path) -> dict[str, int]:
    """Check a checkpoint against its manifest (and the run files it records); return the lengths the
    appended files had when it was written. A mismatch is a clear error naming the file."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
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
        if ".." in Path(name).parts or not path.is_file():
            raise CheckpointError(
                f"checkpoint file {path} is missing; delete {folder} to resume from an earlier one"
            )
        if path.stat().st_size != size or _digest(path) != digest:
            raise CheckpointError(
                f"checkpoint file {path} does not match its SHA-256 in {MANIFEST} (damaged or edited); "
                f"delete {folder} to resume from an earlier checkpoint"
            )
    run = folder.parent.parent
    for name, digest in pinned.items():
        path = run / name
        if Path(name).name != name or not path.is_file() or _digest(path) != digest:
            raise CheckpointError(
                f"{path} is missing or not the file checkpoint {folder} was written with (damaged or "
                "edited); restore it, or start the run again"
            )
    for name, (digest, size) in appended.items():
        path = run / name
        have = path.stat().st_size if path.is_file() else 0
        if Path(name).name != name or have < size or _digest(path, size) != digest:
            raise CheckpointError(
                f"{path} lost or changed rows it had at checkpoint {folder.name} (damaged or edited); "
                "restore it, or start the run again"
            )
    return {name: size for name, (_, size) in appended.items()}


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

    def write(tmp: Path) -> None:
        (tmp / "server.safetensors").write_bytes(encode(pack(server_state)))
        for name, extra in (extras or {}).items():
            (tmp / f"{name}.safetensors").write_bytes(encode(pack(extra)))
        store.save(tmp)
        (tmp / "progress.json").write_text(json.dumps(progress, indent=1))

    commit(folder, write, rundir, pinned)


def load(folder: Path, template: Any, store: ClientStateStore) -> tuple[Any, dict[str, Any]]:
    """The server state (checked against ``template``, a freshly initialised state), the client
    states (into ``store``) and the progress counters of a checkpoint (``verify`` it first)."""
    server_state = load_state(folder / "server.safetensors", template)
    try:
        store.load(folder)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint {folder}: client states unreadable ({error})") from None
    return server_state, read_progress(folder)


def read_progress(folder: Path) -> dict[str, Any]:
    try:
        progress = json.loads((folder / "progress.json").read_text())
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
        return unpack(cls, decode(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint file {path} is not a valid {cls.__name__} ({error})") from None


def load_extra(folder: Path, name: str, template: Any) -> Any | None:
    """The extra state ``name`` saved with this checkpoint (checked against ``template``), or None."""
    path = folder / f"{name}.safetensors"
    return load_state(path, template) if path.is_file() else None


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
        return decode(path.read_bytes())
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


def _digest(path: Path, size: int | None = None) -> str:
    """SHA-256 of the file, or of its first ``size`` bytes."""
    h = hashlib.sha256()
    left = path.stat().st_size if size is None else size
    if left:
        with path.open("rb") as f:
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())
