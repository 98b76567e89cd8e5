"""The server chain applied to a round's arrivals, for algorithms whose uplink carries a model delta.

The algorithm names the arrays that form the delta (``Algorithm.delta_prefix``: FedAvg and
FedProx all of them, SCAFFOLD ``dy/``). Each arrival's delta is flattened into a row; the chain
(clip -> aggregate -> noise) reduces the rows to one; the result goes back to the algorithm as a
single arrival carrying that delta, weight the total weight, and every other array (SCAFFOLD's
dc) as the weighted mean of the arrivals'. So the algorithm's own ``accumulate``/``aggregate``
apply it unchanged: for FedAvg the mean delta becomes exactly the chain's output.

Rules that need every update (all but the plain mean) make the executors send per-client
updates to the server instead of per-worker partial sums (engine/pipeline.py ``per_client``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from taciturn.algorithms.base import Algorithm, ArraySpec, Arrival
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams
from taciturn.server.centered_clip import CenteredClip
from taciturn.server.clipping import AdaptiveClip, NormBound
from taciturn.server.config import AggregationConfig
from taciturn.server.coordinatewise import Mean, Median, TrimmedMean
from taciturn.server.krum import Krum
from taciturn.server.transform import Chain, Info, ServerTransform, State, Updates


@dataclass
class ChainState:
    """The chain's state as a checkpoint keeps it."""

    tensors: dict[str, torch.Tensor]


def build_chain(config: AggregationConfig, extra: Sequence[ServerTransform] = ()) -> Chain:
    pieces: list[ServerTransform] = []
    if config.clip_norm is not None:
        pieces.append(
            AdaptiveClip(config.clip_norm, config.target_quantile, config.clip_lr)
            if config.adaptive
            else NormBound(config.clip_norm)
        )
    rules = {
        "mean": lambda: Mean(),
        "median": lambda: Median(),
        "trimmed_mean": lambda: TrimmedMean(config.trim),
        "krum": lambda: Krum(config.byzantine),
        "multi_krum": lambda: Krum(config.byzantine, config.select),
        "centered_clip": lambda: CenteredClip(config.tau, config.iterations),
    }
    pieces.append(rules[config.kind]())
    return Chain([*pieces, *extra])


class ServerAggregation:
    """The chain and its state (checkpointed with the run through ``state``)."""

    def __init__(self, chain: Chain, algorithm: Algorithm, streams: Streams):
        if algorithm.delta_prefix is None:
            raise ValueError(
                f"{algorithm.name}'s uplink is not a model delta: robust aggregation, server clipping and "
                "DP apply to fedavg, fedprox and scaffold"
            )
        self.chain = chain
        self.prefix = algorithm.delta_prefix
        self.streams = streams
        self.state: State | None = None

    def checkpoint_extras(self) -> dict[str, ChainState]:
        return {} if self.state is None else {"server_chain": ChainState(self.state)}

    def restore(self, saved: ChainState | None) -> None:
        self.state = None if saved is None else saved.tensors

    def apply(
        self, round: int, arrivals: Sequence[Arrival], spec: Mapping[str, ArraySpec]
    ) -> tuple[list[Arrival], State | None, Info]:
        """The one arrival standing for the round's updates, the chain's new state and its info.
        A round without updates releases nothing, unless the chain must release every round (DP
        noise: McMahan et al. 2018, Alg. 1 adds it whoever was sampled)."""
        if not arrivals and not self.chain.releases_without_input:
            return [], self.state, {}
        # In client order, whatever the executor: rules that break ties by position (Krum's two
        # mutual nearest neighbours score alike) then pick the same update.
        arrivals = sorted(arrivals, key=lambda a: a.client)
        names = sorted(n for n in spec if n.startswith(self.prefix))
        size = sum(int(np.prod(spec[n].shape)) for n in names)
        flat = [
            torch.cat([torch.from_numpy(a.message.arrays[n]).reshape(-1) for n in names]) for a in arrivals
        ]
        rows = torch.stack(flat) if flat else torch.zeros(0, size)
        weights = torch.tensor([float(a.message.meta["num_samples"]) for a in arrivals], dtype=torch.float64)
        state = self.state if self.state is not None else self.chain.init(rows.shape[1])
        out, state, info = self.chain.update(
            Updates(rows, weights), state, self.streams.torch(round, SERVER, "server-chain")
        )
        return [self._arrival(arrivals, spec, names, out.rows[0], weights)], state, info

    def _arrival(self, arrivals, spec, names, row: torch.Tensor, weights: torch.Tensor) -> Arrival:
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for n in names:
            size = int(np.prod(spec[n].shape))
            arrays[n] = row[offset : offset + size].reshape(spec[n].shape).numpy().astype(spec[n].dtype)
            offset += size
        w = (weights / weights.sum()).numpy() if arrivals else None
        for n in spec:
            if n.startswith(self.prefix):
                continue
            if w is None:  # a bare release (DP noise in a round nobody sent in): no mean to take
                arrays[n] = np.zeros(spec[n].shape, spec[n].dtype)
            else:  # the weighted mean
                stacked = np.stack([a.message.arrays[n].astype(np.float64) for a in arrivals])
                arrays[n] = np.tensordot(w, stacked, axes=1).astype(spec[n].dtype)
        total = sum(int(a.message.meta["num_samples"]) for a in arrivals) or 1  # weight 1 for a bare release
        return Arrival(SERVER, Message(arrays, {"num_samples": total}))
