"""Client-state store: where persistent per-client state lives between rounds.

SCAFFOLD control variates, ADMM duals, trigger memory and momentum buffers are named tensors
per client. The store is an interface so that a disk-backed store can hold 10,000+ stateful
clients with bounded memory; the in-memory store is the default. Checkpoints go through the
codec (safetensors), never pickle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import torch

from taciturn.core.codec import decode, encode
from taciturn.core.message import Message

ClientState = dict[str, torch.Tensor]


class ClientStateStore(ABC):
    @abstractmethod
    def get(self, client: int) -> ClientState | None:
        """The client's state, or None if it has none yet. Callers must not mutate it in place."""

    @abstractmethod
    def put(self, client: int, state: ClientState) -> None: ...

    @abstractmethod
    def clients(self) -> Iterator[int]:
        """Ids of clients with stored state."""

    def save(self, path: Path) -> None:
        """Write every client's state into one safetensors file (``<client>/<name>`` keys)."""
        arrays = {}
        for client in self.clients():
            state = self.get(client)
            assert state is not None
            for name, tensor in state.items():
                arrays[f"{client}/{name}"] = tensor.detach().cpu().numpy()
        path.write_bytes(encode(Message(arrays=arrays)))

    def load(self, path: Path) -> None:
        states: dict[int, ClientState] = {}
        for key, tensor in decode(path.read_bytes()).tensors().items():
            client, name = key.split("/", 1)
            states.setdefault(int(client), {})[name] = tensor
        for client, state in states.items():
            self.put(client, state)


class MemoryStateStore(ClientStateStore):
    def __init__(self) -> None:
        self._states: dict[int, ClientState] = {}

    def get(self, client: int) -> ClientState | None:
        return self._states.get(client)

    def put(self, client: int, state: ClientState) -> None:
        self._states[client] = state

    def clients(self) -> Iterator[int]:
        return iter(sorted(self._states))
