"""The shape of a server-side piece: optax's ``GradientTransformation`` for a round's client updates.

Each piece has ``init() -> state`` and ``update(updates, state, rng) -> (updates, state, info)``;
its state is a flat dict of tensors (checkpointed with the run), ``info`` holds numbers for the
round's metrics. Pieces compose with ``Chain``: per-client pieces (clipping) keep one row per
client; an aggregator reduces the rows to one; a piece after it (DP noise) works on the one row.
Updates are the clients' model deltas flattened into the rows of one matrix, with the weights
the server trusts (engine/trust.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

State = dict[str, torch.Tensor]
Info = dict[str, float]


class OutsideGuarantee(Exception):
    """A rule asked to combine a round's updates outside the conditions its guarantee needs (too few
    updates for the attackers it must tolerate): the round is skipped, with this reason, rather than
    aggregated with a rule that no longer protects it (engine/federation.py)."""


@dataclass(frozen=True)
class Updates:
    rows: torch.Tensor  # (m, d): one flattened update per client (one row once aggregated)
    weights: torch.Tensor  # (m,) float64: each row's averaging weight

    def __post_init__(self) -> None:
        assert self.rows.dim() == 2 and self.weights.shape == (self.rows.shape[0],)


class ServerTransform(ABC):
    releases_without_input: ClassVar[bool] = False  # True: it releases something even with no updates

    @abstractmethod
    def init(self, dim: int) -> State:
        """The piece's initial state for updates of ``dim`` values (empty if it keeps none)."""

    @abstractmethod
    def update(self, updates: Updates, state: State, rng: torch.Generator) -> tuple[Updates, State, Info]: ...


class Aggregator(ServerTransform):
    """A piece that reduces the clients' rows to one row whose weight is their total weight."""

    def init(self, dim: int) -> State:
        return {}

    def update(self, updates: Updates, state: State, rng: torch.Generator) -> tuple[Updates, State, Info]:
        row, state, info = self.reduce(updates, state)
        return Updates(row[None], updates.weights.sum()[None]), state, info

    @abstractmethod
    def reduce(self, updates: Updates, state: State) -> tuple[torch.Tensor, State, Info]: ...


class Chain:
    """Pieces applied in order, each with its slice of the chain's state ("<index>/<name>")."""

    def __init__(self, pieces: Sequence[ServerTransform]):
        self.pieces = list(pieces)
        self.releases_without_input = any(p.releases_without_input for p in self.pieces)

    def init(self, dim: int) -> State:
        return {f"{i}/{k}": v for i, piece in enumerate(self.pieces) for k, v in piece.init(dim).items()}

    def update(self, updates: Updates, state: State, rng: torch.Generator) -> tuple[Updates, State, Info]:
        new_state: State = {}
        info: Info = {}
        for i, piece in enumerate(self.pieces):
            head = f"{i}/"
            mine = {k[len(head) :]: v for k, v in state.items() if k.startswith(head)}
            updates, mine, piece_info = piece.update(updates, mine, rng)
            new_state |= {head + k: v for k, v in mine.items()}
            info |= piece_info
        return updates, new_state, info
