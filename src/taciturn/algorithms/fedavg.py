"""FedAvg: McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017, Algorithm 1 (FederatedAveraging).

Each round the server samples m = max(C K, 1) clients, sends them w_t, each runs E epochs of
minibatch SGD from w_t and returns its model; the server sets w_{t+1} = sum_k (n_k / n) w_{t+1}^k.
Clients here send the delta w^k - w_t (same bytes) so that the server can take a step
w_{t+1} = w_t + eta_s * sum_k (n_k / n) (w^k - w_t) with a server learning rate eta_s
(Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 1 with server SGD);
eta_s = 1 is the paper's FedAvg exactly; ``server_schedule`` varies eta_s over rounds.

Buffers (BatchNorm running statistics) travel with the weights and are averaged with the same
weights n_k / n; the server learning rate moves only the weights (Algorithm.server_step).

FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Algorithm 1): with ``use_buffers(..., local=True)`` the BatchNorm
statistics never travel up and are not averaged. Each client keeps its own in its client state (staged,
stored when the server accepts its update) and starts local training from them; a client's first
round starts from the broadcast, i.e. the server's initial statistics, which the server keeps
unchanged. The global model is then evaluated with those initial statistics; FedBN's paper evaluates
each client's model with its own, which the runner reports beside it (experiments/local_eval.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

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
    specs_of,
)
from taciturn.algorithms.schedule import Schedule
from taciturn.core.message import Message
from taciturn.core.params import Params, clone, strip_prefix, weighted_sum, with_prefix


class FedAvgConfig(AlgorithmConfig):
    name: Literal["fedavg"] = "fedavg"
    server_lr: float = Field(
        1.0, gt=0, le=MAX_LR, description="server step on the averaged delta (1 = plain FedAvg)"
    )
    server_schedule: Schedule = Field(Schedule(), description="server_lr over rounds (schedule.py)")


@dataclass
class FedAvgState:
    params: Params


@dataclass
class WeightedDeltas:
    """sum_k n_k (w^k - w_t) and sum_k n_k over a group of clients: FedAvg's partial aggregate."""

    total: Params | None
    weight: float


class FedAvg(Algorithm):
    name = "fedavg"
    Config = FedAvgConfig
    config: FedAvgConfig
    keeps_client_state = False
    supports_buffers = True  # w_{t+1} averages every tensor: BatchNorm statistics sample-weighted too
    delta_prefix = ""

    @classmethod
    def carries(cls, config: AlgorithmConfig) -> tuple[Carries, Carries]:
        return "updates", "values"  # deltas up, the model down

    def init_server(self, params: Params, num_clients: int) -> FedAvgState:
        return FedAvgState(clone(params))

    def downlink(self, state: FedAvgState, round: int, clients: Sequence[int]) -> dict[int, Message]:
        broadcast = Message.from_tensors(state.params)  # one object: the channel encodes it once
        return dict.fromkeys(clients, broadcast)

    def uplink_spec(self, state: FedAvgState) -> dict[str, ArraySpec]:
        return specs_of(self.sent(state.params))

    def check_uplink_meta(self, message: Message) -> str | None:
        return positive_count(message, "num_samples")

    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        if ctx.received is None:  # the broadcast was lost: nothing to train from, stay silent
            return ClientOutput(uplink=None)
        params = ctx.received.tensors()
        if self.local_buffers and ctx.state is not None:  # FedBN: the client's own statistics
            params |= strip_prefix("buffers", ctx.state)
        return LocalTraining(params=params, consts={})

    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput:
        uplink = self.sent(result.change(work.params))
        own = {n: result.params[n] for n in self.local_buffers}
        state = with_prefix("buffers", own) if own else None
        return ClientOutput(
            Message.from_tensors(uplink, num_samples=ctx.num_samples, **loss_meta(result)), state
        )

    def accumulate(self, arrivals: Sequence[Arrival]) -> WeightedDeltas:
        total = weighted_sum((a.message.meta["num_samples"], a.message.tensors()) for a in arrivals)
        return WeightedDeltas(total, float(sum(a.message.meta["num_samples"] for a in arrivals)))

    def combine(self, partials: Sequence[WeightedDeltas]) -> WeightedDeltas:
        present = [p for p in partials if p.total is not None]
        total = weighted_sum((1.0, p.total) for p in present)
        return WeightedDeltas(total, sum(p.weight for p in present))

    def aggregate(self, state: FedAvgState, round: int, accumulated: WeightedDeltas) -> FedAvgState:
        if accumulated.total is None:  # nothing arrived
            return state
        mean_delta = {k: v / accumulated.weight for k, v in accumulated.total.items()}
        lr = self.config.server_lr * self.config.server_schedule.factor(round - 1)
        stepped = self.server_step(state.params, mean_delta, lr)
        return FedAvgState(state.params | stepped)  # FedBN: local buffers were not sent, the server's stay

    def global_params(self, state: FedAvgState) -> Params:
        return state.params

    def client_models(self, state: FedAvgState, arrivals: Sequence[Arrival]) -> list[tuple[float, Params]]:
        # The deltas w^k - w_t: the clients' models relative to the broadcast w_t, weighted n_k.
        return [(float(a.message.meta["num_samples"]), a.message.tensors()) for a in arrivals]
