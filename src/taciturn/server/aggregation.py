"""The server chain applied to a round's arrivals, for algorithms whose uplink is one vector per
client the chain may combine.

The algorithm names the arrays the chain combines (``Algorithm.delta_prefix``), and they must
include every per-client secret it sends (``Algorithm.covers_secrets``: SCAFFOLD's control-variate
update dc with its model delta dy, so DP clips and noises (dy, dc) as one vector, and a robust rule
sees both). Each arrival's arrays are flattened into a row; the chain (clip -> aggregate -> noise)
reduces the rows to one; the result goes back to the algorithm as a single *standing* arrival:
its arrays are the chain's estimate of the round's mean update, ``num_samples`` the total weight
and ``clients`` the number of clients it stands for. So the algorithm's own
``accumulate``/``aggregate`` apply it unchanged: for FedAvg the mean delta becomes exactly the
chain's output; SCAFFOLD adds (sum_S p_i) x mean dc to its control. Under DP the estimate has the
fixed denominator q N (McMahan et al. 2018), and the standing arrival stands for the expected
q N clients and q of the population's weight: nothing about who was sampled reaches the state.

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
    """The chain and its state (checkpointed with the run through ``state``). ``expected``: under
    DP, the expected number of clients a round (q N) that the fixed-denominator release stands for."""

    def __init__(self, chain: Chain, algorithm: Algorithm, streams: Streams, expected: float | None = None):
        if not algorithm.covers_secrets():
            raise ValueError(
                f"{algorithm.name} sends arrays the server chain cannot combine: robust aggregation, "
                "server clipping and DP apply to fedavg, fedprox and scaffold"
            )
        self.chain = chain
        self.algorithm = algorithm
        self.streams = streams
        self.expected = expected
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
        noise: McMahan et al. 2018, Alg. 1 adds it whoever was sampled). Raises
        ``OutsideGuarantee`` when a rule cannot keep its guarantee for this round's updates."""
        if not arrivals and not self.chain.releases_without_input:
            return [], self.state, {}
        names = sorted(spec)
        if uncovered := [n for n in names if not n.startswith(self.algorithm.delta_prefix)]:
            raise ValueError(f"{self.algorithm.name}'s arrays {uncovered} are outside the server chain")
        # In client order, whatever the executor: rules that break ties by position (Krum's two
        # mutual nearest neighbours score alike) then pick the same update.
        arrivals = sorted(arrivals, key=lambda a: a.client)
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
        return [self._standing(spec, names, out.rows[0], weights)], state, info

    def _standing(self, spec, names, row: torch.Tensor, weights: torch.Tensor) -> Arrival:
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for n in names:
            size = int(np.prod(spec[n].shape))
            arrays[n] = row[offset : offset + size].reshape(spec[n].shape).numpy().astype(spec[n].dtype)
            offset += size
        if self.expected is not None:  # DP: the expectation, whoever was sampled
            share = self.expected / self.algorithm.num_clients
            meta = {"num_samples": share * self.algorithm.total_weight, "clients": self.expected}
        else:
            meta = {"num_samples": float(weights.sum()), "clients": len(weights)}
        return Arrival(SERVER, Message(arrays, meta))
