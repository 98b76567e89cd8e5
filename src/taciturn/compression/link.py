"""Compression on the two links of a round, as the client pipeline and the server use it.

* ``Uplink``: a client encodes its update after everything else the client side does to it (local
  DP's clip and noise come first, so compression is post-processing of the private release), the
  channel carries the compressed message (the ledger counts it), and the server rebuilds it and
  checks it against the uplink spec before anything else looks at it. Error-feedback memory (or
  EF21's reference) is client state, kept under the names ``~up/<array>`` beside the algorithm's
  own state, staged with it and stored only when the server accepts the update (engine/pipeline.py);
  EF21's server copy advances then too (``settle`` with the accepted clients).
* ``Downlink``: the server encodes what it sends, once per distinct message (a broadcast stays one
  encoding), or, with a reference, once per client: the compressed change from the copy the server
  knows that client holds. The client rebuilds it; its copy is client state ``~down/<array>``. The
  two copies move together: the server advances client i's copy only for a client that received the
  message and whose new state took effect (it stayed silent, so its state was stored at once, or the
  server accepted its update), which is exactly when the client's stored copy advances.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from taciturn.algorithms.base import ArraySpec
from taciturn.compression.chain import CompressionError, Expected, LinkTransform, Reference, State
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams
from taciturn.core.state_store import ClientState

UP, DOWN = "~up/", "~down/"  # client-state names of each link's memory


def split_links(state: ClientState | None) -> tuple[ClientState | None, ClientState]:
    """(the algorithm's part or None, the links' part) of a stored client state."""
    if state is None or not any(k.startswith("~") for k in state):
        return state, {}
    links = {k: v for k, v in state.items() if k.startswith("~")}
    own = {k: v for k, v in state.items() if not k.startswith("~")}
    return own or None, links


def _from_state(links: ClientState, head: str) -> State:
    return {k[len(head) :]: v.detach().cpu().numpy() for k, v in links.items() if k.startswith(head)}


def _to_state(state: State, head: str) -> ClientState:
    return {head + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


@dataclass
class ReferenceCopies:
    """The server's copy of each client's reference on one link, as a checkpoint keeps it."""

    tensors: dict[str, torch.Tensor]  # "<client>/<array>" -> flat values


class _Link:
    """One link's compression; with a reference, also the server's copy of each client's reference,
    staged while a round runs and advanced by ``settle``."""

    def __init__(self, transform: LinkTransform, streams: Streams, direction: str):
        self.transform, self.streams, self.direction = transform, streams, direction
        self.copies: dict[int, State] = {}  # the server's copy of each client's reference
        self._staged: dict[int, State] = {}

    @property
    def stateful(self) -> bool:
        """Whether the client keeps state for this link (memory or a reference)."""
        return self.transform.stateful

    @property
    def server_keeps_copies(self) -> bool:
        return isinstance(self.transform, Reference)

    def draws(self, round: int, owner: int):
        def of(name: str):
            return lambda purpose: self.streams.numpy(
                round, owner, f"compress-{self.direction}/{name}/{purpose}"
            )

        return of

    def settle(self, clients: Iterable[int]) -> None:
        """The server's copies of ``clients`` advance with this round's message; the rest stay."""
        for client in clients:
            if client in self._staged:
                self.copies[client] = self._staged[client]
        self._staged = {}

    def checkpoint_extras(self) -> dict[str, ReferenceCopies]:
        if not self.server_keeps_copies:
            return {}
        flat = {f"{c}/{n}": torch.from_numpy(a) for c, held in self.copies.items() for n, a in held.items()}
        return {f"{self.direction}link_copies": ReferenceCopies(flat)}

    def restore(self, saved: ReferenceCopies | None) -> None:
        self.copies = {}
        for key, tensor in (saved.tensors if saved is not None else {}).items():
            client, name = key.split("/", 1)
            self.copies.setdefault(int(client), {})[name] = tensor.cpu().numpy().copy()


class Uplink(_Link):
    def __init__(self, transform: LinkTransform, streams: Streams):
        super().__init__(transform, streams, "up")

    # ----- client -----
    def send(
        self, round: int, client: int, message: Message, links: ClientState
    ) -> tuple[Message, ClientState]:
        """The compressed uplink and the client's links state after it (memory or reference updated)."""
        sent, held = self.transform.encode(message, _from_state(links, UP), self.draws(round, client))
        if not self.stateful:
            return sent, links
        return sent, {k: v for k, v in links.items() if not k.startswith(UP)} | _to_state(held, UP)

    def memory_template(self, spec: Mapping[str, ArraySpec]) -> ClientState:
        """Zero state for every float array of the uplink (one layout for the disk store)."""
        return {
            UP + name: torch.zeros(int(np.prod(s.shape)), dtype=getattr(torch, s.dtype.name))
            for name, s in spec.items()
            if s.dtype.kind == "f" and None not in s.shape
        }

    # ----- server -----
    def receive(self, round: int, client: int, message: Message, spec: Mapping[str, ArraySpec]) -> Message:
        """The update as the client meant it, or a CompressionError saying why it cannot be. With a
        reference (EF21) the server's new copy is staged until the update is accepted (``settle``)."""
        expected: Expected = {name: (s.shape, s.dtype) for name, s in spec.items()}
        held = self.copies.get(client, {})
        rebuilt, new = self.transform.decode(message, held, self.draws(round, client), expected)
        if self.server_keeps_copies:
            self._staged[client] = new
        return rebuilt


class Downlink(_Link):
    def __init__(self, transform: LinkTransform, streams: Streams):
        super().__init__(transform, streams, "down")

    # ----- server -----
    def send(self, round: int, downlink: Mapping[int, Message | None]) -> dict[int, Message | None]:
        """Each message compressed: per client from its reference (EF21-P), else once per distinct
        message (a broadcast stays one object, encoded once)."""
        self._staged = {}
        if self.server_keeps_copies:
            out: dict[int, Message | None] = {}
            for client, message in downlink.items():
                if message is None:
                    out[client] = None
                    continue
                held = self.copies.get(client, {})
                out[client], self._staged[client] = self.transform.encode(
                    message, held, self.draws(round, client)
                )
            return out
        encoded: dict[int, Message] = {}  # id of a message -> its encoding
        for message in downlink.values():
            if message is not None and id(message) not in encoded:
                encoded[id(message)], _ = self.transform.encode(message, {}, self.draws(round, SERVER))
        return {c: None if m is None else encoded[id(m)] for c, m in downlink.items()}

    # ----- client -----
    def receive(
        self, round: int, client: int, message: Message, links: ClientState
    ) -> tuple[Message, ClientState]:
        """What the server sent, rebuilt, and the client's links state after it."""
        owner = client if self.server_keeps_copies else SERVER
        try:
            rebuilt, held = self.transform.decode(
                message, _from_state(links, DOWN), self.draws(round, owner), None
            )
        except CompressionError as error:  # the server's own encoding: a bug, not a hostile peer
            raise RuntimeError(
                f"round {round}: client {client} cannot decode the downlink: {error}"
            ) from None
        if not self.stateful:
            return rebuilt, links
        return rebuilt, {k: v for k, v in links.items() if not k.startswith(DOWN)} | _to_state(held, DOWN)
