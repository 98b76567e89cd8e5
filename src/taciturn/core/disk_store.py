"""A client-state store on disk: one fixed-size slot per client in one file.

The first state written fixes the layout (names, dtypes, shapes), which every later state must
match. Slots are read and written with pread/pwrite, never memory-mapped, so state lives in the
page cache rather than in the process's resident memory: 10,000 SCAFFOLD clients cost disk, not
RAM. Different clients never share bytes, so worker processes can use one store concurrently; a
presence byte per client (at the head of the file) says who has state. Untouched slots are holes
in a sparse file. A store starts empty: a file an earlier run left in the folder is truncated, not
read (resuming writes the checkpoint's clients back, ``load``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from taciturn.core.state_store import ClientState, ClientStateStore

_COPY_CHUNK = 64 * 1024 * 1024


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # within the slot
    nbytes: int


class DiskStateStore(ClientStateStore):
    shared = True

    def __init__(self, path: Path, num_clients: int):
        self.path = Path(path)
        self.layout_path = self.path.with_suffix(".layout.json")
        self.num_clients = num_clients
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.layout_path.unlink(missing_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fields: list[Field] | None = None
        self._slot = 0

    # ----- layout -----
    def _layout(self) -> list[Field] | None:
        if self._fields is None and self.layout_path.exists():  # written by another process
            self._set_layout(
                [
                    Field(f["name"], f["dtype"], tuple(f["shape"]), f["offset"], f["nbytes"])
                    for f in json.loads(self.layout_path.read_text())
                ]
            )
        return self._fields

    def _set_layout(self, fields: list[Field]) -> None:
        self._fields = fields
        self._slot = sum(f.nbytes for f in fields)

    def _define_layout(self, state: ClientState) -> None:
        fields, offset = [], 0
        for name in sorted(state):
            array = state[name].detach().cpu().numpy()
            fields.append(Field(name, array.dtype.str, tuple(array.shape), offset, array.nbytes))
            offset += array.nbytes
        tmp = self.layout_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([vars(f) for f in fields]))
        os.replace(tmp, self.layout_path)
        self._set_layout(fields)

    def _offset(self, client: int) -> int:
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} outside 0..{self.num_clients - 1}")
        return self.num_clients + client * self._slot  # presence bytes first, then the slots

    # ----- the store -----
    def put(self, client: int, state: ClientState) -> None:
        if self._layout() is None:
            self._define_layout(state)
        fields = self._fields
        assert fields is not None
        if sorted(state) != [f.name for f in fields]:
            held = [f.name for f in fields]
            raise ValueError(
                f"client {client}'s state has tensors {sorted(state)}, but the store holds {held}; "
                "a disk store needs every client's state to have the same names and shapes"
            )
        slot = bytearray(self._slot)
        for f in fields:
            array = state[f.name].detach().cpu().numpy()
            if array.dtype.str != f.dtype or tuple(array.shape) != f.shape:
                raise ValueError(
                    f"client {client}: {f.name} is {array.dtype}{array.shape}, the store holds "
                    f"{np.dtype(f.dtype)}{f.shape}"
                )
            slot[f.offset : f.offset + f.nbytes] = np.ascontiguousarray(array).tobytes()
        os.pwrite(self._fd, slot, self._offset(client))
        os.pwrite(self._fd, b"\x01", client)  # presence, written after the data

    def get(self, client: int) -> ClientState | None:
        if os.pread(self._fd, 1, client) != b"\x01" or self._layout() is None:
            return None
        raw = os.pread(self._fd, self._slot, self._offset(client))
        return {
            f.name: torch.from_numpy(
                np.frombuffer(raw, f.dtype, count=int(np.prod(f.shape)), offset=f.offset)
                .reshape(f.shape)
                .copy()
            )
            for f in self._fields or []
        }

    def clients(self) -> Iterator[int]:
        presence = np.frombuffer(
            os.pread(self._fd, self.num_clients, 0).ljust(self.num_clients, b"\0"), np.uint8
        )
        return iter(int(c) for c in np.flatnonzero(presence))

    # ----- checkpoints: the layout, the presence bytes and the present slots, streamed -----
    def save(self, folder: Path) -> None:
        target = folder / "clients"
        target.mkdir(parents=True, exist_ok=True)
        present = np.fromiter(self.clients(), dtype=np.int64)
        np.save(target / "present.npy", present, allow_pickle=False)
        if self._layout() is not None:
            shutil.copyfile(self.layout_path, target / "layout.json")
        with (target / "slots.bin").open("wb") as out:
            for client in present:
                out.write(os.pread(self._fd, self._slot, self._offset(int(client))))

    def load(self, folder: Path) -> None:
        source = folder / "clients"
        os.ftruncate(self._fd, 0)  # forget everything, then write the checkpoint's clients back
        present = np.load(source / "present.npy", allow_pickle=False)
        if (source / "layout.json").exists():
            shutil.copyfile(source / "layout.json", self.layout_path)
            self._fields = None
            self._layout()
        with (source / "slots.bin").open("rb") as slots:
            for client in present:
                os.pwrite(self._fd, slots.read(self._slot), self._offset(int(client)))
                os.pwrite(self._fd, b"\x01", int(client))

    def close(self) -> None:
        os.close(self._fd)
