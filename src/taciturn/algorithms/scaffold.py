"""SCAFFOLD: Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, Algorithm 1.

Server state (x, c); client state c_i (0 at first). Each sampled client receives (x, c), runs
    y <- y - eta_l (g_i(y) - c_i + c)                         (Alg. 1, line 10)
and updates its control variate (line 12) by
    option I:  c_i+ = grad f_i(x)            (a full pass over its data at x)
    option II: c_i+ = c_i - c + (x - y) / (K eta_l).
It sends (dy, dc) = (y - x, c_i+ - c_i); the server sets x <- x + eta_g mean(dy) and
c <- c + sum_{i in S} p_i dc_i (line 17 with p_i = 1/N), which keeps c = sum_i p_i c_i exactly.
The server computes p_i itself (1/N, or n_i / n from the weights it trusts: engine/trust.py); a
client never tells the server how much it counts.

Option II's formula assumes plain SGD steps: with plain SGD, (x - y)/(K eta_l) is exactly the mean
corrected gradient, so c_i+ equals the mean of the raw gradients g_i(y_k) taken along the path.
With momentum beta the same formula overestimates that mean about 1/(1 - beta)-fold and SCAFFOLD
diverges (research/event_admm.md, Sec. 6). We therefore compute option II as the mean gradient
actually taken, which is the paper's quantity for plain SGD and stays right with momentum.
Traps avoided, seen in public code: pfl-research 0.6 adds c - c_i with control variates stored as
negative gradients (wrong sign) and keeps one shared option-I tensor for all clients; the
event-ADMM authors' code scales by eta_l/K instead of 1/(K eta_l).

``option = "event_admm_code"`` reproduces that code on purpose (Er, Trimpe, Muehlebach, ICML 2025,
github.com/guner-dilsad-er/Distributed-Event-Based-ADMM at 8ac538e, admm/agents.py
``Scaffold_Agent.c_i_update`` and admm/servers.py ``DriftServer.spin``), to measure the SCAFFOLD
their comparison ran (research/event_admm.md, Sec. 4); it is not SCAFFOLD. Three things differ:
    c_i+ = c_i - c + (eta_l / K)(x - y), K = local epochs   (the paper: 1/(K eta_l), K local steps;
                                                               about 400x larger in their MNIST setting)
    c <- c + sum_{i in S} (n_i / m_S)(1 / N) dc_i, m_S = sum_{i in S} n_i   (an extra 1/|S|)
    the client keeps dc_i as its c_i (the code subtracts c_i in place after storing it).

The correction enters the local objective as the linear term <y, c - c_i>, whose gradient is
exactly c - c_i, so SCAFFOLD keeps the shared objective shape (and vmaps like the others).
Messages carry two vectors each way, and the ledger counts both.

Under the server chain (robust rules, clipping, central DP) and local DP, (dy, dc) is one vector:
clipped together to S and noised together (one Gaussian mechanism of sensitivity S on the
concatenation, so the accounting is DP-FedAvg's), or robustly combined coordinate by coordinate
(median) or client by client (Krum), so an attacker cannot reach c through dc. The chain returns
the round's mean (dy, dc); x moves by it and c by (sum_S p_i) x mean dc, which is line 17 for the
plain mean (under DP: q x the fixed-denominator mean, q = the sampling rate).

Buffers (BatchNorm running statistics) are no variables of f_i: they have no control variates (c
and c_i cover the weights only) and take no corrected step. The forward passes update them, they
travel up in dy and the server averages them with the weights p_i (a step of 1, whatever eta_g);
or, with local buffers (FedBN), each client keeps its own in its client state and never sends them.

Under loss (DESIGN.md, "Acceptance"): a client's c_i+ takes effect only when the server has
accepted the uplink (dy, dc) that carries it (engine/executor.py, the commit protocol). A lost
downlink means the client sits the round out; a lost or rejected uplink means its round never
happened for either side (c_i stays, c stays). So c = sum_i p_i c_i holds exactly whatever the
channel loses, and the fixed point stays the optimum. Storing c_i+ before delivery breaks the
invariant for good, and at SCAFFOLD's fixed point grad f(x) = -(c - sum_i p_i c_i): a biased model
(tests/test_acceptance.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from taciturn.algorithms.base import (
    MAX_LR,
    Algorithm,
    AlgorithmConfig,
    ArraySpec,
    Arrival,
    Carries,
    ClientContext,
    ClientOutput,
    Consts,
    LocalTraining,
    Loss,
    TrainResult,
    loss_meta,
    positive_count,
    specs_of,
)
from taciturn.algorithms.schedule import Schedule
from taciturn.core.message import Message
from taciturn.core.params import (
    Params,
    add,
    clone,
    dot,
    strip_prefix,
    sub,
    weighted_sum,
    with_prefix,
    zeros_like,
)

FULL_GRADIENT_BATCH = 1000


class ScaffoldConfig(AlgorithmConfig):
    name: Literal["scaffold"] = "scaffold"
    option: Literal["I", "II", "event_admm_code"] = Field(
        "II",
        description="control-variate update (Alg. 1, line 12); event_admm_code: the event-ADMM "
        "authors' public code, variates about 400x too small (a baseline to reproduce, not SCAFFOLD)",
    )
    server_lr: float = Field(1.0, gt=0, le=MAX_LR, description="eta_g")
    server_schedule: Schedule = Field(Schedule(), description="eta_g over rounds (algorithms/schedule.py)")
    weighting: Literal["uniform", "samples"] = Field(
        "samples",
        description="p_i = 1/N (the paper) or n_i/n (FedAvg's sample weights) for both x and c",
    )

    @model_validator(mode="after")
    def _authors_code(self) -> ScaffoldConfig:
        if self.option == "event_admm_code" and (self.local.steps is not None or self.weighting != "samples"):
            raise ValueError(
                "option 'event_admm_code' reproduces code that counts K in local epochs and weights by "
                "samples: set algorithm.local.epochs (not steps) and weighting = 'samples'"
            )
        return self


@dataclass
class ScaffoldState:
    params: Params  # x
    control: Params  # c = sum_i p_i c_i


@dataclass
class ControlSums:
    """sum p_i dy_i, sum p_i dc_i and sum p_i over a group of clients: SCAFFOLD's partial aggregate."""

    dy: Params | None
    dc: Params | None
    weight: float


