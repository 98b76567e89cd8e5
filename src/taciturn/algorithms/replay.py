"""The client-held model of shared-randomness methods (Ferret, FedKSeed).

Their clients never download a model: each keeps its own copy and the round it corresponds to,
and catches up by replaying the server's per-round history (coordinates or scalar gradients)
onto it. Before its first round a client holds w_0, the model every client starts with (the
pretrained weights, or weights every client regenerates from the run seed).

Under loss: a client's new copy is committed only when the server has accepted its uplink
(engine/executor.py), and the server advances its record of the round the client holds for the same
uplinks, so the two always agree; the history sent down starts right after the round the client holds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import Field

from taciturn.core.params import Params, clone
from taciturn.core.state_store import ClientState

_PARAMS = "params/"


def replay_cache_field():
    """The config field both methods share: how much memory a simulation may keep rounds in."""
    return Field(
        1024,
        ge=0,
        description="memory cap (MiB per process) of the rounds' steps kept for simulated catch-up; "
        "a model-sized step per round, so 0 regenerates every catch-up (same numbers, bit for bit)",
    )


def held_round(state: ClientState | None) -> int:
    """The round whose global model the client holds (0: w_0, before its first round)."""
    return 0 if state is None else int(state["synced_round"])


def held_model(state: ClientState | None, initial: Params) -> Params:
    """A copy of the model the client holds, which it may change."""
    if state is None:
        return clone(initial)
    return {name[len(_PARAMS) :]: t.clone() for name, t in state.items() if name.startswith(_PARAMS)}


class CaughtUp:
    """The model w_{r-1} that the clients of round r catch up to, computed once per round in a process.

    Catching up is deterministic: whatever round a client held, replaying the history ends on
    w_{r-1} bit for bit (tests check it against the server's model). So in a simulation the first
    client of a round replays, and the others of that round take the same tensors, read-only: a
    round costs one catch-up, and the clients' states point at one copy per round instead of one
    per client (538 MB a client on SmolLM2-135M, whose growing footprint slowed the same local
    steps by about a third over three rounds: docs/benchmarks.md). Each client still receives
    and is charged for its own history, and is still checked against it.
    """

    def __init__(self):
        self._round, self._params = -1, None

    def model(
        self,
        client: int,
        state: ClientState | None,
        initial: Params,
        first: int,
        round: int,
        replay: Callable[[Params], None],
    ) -> Params:
        """w_{round-1} for ``client``, whose history starts at ``first``; ``replay(params)`` applies
        the rounds first..round-1 in place to a copy of the held model. Never change the result."""
        check_caught_up(client, held_round(state), first)
        if self._round != round - 1:
            params = held_model(state, initial)
            replay(params)
            self._round, self._params = round - 1, params
        assert self._params is not None
        return self._params


def model_state(round: int, params: Params) -> ClientState:
    """The client state that says: this client holds ``params``, the global model of ``round``."""
    return {"synced_round": torch.tensor(round), **{_PARAMS + name: t for name, t in params.items()}}


def check_caught_up(client: int, held: int, round: int) -> None:
    """The step of ``round`` must start from the model of round - 1: before replaying the history
    (which starts at ``round``) and after it (the round to train)."""
    if held != round - 1:
        raise ValueError(
            f"client {client} holds the model of round {held}, but round {round} starts from round "
            f"{round - 1}: the server's history and the client's copy disagree"
        )


class RoundCache:
    """Each round's step (a list of model-sized tensors) kept in a simulation, within ``max_bytes``.

    The server computes round r's step once (Ferret: the reconstructed pieces; FedKSeed: the sum of
    its seeded directions); a simulated client catching up on r then adds the same tensors instead
    of regenerating them, one add per missed round, bit-identical to regenerating (they are the
    very tensors regeneration computes, and both paths add them the same way). The oldest rounds go
    first when the cap is reached: those are needed only by clients that missed the most rounds.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._rounds: dict[int, list[torch.Tensor]] = {}
        self.hits = 0  # catch-ups served from the cache (for benchmarks and tests)

    def get(self, round: int) -> list[torch.Tensor] | None:
        pieces = self._rounds.get(round)
        self.hits += pieces is not None
        return pieces

    def put(self, round: int, pieces: list[torch.Tensor]) -> None:
        self._rounds[round] = pieces
        while self._rounds and self._bytes() > self.max_bytes:
            del self._rounds[min(self._rounds)]

    def _bytes(self) -> int:
        return sum(p.nbytes for pieces in self._rounds.values() for p in pieces)
