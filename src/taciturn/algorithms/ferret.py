"""Ferret: Shu, Hu, Lin, Zhou, Dai, Low, "Ferret: Federated Full-Parameter Tuning at Scale for
Large Language Models", ICML 2025 (arXiv 2409.06277v3), Algorithm 1 with the block-wise
projection of Eq. (8).

Each round r:
  1. (global aggregation, Alg. 1 line 3-5) a client replays the pooled coordinates of every round
     it has not seen onto its own model, w <- w - eta_g sum_{l,k} gamma_{l,k} v_{l,k}: it catches up
     from its state plus the server's coordinate history, never from a full model;
  2. (local update, line 6-8) T first-order steps from w_{r-1} (the engine's SGD);
  3. (projection, line 9-11) Delta = w_{r-1} - w_r, split into the blocks of ``group_blocks``; block l
     gets K_l bases (K_l proportional to ||Delta_l||, at least 2) and the client sends
     gamma_l = (rho_l K_l)^-1 V_l^T Delta_l: sum_l K_l numbers plus K_l per block.
The server pools the coordinates of the clients (slot by slot: the bases of a round are shared,
so this equals averaging their reconstructions, at a cost that does not grow with the number of
clients) and applies w_r = w_{r-1} - eta_g sum_{l,k} pooled_{l,k} v_{l,k}, eta_g the global
aggregation learning rate of Sec. 6.1.

Where the official code (allen4747/Ferret) differs, this follows the paper:
  * it scales coordinates by d_l / K_l (about 1 / (3 rho_l K_l): a third of the unbiased value) and
    uses slr = 10; here the scale is the paper's 1/(rho_l K_l), so eta_g = slr / 3 reproduces it;
  * it clips every reconstructed piece to norm 10 (not in the paper: not done here);
  * it draws K seeds once for the whole run and lets each block pick K_l of them at random with
    Python's global RNG, reseeding the same seed for every block; here each round has fresh bases,
    one stream per (round, block, slot), and block l uses slots 0..K_l-1 (one seed expanded into
    K_l bases, as the paper says), which is unbiased and lets clients share bases;
  * every simulated client deep-copies the server's model; here clients catch up as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from taciturn.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    ArraySpec,
    Arrival,
    ClientContext,
    ClientOutput,
    LocalTraining,
    TrainResult,
    loss_meta,
    positive_count,
)
from taciturn.algorithms.replay import check_caught_up, held_model, model_state
from taciturn.algorithms.shared_bases import (
    Block,
    SharedBases,
    allocate_bases,
    block_vector,
    group_blocks,
    project,
    reconstruct_into,
)
from taciturn.core.message import Message
from taciturn.core.params import Params, clone, sub


class FerretConfig(AlgorithmConfig):
    name: Literal["ferret"] = "ferret"
    max_bases_per_block: int = Field(
        16, ge=2, description="K: the block with the largest update gets K bases, every block at least 2"
    )
    server_lr: float = Field(1.0, gt=0, description="eta_g, the global aggregation learning rate")
    share_bases: bool = Field(
        True, description="generate each round's bases once for all simulated clients and the server"
    )
    basis_cache_mib: int = Field(1024, ge=0, description="memory cap of the shared bases of two rounds")


@dataclass
class FerretState:
    params: Params  # w_r
    history_counts: torch.Tensor  # int32 (rounds, L): slots pooled per block in rounds 1..r
    history_coords: torch.Tensor  # float32 (rounds, L, K): the pooled coordinates (0 beyond the count)
    synced: torch.Tensor  # int64 (N,): the latest round each client is known to hold


class Ferret(Algorithm):
    name = "ferret"
    Config = FerretConfig
    config: FerretConfig

    def __init__(self, config: FerretConfig):
        super().__init__(config)
        self.initial: Params | None = None
        self.blocks: list[Block] = []
        self._bases: SharedBases | None = None

    @property
    def bases(self) -> SharedBases:
        if self._bases is None:
            assert self.streams is not None, "Ferret needs the run's streams (Federation gives them)"
            cache = self.config.basis_cache_mib * 2**20 if self.config.share_bases else 0
            self._bases = SharedBases(self.streams, cache)
        return self._bases

    # ----- server -----
    def init_server(self, params: Params, num_clients: int) -> FerretState:
        # w_0 is what every client holds before the federation starts (the pretrained model).
        self.initial = clone(params)
        self.blocks = group_blocks(params)
        L, K = len(self.blocks), self.config.max_bases_per_block
        return FerretState(
            clone(params),
            torch.zeros((0, L), dtype=torch.int32),
            torch.zeros((0, L, K), dtype=torch.float32),
            torch.zeros(num_clients, dtype=torch.int64),
        )

    def downlink(self, state: FerretState, round: int, clients: Sequence[int]) -> dict[int, Message]:
        """The pooled coordinates of every round since the last one the client is known to hold."""
        by_start: dict[int, Message] = {}  # clients in the same position share one message
        out = {}
        for client in clients:
            start = int(state.synced[client]) + 1
            if start not in by_start:
                by_start[start] = self._history_message(state, start, round - 1)
            out[client] = by_start[start]
        return out

    def _history_message(self, state: FerretState, first: int, last: int) -> Message:
        counts = state.history_counts[first - 1 : last]
        coords = [
            row[l, : int(k)]
            for row, ks in zip(state.history_coords[first - 1 : last], counts, strict=True)
            for l, k in enumerate(ks)
        ]
        return Message(
            {
                "counts": counts.numpy().astype(np.uint16),
                "coords": (torch.cat(coords) if coords else torch.zeros(0)).numpy(),
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
        L, K = len(self.blocks), self.config.max_bases_per_block
        pooled = torch.zeros(L, K)
        pooled_counts = torch.zeros(L, dtype=torch.int32)
        for arrival in arrivals:  # Alg. 1 line 4: (1/N) sum_i over the clients heard from
            counts = arrival.message.arrays["counts"].astype(np.int64)
            coords = torch.from_numpy(arrival.message.arrays["coords"])
            for l, piece in enumerate(torch.split(coords, counts.tolist())):
                pooled[l, : len(piece)] += piece / len(arrivals)
            pooled_counts = torch.maximum(pooled_counts, torch.from_numpy(counts.astype(np.int32)))
        params = state.params
        if arrivals:
            params = clone(params)
            flat = torch.cat([pooled[l, : int(k)] for l, k in enumerate(pooled_counts)])
            self._apply(params, round, pooled_counts.tolist(), flat)
        synced = state.synced.clone()
        synced[[a.client for a in arrivals]] = round - 1  # an uplink proves the downlink arrived
        return FerretState(
            params,
            torch.cat([state.history_counts, pooled_counts[None]]),
            torch.cat([state.history_coords, pooled[None]]),
            synced,
        )

    def _apply(self, params: Params, round: int, counts: list[int], coords: torch.Tensor) -> None:
        """w <- w - eta_g sum_{l,k} pooled_{l,k} v_{l,k}: the server's step and every catch-up."""
        reconstruct_into(params, self.blocks, counts, coords, self.bases, round, -self.config.server_lr)

    def global_params(self, state: FerretState) -> Params:
        return state.params

    # ----- client -----
    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        if ctx.received is None:  # nothing to catch up from: stay silent this round
            return ClientOutput(uplink=None)
        assert self.initial is not None, "init_server runs before any client"
        held, params = held_model(ctx.state, self.initial)
        first = int(ctx.received.meta["first_round"])
        coords = torch.from_numpy(ctx.received.arrays["coords"])
        offset = 0
        for i, row in enumerate(ctx.received.arrays["counts"].astype(np.int64).tolist()):
            round, size = first + i, sum(row)
            if round > held:  # rounds the client already holds (its last uplink was lost) are skipped
                check_caught_up(ctx.client, held, round)
                self._apply(params, round, row, coords[offset : offset + size])
                held = round
            offset += size
        check_caught_up(ctx.client, held, ctx.round)
        return LocalTraining(params=params, consts={})

    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput:
        delta = sub(work.params, result.params)  # Alg. 1 line 9: Delta = w_{r-1} - w_r (old - new)
        norms = [float(block_vector(delta, b).norm()) for b in self.blocks]
        counts = allocate_bases(norms, self.config.max_bases_per_block)
        coords = project(delta, self.blocks, counts, self.bases, ctx.round)
        uplink = Message(
            {"counts": np.array(counts, np.uint16), "coords": coords.numpy()},
            {"num_samples": ctx.num_samples, **loss_meta(result)},
        )
        return ClientOutput(uplink, model_state(ctx.round - 1, work.params))
