"""FedADMM as the event-based ADMM authors' public code runs it (their `FedADMM` agent and
`InexactADMM` server; research/event_admm.md, Sec. 4), which matches the FedADMM of Wang, Marella
and Anderson (CDC 2022, arXiv 2203.15104) and of Gong, Li and Freris (ICDE 2022) with server step 1.

Each round the server samples C N agents and sends them z = (1/N) sum_i s_i, an average over all
N agents with stale copies s_i = x_i + u_i for the agents that did not take part. A sampled agent
updates its dual u_i <- u_i + x_i - z, warm-starts x <- z, trains on
f_i(x) + (rho / 2) ||x - z + u_i||^2 and returns x_i + u_i.

That is event-based ADMM with random participation in place of both triggers, one rho for every
agent and a fresh optimizer each round (unless local.optimizer_state = "keep"), so it reuses
event_admm.py's math. Deviations from the code: the MNIST script trains with Adam (lr 1e-3)
because its MLP lacks `.network`; we use the configured optimizer (SGD by default) like every other
method. Its evaluated z lags one round; we evaluate the z the
round produced. An agent's first dual step uses x_i = z (it has no earlier model), not the shared
initial model.

Under loss, as event-based ADMM (event_admm.py): a sampled agent's new dual and model take effect
only when the server has accepted its x_i + u_i; a lost or rejected uplink leaves the agent as it
was before the round, so the server's stale copy s_i is always the agent's x_i + u_i.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from taciturn.algorithms.base import AlgorithmConfig
from taciturn.algorithms.event_admm import EventADMM, EventADMMConfig


class FedADMMConfig(AlgorithmConfig):
    name: Literal["fedadmm"] = "fedadmm"
    rho: float = Field(0.01, gt=0, description="ADMM penalty (0.01 in the authors' runs)")
    uplink: Literal["full", "change"] = Field(
        "full", description="full: send x_i + u_i; change: send its change since last sent (compressible)"
    )

    def as_event_admm(self) -> EventADMMConfig:
        return EventADMMConfig(
            fraction=self.fraction,
            local=self.local,
            rho=self.rho,
            per_agent_rho=False,
            delta=0.0,  # every sampled agent sends
            delta_z=0.0,  # every sampled agent receives z
            downlink="broadcast",  # to every sampled agent, every round (Delta_z = 0)
            persistent_momentum=self.local.optimizer_state == "keep",  # fresh by default, as the code
            uplink=self.uplink,
        )


class FedADMM(EventADMM):
    name = "fedadmm"
    Config = FedADMMConfig

    def __init__(self, config: FedADMMConfig):
        super().__init__(config.as_event_admm())
