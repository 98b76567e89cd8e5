"""Client-state stores: where persistent per-client state lives between rounds.

SCAFFOLD control variates, ADMM duals, trigger memory and momentum buffers are named tensors per
client. ``MemoryStateStore`` keeps them in a dict; ``DiskStateStore`` (core/disk_store.py) keeps
them in fixed-size slots of one file, so 10,000+ stateful clients fit in bounded memory and worker
processes can share them. Checkpoints go through the codec or raw arrays, never pickle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from taciturn.core.codec import decode, encode
from taciturn.core.folder import Folder, as_folder
from taciturn.core.message import Message

ClientState = dict[str, torch.Tensor]


class ClientStateStore(ABC):
    shared: bool = False  # True: worker processes may read and write it concurrently

    @abstractmethod
    def get(self, client: int) -> ClientState | None:
        """The client's state, or None if it has none yet. Callers must not mutate it in place."""

    @abstractmethod
    def put(self, client: int, state: ClientState) -> None: ...

    @abstractmethod
    def clients(self) -> Iterator[int]:
        """Ids of clients with stored state."""

    @abstractmethod
    def save(self, folder: Folder | Path) -> None:
        """Write every client's state into ``folder`` (a checkpoint; core/folder.py: no links)."""

    @abstractmethod
    def load(self, folder: Folder | Path) -> None:
        """Replace the contents with a checkpoint written by ``save``."""


class MemoryStateStore(ClientStateStore):
    FILE = "clients.safetensors"

    def __init__(self) -> None:
        self._states: dict[int, ClientState] = {}

    def get(self, client: int) -> ClientState | None:
        return self._states.get(client)

    def put(self, client: int, state: ClientState) -> None:
        self._states[client] = state

    def clients(self) -> Iterator[int]:
        return iter(sorted(self._states))

    def save(self, folder: Folder | Path) -> None:
        """One safetensors file with ``<client>/<name>`` keys."""
        as_folder(folder).write_bytes(self.FILE, encode_states({c: self._states[c] for c in self.clients()}))

    def load(self, folder: Folder | Path) -> None:
        self._states = decode_states(as_folder(folder).read_bytes(self.FILE))


def encode_states(states: Mapping[int, ClientState]) -> bytes:
    """Several clients' states as one codec message with ``<client>/<name>`` keys (checkpoints, and
    the wire between Ray actors: no pickle)."""
    arrays = {
        f"{client}/{name}": tensor.detach().cpu().numpy()
        for client, state in states.items()
        for name, tensor in state.items()
    }
    return encode(Message(arrays=arrays))


def decode_states(data: bytes) -> dict[int, ClientState]:
    states: dict[int, ClientState] = {}
    for key, tensor in decode(data).tensors().items():
        client, name = key.split("/", 1)
        states.setdefault(int(client), {})[name] = tensor
    return states
