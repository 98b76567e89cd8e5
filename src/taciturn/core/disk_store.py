"""A client-state store on disk: one fixed-size slot per client in one file.

The first state written fixes the layout (names, dtypes, shapes), which every later state must
match. Slots are read and written with pread/pwrite, never memory-mapped, so state lives in the
page cache rather than in the process's resident memory: 10,000 SCAFFOLD clients cost disk, not
RAM. Different clients never share bytes, so worker processes can use one store concurrently; a
presence byte per client (at the head of the file) says who has state. Untouched slots are holes
in a sparse file. A store starts empty: a file an earlier run left in the folder is truncated, not
read (resuming writes the checkpoint's clients back, ``load``). Its files are opened through
core/folder.py: a link in their place is an error, never a file elsewhere truncated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from taciturn.core.folder import Folder, as_folder
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

    def __init__(self, path: Path, num_clients: int, folder: Folder | None = None):
        """``folder``: the folder ``path`` is in, when the caller holds it (a run's, whose manifest
        then lists the files before they exist); else the folder named by ``path``'s parent."""
        self.path = Path(path)
        self.layout_path = self.path.with_suffix(".layout.json")
        self.num_clients = num_clients
        self.folder = folder if folder is not None else as_folder(self.path.parent)
        self.name, self.layout_name = self.path.name, self.layout_path.name
        self.folder.unlink(self.layout_name)
        self._fd = self.folder.open_fd(self.name, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        self._fields: list[Field] | None = None
        self._slot = 0

    # ----- layout -----
    def _layout(self) -> list[Field] | None:
        if self._fields is None and self.folder.exists(self.layout_name):  # written by another process
            self._set_layout(
                [
                    Field(f["name"], f["dtype"], tuple(f["shape"]), f["offset"], f["nbytes"])
                    for f in json.loads(self.folder.read_text(self.layout_name))
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
        tmp = f"{self.layout_name}.{os.getpid()}.tmp"
        with Folder(self.folder.path, self.folder.fd) as here:  # no owner: a worker process may write it
            here.write_text(tmp, json.dumps([vars(f) for f in fields]))
            here.rename(tmp, self.layout_name)
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
    def save(self, folder: Folder | Path) -> None:
        target = as_folder(folder)
        target.mkdir("clients")
        present = np.fromiter(self.clients(), dtype=np.int64)
        with target.open("clients/present.npy", "wb") as out:
            np.save(out, present, allow_pickle=False)
        if self._layout() is not None:
            target.write_bytes("clients/layout.json", self.folder.read_bytes(self.layout_name))
        with target.open("clients/slots.bin", "wb") as out:
            for client in present:
                out.write(os.pread(self._fd, self._slot, self._offset(int(client))))

    def load(self, folder: Folder | Path) -> None:
        source = as_folder(folder)
        os.ftruncate(self._fd, 0)  # forget everything, then write the checkpoint's clients back
        with source.open("clients/present.npy", "rb") as f:
            present = np.load(f, allow_pickle=False)
        if source.exists("clients/layout.json"):
            self.folder.write_bytes(self.layout_name, source.read_bytes("clients/layout.json"))
            self._fields = None
            self._layout()
        with source.open("clients/slots.bin", "rb") as slots:
            for client in present:
                os.pwrite(self._fd, slots.read(self._slot), self._offset(int(client)))
                os.pwrite(self._fd, b"\x01", int(client))

    def close(self) -> None:
        os.close(self._fd)
