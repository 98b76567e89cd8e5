"""Checkpoints: server state, client states and progress counters, written atomically.

A checkpoint is a folder written under a temporary name and renamed into place, so a run killed
mid-write leaves the previous checkpoint intact. Everything goes through the safetensors codec.
"""

from __future__ import annotations

import json
import os
import shutil
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from taciturn.core.codec import decode, encode
from taciturn.core.packing import pack, unpack
from taciturn.core.state_store import ClientStateStore


def save(
    folder: Path,
    server_state: Any,
    store: ClientStateStore,
    progress: dict[str, Any],
    extras: Mapping[str, Any] | None = None,
) -> None:
    """``extras``: other state dataclasses to keep beside the server's (e.g. an analysis twin model)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "server.safetensors").write_bytes(encode(pack(server_state)))
    for name, extra in (extras or {}).items():
        (tmp / f"{name}.safetensors").write_bytes(encode(pack(extra)))
    store.save(tmp)
    (tmp / "progress.json").write_text(json.dumps(progress, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def load(folder: Path, state_class: type, store: ClientStateStore) -> tuple[Any, dict[str, Any]]:
    server_state = unpack(state_class, decode((folder / "server.safetensors").read_bytes()))
    store.load(folder)
    return server_state, json.loads((folder / "progress.json").read_text())


def load_extra(folder: Path, name: str, state_class: type) -> Any | None:
    """The extra state ``name`` saved with this checkpoint, or None if it has none."""
    path = folder / f"{name}.safetensors"
    return unpack(state_class, decode(path.read_bytes())) if path.is_file() else None


def server_state_class(algorithm: Any) -> type:
    """The dataclass an algorithm's ``init_server`` returns (read from its annotation), so a
    checkpoint can be read without building the task."""
    return typing.get_type_hints(type(algorithm).init_server)["return"]


def load_server(folder: Path, algorithm: Any) -> Any:
    """Only the server state of a checkpoint (client states stay on disk)."""
    return unpack(server_state_class(algorithm), decode((folder / "server.safetensors").read_bytes()))
