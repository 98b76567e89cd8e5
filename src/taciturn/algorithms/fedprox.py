"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020, Algorithm 2.

FedAvg whose clients minimise the proximal objective (Eq. 2)
    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2
with w^t the global model they received. mu = 0 is FedAvg exactly. The event-based ADMM paper's
baselines use mu = 0.01 (research/event_admm.md, Sec. 4).

The proximal term is over the weights only: a model's buffers (BatchNorm statistics) are not
optimised, so they are averaged as FedAvg averages them, or kept by each client (FedBN).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from taciturn.algorithms.base import ClientContext, ClientOutput, Consts, LocalTraining, Loss
from taciturn.algorithms.fedavg import FedAvg, FedAvgConfig
from taciturn.core.params import Params, sq_distance


class FedProxConfig(FedAvgConfig):
    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]
    mu: float = Field(0.01, ge=0, description="proximal coefficient (0 = FedAvg)")


class FedProx(FedAvg):
    name = "fedprox"
    Config = FedProxConfig
    config: FedProxConfig

    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        work = super().client_begin(ctx)
        if isinstance(work, LocalTraining):
            work.consts = {"anchor": self.weights(work.params)}  # w^t, held fixed during local steps
        return work

    def objective(self, loss: Loss, params: Params, batch: Any, consts: Consts) -> torch.Tensor:
        # over the anchor's tensors (the weights): sq_distance iterates over its first argument's keys
        return loss(params, batch) + 0.5 * self.config.mu * sq_distance(consts["anchor"], params)