class Scaffold(Algorithm):
    name = "scaffold"
    Config = ScaffoldConfig
    config: ScaffoldConfig
    supports_buffers = True
    # Both dy and dc are functions of the client's data: the server chain (robust rules, DP) and
    # local DP treat (dy, dc) as one vector, so both are clipped, noised or robustly combined.
    delta_prefix = ""

    @classmethod
    def carries(cls, config: AlgorithmConfig) -> tuple[Carries, Carries]:
        # (dy, dc) up: the server sums dc into c = sum_i p_i c_i (line 17), so dc is an increment; with
        # the memory the sum stays exact up to what the memory holds, which drains at the fixed point
        return "increments", "values"

    def init_server(self, params: Params, num_clients: int) -> ScaffoldState:
        return ScaffoldState(clone(params), zeros_like(self.weights(params)))

    def downlink(self, state: ScaffoldState, round: int, clients: Sequence[int]) -> dict[int, Message]:
        both = Message.from_tensors({**with_prefix("x", state.params), **with_prefix("c", state.control)})
        return dict.fromkeys(clients, both)

    def uplink_spec(self, state: ScaffoldState) -> dict[str, ArraySpec]:
        return {
            **with_prefix("dy", specs_of(self.sent(state.params))),
            **with_prefix("dc", specs_of(state.control)),
        }

    def check_uplink_meta(self, message: Message) -> str | None:
        return positive_count(message, "num_samples")

    # ----- client -----
    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        if ctx.received is None:
            return ClientOutput(uplink=None)
        x, c = ctx.received.tensors("x/"), ctx.received.tensors("c/")
        c_i = strip_prefix("c", ctx.state) if ctx.state else zeros_like(c)
        if self.local_buffers and ctx.state:  # FedBN: the client's own statistics
            x |= strip_prefix("buffers", ctx.state)
        return LocalTraining(
            params=x,
            consts={"correction": sub(c, c_i), "c_i": c_i},
            track_gradient=self.config.option == "II",
        )

    def objective(self, loss: Loss, params: Params, batch: Any, consts: Consts) -> torch.Tensor:
        # d/dy <y, c - c_i> = c - c_i: the corrected step of Alg. 1, line 10 (weights only).
        # dot iterates over its first argument's keys: the correction's, the weights
        return loss(params, batch) + dot(consts["correction"], params)

    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput:
        x, c_i = work.params, work.consts["c_i"]
        if self.config.option == "I":
            c_new = full_gradient(ctx, x, self.buffers)
        elif self.config.option == "event_admm_code":  # c_i - c + (eta_l / K)(x - y), on the weights
            c = add(work.consts["correction"], c_i)
            scale = self.config.local.lr / self.config.local.epochs
            c_new = add(sub(c_i, c), sub(self.weights(x), result.params), scale)
        else:  # mean raw gradient = mean objective gradient minus the constant correction
            assert result.mean_gradient is not None
            c_new = sub(result.mean_gradient, work.consts["correction"])
        dc = sub(c_new, c_i)
        uplink = Message.from_tensors(
            {**with_prefix("dy", self.sent(sub(result.params, x))), **with_prefix("dc", dc)},
            num_samples=ctx.num_samples,
            **loss_meta(result),
        )
        own = {n: result.params[n] for n in self.local_buffers}
        kept = dc if self.config.option == "event_admm_code" else c_new  # the code's aliasing
        return ClientOutput(uplink, state=with_prefix("c", kept) | with_prefix("buffers", own))

    def _weight(self, arrival: Arrival) -> float:
        """p_i from the server's own figures (num_samples was replaced by the trusted weight). The
        server chain's one standing arrival (server/aggregation.py) carries the mean of the clients
        it stands for: its weight is theirs together, sum_S p_i (``clients`` of them)."""
        if self.config.weighting == "uniform":
            return arrival.message.meta.get("clients", 1) / self.num_clients
        return arrival.message.meta["num_samples"] / self.total_weight

    # ----- server -----
    def accumulate(self, arrivals: Sequence[Arrival]) -> ControlSums:
        weights = [self._weight(a) for a in arrivals]
        pairs = list(zip(weights, arrivals, strict=True))
        return ControlSums(
            weighted_sum((w, a.message.tensors("dy/")) for w, a in pairs),
            weighted_sum((w, a.message.tensors("dc/")) for w, a in pairs),
            float(sum(weights)),
        )

    def combine(self, partials: Sequence[ControlSums]) -> ControlSums:
        present = [p for p in partials if p.dy is not None]
        return ControlSums(
            weighted_sum((1.0, p.dy) for p in present),
            weighted_sum((1.0, p.dc) for p in present),
            sum(p.weight for p in present),
        )

    def aggregate(self, state: ScaffoldState, round: int, accumulated: ControlSums) -> ScaffoldState:
        if accumulated.dy is None:
            return state
        dx = {k: v / accumulated.weight for k, v in accumulated.dy.items()}  # weighted mean of dy
        lr = self.config.server_lr * self.config.server_schedule.factor(round - 1)
        x = state.params | self.server_step(state.params, dx, lr)
        dc_scale = 1.0  # sum_S (n_i / n) dc_i, or the code's sum_S (n_i / m_S)(1 / N) dc_i
        if self.config.option == "event_admm_code":
            dc_scale = 1.0 / (accumulated.weight * self.num_clients)
        return ScaffoldState(x, add(state.control, accumulated.dc, dc_scale))

    def global_params(self, state: ScaffoldState) -> Params:
        return state.params


@torch.no_grad()
def full_gradient(ctx: ClientContext, params: Params, buffers: frozenset[str] = frozenset()) -> Params:
    """grad f_i(params): the mean loss gradient over all of the client's data (option I), for every
    tensor but the ``buffers`` (whose copies the forward passes update and are then dropped)."""
    indices = ctx.data.client_indices(ctx.client)
    total = zeros_like({k: v for k, v in params.items() if k not in buffers})
    for start in range(0, len(indices), FULL_GRADIENT_BATCH):
        part = indices[start : start + FULL_GRADIENT_BATCH]
        with torch.enable_grad():
            live = {k: v.detach().requires_grad_(True) for k, v in params.items() if k not in buffers}
            fixed = {k: v.detach().clone() for k, v in params.items() if k in buffers}
            value = ctx.loss(live | fixed, ctx.data.batch(part))
            grads = torch.autograd.grad(value, list(live.values()))
        for (name, _), g in zip(live.items(), grads, strict=True):
            total[name].add_(g, alpha=len(part) / len(indices))
    return total
