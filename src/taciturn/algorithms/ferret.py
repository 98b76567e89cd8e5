"""Ferret: Shu, Hu, Lin, Zhou, Dai, Low, "Ferret: Federated Full-Parameter Tuning at Scale for
Large Language Models", ICML 2025 (arXiv 2409.06277v3), Algorithm 1 with the block-wise
projection of Eq. (8).

Each round r:
  1. (global aggregation, Alg. 1 line 3-5) a client replays the coordinates of every round it has
     not seen onto its own model, w <- w - eta_g sum gamma v: it catches up from its state plus the
     server's coordinate history, never from a full model;
  2. (local update, line 6-8) T first-order steps from w_{r-1} (the engine's SGD);
  3. (projection, line 9-11) Delta = w_{r-1} - w_r, split into the blocks of ``group_blocks``; block l
     gets K_l bases (K_l proportional to ||Delta_l||, at least 2) and the client sends
     gamma_l = (rho_l K_l)^-1 V_l^T Delta_l: sum_l K_l numbers plus K_l per block.
The server applies w_r = w_{r-1} - eta_g (1/N) sum_i Delta~_i, eta_g the global aggregation
learning rate of Sec. 6.1.

Whose bases (``seeds``):
  * ``per_client``, Alg. 1 as written: client i projects on bases from its own stream, so the N
    reconstruction errors are independent and the error of the average is
    (1/N^2) sum_i e_i, e_i = ||Delta_i||^2 (mu4/rho^2 + d - 2) / K per block (shared_bases.py).
    The server and every catching-up client reconstruct N sets of bases per round, and the
    history holds N sets of coordinates per round.
  * ``shared`` (default): all clients of a round project on the same bases, so the server pools
    the coordinates slot by slot (exact: reconstruction is linear) and reconstructs once, and the
    history holds one set per round: cost and downlink do not grow with N. The price is noise:
    the error of the average is e(mean_i Delta_i), which equals the per-client error when the
    updates are orthogonal with equal norms and is N times it when they are identical (a
    federation whose clients agree is the worst case: 8 identical clients, relative squared
    error 8x; tests/test_ferret.py checks both formulas, docs/benchmarks.md measures both).

Where the official code (allen4747/Ferret) differs, this follows the paper:
  * it scales coordinates by d_l / K_l (about 1 / (3 rho_l K_l): a third of the unbiased value) and
    uses slr = 10; here the scale is the paper's 1/(rho_l K_l), so eta_g = slr / 3 reproduces it;
  * it clips every reconstructed piece to norm 10 (not in the paper: not done here);
  * it draws K seeds once for the whole run and lets each block pick K_l of them at random with
    Python's global RNG, reseeding the same seed for every block; here each round has fresh bases,
    one stream per (round, owner, block, slot), and block l uses slots 0..K_l-1 (one seed expanded
    into K_l bases, as the paper says);
  * its bases are truncated normals; the default here is uniform on the same interval
    (``basis``): E[v v^T] = rho I exactly, the same error to O(1/d), cheaper to generate;
  * every simulated client deep-copies the server's model; here clients catch up as above, from
    the reconstructed rounds the simulation keeps (``replay_cache_mib``) or by regenerating them,
    with bit-identical results.

Under loss (DESIGN.md, "Acceptance"): a client's caught-up model and its round take effect only
when the server has accepted its uplink, the same event that advances the server's record of the
round the client holds (``synced``). So the two always agree and the history sent down starts
right after the round the client holds (replay.py). A lost downlink: the client sits the round
out; a lost or rejected uplink: the client keeps its old model and is sent the same rounds again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from taciturn.algorithms.base import (
    MAX_LR,
    Algorithm,
    AlgorithmConfig,
    ArraySpec,
    Arrival,
    Carries,
    ClientContext,
    ClientOutput,
    LocalTraining,
    TrainResult,
    loss_meta,
    positive_count,
)
from taciturn.algorithms.replay import (
    CaughtUp,
    RoundCache,
    model_state,
    replay_cache_field,
)
from taciturn.algorithms.shared_bases import (
    Bases,
    BasisKind,
    Block,
    Contribution,
    allocate_bases,
    apply_pieces,
    block_vector,
    group_blocks,
)
from taciturn.core.message import Message
from taciturn.core.params import Params, clone, sub
from taciturn.core.rng import SERVER


class FerretConfig(AlgorithmConfig):
    name: Literal["ferret"] = "ferret"
    max_bases_per_block: int = Field(
        16, ge=2, description="K: the block with the largest update gets K bases, every block at least 2"
    )
    server_lr: float = Field(1.0, gt=0, le=MAX_LR, description="eta_g, the global aggregation learning rate")
    basis: BasisKind = Field(
        "uniform",
        description="element distribution of the bases on [-1/sqrt(d), 1/sqrt(d)]: uniform (cheapest) "
        "or truncated_normal (the paper's); both unbiased, same error to O(1/d)",
    )
    seeds: Literal["shared", "per_client"] = Field(
        "shared",
        description="shared: one set of bases per round for all clients (cost independent of N, "
        "up to N times the noise); per_client: each client its own (Alg. 1; N reconstructions a round)",
    )
    replay_cache_mib: int = replay_cache_field()


@dataclass
class FerretState:
    params: Params  # w_r
    # The coordinate history, one row per contribution (one per round with shared bases, one per
    # client and round with per-client ones), in round order:
    history_rounds: torch.Tensor  # int64 (C,): the round of the contribution
    history_owners: torch.Tensor  # int64 (C,): whose bases (SERVER: the round's shared ones)
    history_counts: torch.Tensor  # int32 (C, L): K_l per block
    history_coords: torch.Tensor  # float32 (sum of counts,): the (weighted) coordinates
    synced: torch.Tensor  # int64 (N,): the latest round each client is known to hold


def _by_round(
    rounds: np.ndarray, owners: np.ndarray, counts: np.ndarray, coords: torch.Tensor
) -> dict[int, list[Contribution]]:
    out: dict[int, list[Contribution]] = {}
    offset = 0
    for round, owner, row in zip(rounds.tolist(), owners.tolist(), counts.astype(np.int64), strict=True):
        size = int(row.sum())
        out.setdefault(round, []).append(Contribution(owner, row.tolist(), coords[offset : offset + size]))
        offset += size
    return out


class Ferret(Algorithm):
    name = "ferret"
    Config = FerretConfig
    config: FerretConfig

    def __init__(self, config: FerretConfig):
        super().__init__(config)
        self.initial: Params | None = None
        self.blocks: list[Block] = []
        self._bases: Bases | None = None
        self.cache = RoundCache(config.replay_cache_mib * 2**20)
        self.caught_up = CaughtUp()

    @property
    def bases(self) -> Bases:
        if self._bases is None:
            assert self.streams is not None, "Ferret needs the run's streams (Federation gives them)"
            self._bases = Bases(self.streams, self.config.basis)
        return self._bases

    # ----- server -----
    @classmethod
    def carries(cls, config: AlgorithmConfig) -> tuple[Carries, Carries]:
        return "values", "exact"  # coordinates up; down, the history every client replays exactly

    def init_server(self, params: Params, num_clients: int) -> FerretState:
        # w_0 is what every client holds before the federation starts (the pretrained model).
        self.initial = clone(params)
        self.blocks = group_blocks(params)
        return FerretState(
            clone(params),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros((0, len(self.blocks)), dtype=torch.int32),
            torch.zeros(0, dtype=torch.float32),
            torch.zeros(num_clients, dtype=torch.int64),
        )

    def downlink(self, state: FerretState, round: int, clients: Sequence[int]) -> dict[int, Message]:
        """The coordinates of every round since the last one the client is known to hold."""
        by_start: dict[int, Message] = {}  # clients in the same position share one message
        out = {}
        for client in clients:
            start = int(state.synced[client]) + 1
            if start not in by_start:
                by_start[start] = self._history_message(state, start)
            out[client] = by_start[start]
        return out

    def _history_message(self, state: FerretState, first: int) -> Message:
        row = int(torch.searchsorted(state.history_rounds, first))
        offset = int(state.history_counts[:row].sum())
        return Message(
            {
                "rounds": state.history_rounds[row:].numpy().astype(np.uint32),
                "owners": state.history_owners[row:].numpy().astype(np.int32),
                "counts": state.history_counts[row:].numpy().astype(np.uint16),
                "coords": state.history_coords[offset:].numpy(),
            },
            {"first_round": first},
        )

    def uplink_spec(self, state: FerretState) -> dict[str, ArraySpec]:
        return {
            "counts": ArraySpec((len(self.blocks),), np.dtype(np.uint16)),
            "coords": ArraySpec((None,), np.dtype(np.float32)),
        }

    def check_uplink_meta(self, message: Message) -> str | None:
        counts = message.arrays["counts"].astype(np.int64)
        if (counts < 0).any() or (counts > self.config.max_bases_per_block).any():
            return f"basis counts must lie in [0, {self.config.max_bases_per_block}]"
        if int(counts.sum()) != len(message.arrays["coords"]):
            return f"{len(message.arrays['coords'])} coordinates for {int(counts.sum())} announced slots"
        return positive_count(message, "num_samples")

    def aggregate(self, state: FerretState, round: int, arrivals: Sequence[Arrival]) -> FerretState:
        """Alg. 1 line 4: w_r = w_{r-1} - eta_g (1/N) sum_i Delta~_i over the N clients heard from."""
        arrivals = sorted(arrivals, key=lambda a: a.client)
        uplinks = [
            Contribution(
                a.client,
                a.message.arrays["counts"].astype(np.int64).tolist(),
                torch.from_numpy(a.message.arrays["coords"]) / len(arrivals),
            )
            for a in arrivals
        ]
        if self.config.seeds == "per_client" or not uplinks:
            contributions = uplinks
        else:  # shared bases: pool slot by slot, which equals averaging the reconstructions
            L, K = len(self.blocks), self.config.max_bases_per_block
            pooled = torch.zeros(L, K)
            for uplink in uplinks:
                for l, piece in enumerate(uplink.by_block()):
                    pooled[l, : len(piece)] += piece
            counts = np.max([u.counts for u in uplinks], axis=0).tolist()
            flat = torch.cat([pooled[l, :k] for l, k in enumerate(counts)])
            contributions = [Contribution(SERVER, counts, flat)]
        params = state.params
        if contributions:
            params = clone(params)
            self._apply(params, round, contributions)
        synced = state.synced.clone()
        synced[[a.client for a in arrivals]] = round - 1  # an uplink proves the downlink arrived
        return FerretState(
            params,
            torch.cat([state.history_rounds, torch.full((len(contributions),), round, dtype=torch.int64)]),
            torch.cat(
                [state.history_owners, torch.tensor([c.owner for c in contributions], dtype=torch.int64)]
            ),
            torch.cat(
                [
                    state.history_counts,
                    torch.tensor([list(c.counts) for c in contributions], dtype=torch.int32),
                ]
                if contributions
                else [state.history_counts]
            ),
            torch.cat([state.history_coords, *(c.coords for c in contributions)]),
            synced,
        )

    def _apply(self, params: Params, round: int, contributions: Sequence[Contribution]) -> None:
        """w <- w - eta_g sum_c sum_{l,k} coords_{c,l,k} v_{c,l,k}: the server's step and every catch-up."""
        pieces = self.cache.get(round)
        if pieces is None:
            pieces = self.bases.reconstruct(self.blocks, contributions, round)
            self.cache.put(round, pieces)
        apply_pieces(params, self.blocks, pieces, -self.config.server_lr)

    def global_params(self, state: FerretState) -> Params:
        return state.params

    # ----- client -----
    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        if ctx.received is None:  # nothing to catch up from: stay silent this round
            return ClientOutput(uplink=None)
        assert self.initial is not None, "init_server runs before any client"
        arrays = ctx.received.arrays
        first = int(ctx.received.meta["first_round"])

        def replay(params: Params) -> None:
            history = _by_round(
                arrays["rounds"], arrays["owners"], arrays["counts"], torch.from_numpy(arrays["coords"])
            )
            for round in range(first, ctx.round):
                if round in history:  # a round nobody was heard from changed nothing
                    self._apply(params, round, history[round])

        params = self.caught_up.model(ctx.client, ctx.state, self.initial, first, ctx.round, replay)
        return LocalTraining(params=params, consts={})

    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput:
        delta = sub(work.params, result.params)  # Alg. 1 line 9: Delta = w_{r-1} - w_r (old - new)
        norms = [float(block_vector(delta, b).norm()) for b in self.blocks]
        counts = allocate_bases(norms, self.config.max_bases_per_block)
        owner = SERVER if self.config.seeds == "shared" else ctx.client
        coords = self.bases.project(delta, self.blocks, counts, ctx.round, owner)
        uplink = Message(
            {"counts": np.array(counts, np.uint16), "coords": coords.numpy()},
            {"num_samples": ctx.num_samples, **loss_meta(result)},
        )
        return ClientOutput(uplink, model_state(ctx.round - 1, work.params))
