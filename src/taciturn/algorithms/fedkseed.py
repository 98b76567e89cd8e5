"""FedKSeed: Qin, Chen, Yao, Chen, Li, Wang, Li, "Federated Full-Parameter Tuning of Billion-Sized
Language Models with Communication Cost under 18 Kilobytes", ICML 2024, Algorithm 1.

K candidate seeds are fixed for the run; seed k expands into a full-model direction z_k ~ N(0, I).
A client's local step (Alg. 1 line 9-12, zeroth-order, MeZO-style in place) picks k uniformly,
evaluates the loss at w + eps z_k and w - eps z_k, forms the scalar g = (l+ - l-) / (2 eps) and
steps w <- w - eta g z_k. It uploads only the scalars, summed per seed. The server averages them
into per-round scalars G_k, and w_r = w_{r-1} - eta sum_k G_k z_k (line 14-17); clients that
missed rounds replay those scalars onto the model they hold (line 5-7), never downloading a model.

Differences from the official code (zhenqincn/FedKSeed): it rebuilds the server model from w_0
and the never-reset scalar pool each round, which equals the per-round updates here in exact
arithmetic; its weight decay (off the biases and norms) is not part of Alg. 1 and is left out;
FedKSeed-Pro's non-uniform seed probabilities are not implemented.

Under loss, as Ferret (ferret.py, replay.py): a client's replayed model and its round take effect
only when the server has accepted its scalars, the event that advances the server's ``synced``;
a lost or rejected uplink leaves the client on its old model, to be sent the same rounds again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from taciturn.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    ArraySpec,
    Arrival,
    Carries,
    ClientContext,
    ClientOutput,
    LocalTraining,
    TrainResult,
    positive_count,
)
from taciturn.algorithms.replay import (
    CaughtUp,
    RoundCache,
    check_caught_up,
    model_state,
    replay_cache_field,
)
from taciturn.core.message import Message
from taciturn.core.params import Params, clone, zeros_like
from taciturn.core.rng import SERVER, Streams


class FedKSeedConfig(AlgorithmConfig):
    name: Literal["fedkseed"] = "fedkseed"
    seeds: int = Field(1024, ge=1, description="K, the candidate seeds shared by all clients for the run")
    epsilon: float = Field(5e-4, gt=0, description="perturbation scale of the two-point estimate")
    replay_cache_mib: int = replay_cache_field()

    @model_validator(mode="after")
    def _plain_steps(self) -> FedKSeedConfig:
        local = self.local
        plain = local.optimizer == "sgd" and local.precision == "fp32" and local.optimizer_state == "reset"
        schedules = local.schedule.constant and local.round_schedule.constant
        if local.momentum or local.weight_decay or local.clip_norm is not None or not plain or not schedules:
            raise ValueError(
                "FedKSeed takes plain zeroth-order steps w <- w - lr g z at one learning rate: remove "
                "algorithm.local.momentum, weight_decay, clip_norm, optimizer, optimizer_state, precision "
                "and the schedules"
            )
        return self


def perturb(params: Params, streams: Streams, seed: int, scale: float) -> None:
    """w <- w + scale z_seed in place, regenerating z tensor by tensor (never the whole of it)."""
    generator = streams.torch(0, SERVER, f"fedkseed-seed/{seed}")
    for p in params.values():
        p.add_(torch.randn(p.shape, generator=generator), alpha=scale)


@dataclass
class FedKSeedState:
    params: Params  # w_r
    history: torch.Tensor  # float32 (rounds, K): the averaged scalar gradient of every seed, per round
    synced: torch.Tensor  # int64 (N,): the latest round each client is known to hold


class FedKSeed(Algorithm):
    name = "fedkseed"
    Config = FedKSeedConfig
    config: FedKSeedConfig

    def __init__(self, config: FedKSeedConfig):
        super().__init__(config)
        self.initial: Params | None = None
        self.cache = RoundCache(config.replay_cache_mib * 2**20)
        self.caught_up = CaughtUp()

    def _step(self, params: Params, round: int, seeds: np.ndarray, grads: np.ndarray) -> None:
        """w <- w - eta sum_k G_k z_k (Alg. 1 line 14-17; line 5-7 replays it): the server's step
        and every replay. The step is summed from zero, seeds in ascending order, then added, so
        the server and a replaying client add the same tensor: kept per round in a simulation,
        a replay is one add per missed round, bit-identical to regenerating the directions."""
        assert self.streams is not None
        step = self.cache.get(round)
        if step is None:
            total = zeros_like(params)
            for seed, g in zip(seeds.tolist(), grads.tolist(), strict=True):
                perturb(total, self.streams, seed, -self.config.local.lr * g)
            step = list(total.values())
            self.cache.put(round, step)
        for p, s in zip(params.values(), step, strict=True):
            p.add_(s)

    # ----- server -----
    @classmethod
    def carries(cls, config: AlgorithmConfig) -> tuple[Carries, Carries]:
        return "values", "exact"  # projected gradients up; down, the history every client replays exactly

    def init_server(self, params: Params, num_clients: int) -> FedKSeedState:
        self.initial = clone(params)
        return FedKSeedState(
            clone(params),
            torch.zeros((0, self.config.seeds)),
            torch.zeros(num_clients, dtype=torch.int64),
        )

    def downlink(self, state: FedKSeedState, round: int, clients: Sequence[int]) -> dict[int, Message]:
        """The nonzero per-round scalars of every round since the last one the client holds."""
        by_start: dict[int, Message] = {}
        out = {}
        for client in clients:
            first = int(state.synced[client]) + 1
            if first not in by_start:
                rows = state.history[first - 1 : round - 1]
                mask = rows != 0
                by_start[first] = Message(
                    {
                        "counts": mask.sum(dim=1).numpy().astype(np.int32),
                        "seeds": mask.nonzero()[:, 1].numpy().astype(np.int32),
                        "grads": rows[mask].numpy(),
                    },
                    {"first_round": first},
                )
            out[client] = by_start[first]
        return out

    def uplink_spec(self, state: FedKSeedState) -> dict[str, ArraySpec]:
        return {
            "seeds": ArraySpec((None,), np.dtype(np.int32)),
            "grads": ArraySpec((None,), np.dtype(np.float32)),
        }

    def check_uplink_meta(self, message: Message) -> str | None:
        seeds, grads = message.arrays["seeds"], message.arrays["grads"]
        if len(seeds) != len(grads):
            return f"{len(seeds)} seeds but {len(grads)} scalar gradients"
        if len(seeds) and (
            seeds.min() < 0 or seeds.max() >= self.config.seeds or (np.diff(seeds) <= 0).any()
        ):
            return f"seeds must be distinct, ascending and in [0, {self.config.seeds})"
        return positive_count(message, "num_samples")

    def aggregate(self, state: FedKSeedState, round: int, arrivals: Sequence[Arrival]) -> FedKSeedState:
        pooled = torch.zeros(self.config.seeds)
        for arrival in arrivals:  # equal weights, as in the experiments' script (--equal_weight)
            seeds = torch.from_numpy(arrival.message.arrays["seeds"].astype(np.int64))
            pooled[seeds] += torch.from_numpy(arrival.message.arrays["grads"]) / len(arrivals)
        params = state.params
        if arrivals:
            params = clone(params)
            nonzero = pooled.nonzero()[:, 0]
            self._step(params, round, nonzero.numpy(), pooled[nonzero].numpy())
        synced = state.synced.clone()
        synced[[a.client for a in arrivals]] = round - 1
        return FedKSeedState(params, torch.cat([state.history, pooled[None]]), synced)

    def global_params(self, state: FedKSeedState) -> Params:
        return state.params

    # ----- client -----
    def client_begin(self, ctx: ClientContext) -> ClientOutput:
        if ctx.received is None:
            return ClientOutput(uplink=None)
        assert self.initial is not None and self.streams is not None
        first = int(ctx.received.meta["first_round"])
        seeds, grads = ctx.received.arrays["seeds"], ctx.received.arrays["grads"]
        counts = ctx.received.arrays["counts"].tolist()
        check_caught_up(ctx.client, first - 1 + len(counts), ctx.round)

        def replay(params: Params) -> None:
            offset = 0
            for round, count in enumerate(counts, start=first):
                self._step(params, round, seeds[offset : offset + count], grads[offset : offset + count])
                offset += count

        start = self.caught_up.model(ctx.client, ctx.state, self.initial, first, ctx.round, replay)
        params = clone(start)  # the zeroth-order steps change it in place; the client keeps start
        uplink = self._local_steps(ctx, params)
        return ClientOutput(uplink, model_state(ctx.round - 1, start))

    @torch.no_grad()
    def _local_steps(self, ctx: ClientContext, params: Params) -> Message:
        """Alg. 1 line 9-12: two-point zeroth-order steps along seeded directions, in place."""
        assert self.streams is not None
        eps, lr = self.config.epsilon, self.config.local.lr
        pick = ctx.streams.numpy(ctx.round, ctx.client, "fedkseed-pick")
        scalars = np.zeros(self.config.seeds, np.float64)
        losses = []
        for batch in ctx.batches(self.config.local):
            k = int(pick.integers(self.config.seeds))
            perturb(params, self.streams, k, eps)
            plus = float(ctx.loss(params, batch))
            perturb(params, self.streams, k, -2 * eps)
            minus = float(ctx.loss(params, batch))
            g = (plus - minus) / (2 * eps)
            perturb(params, self.streams, k, eps - lr * g)  # back to w, then the step -lr g z_k
            scalars[k] += g
            losses.append((plus + minus) / 2)
        used = np.flatnonzero(scalars)
        meta: dict = {"num_samples": ctx.num_samples}
        if losses and np.isfinite(losses).all():
            meta["train_loss"] = float(np.mean(losses))
        return Message({"seeds": used.astype(np.int32), "grads": scalars[used].astype(np.float32)}, meta)

    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput:
        raise AssertionError("FedKSeed clients train in client_begin (zeroth-order steps)")
