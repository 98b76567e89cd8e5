"""Event-based distributed learning via ADMM: Er, Trimpe, Muehlebach, "Distributed Event-Based
Learning via ADMM", ICML 2025 (arXiv 2405.10618), Algorithm 1, with the authors' public code
(guner-dilsad-er/Distributed-Event-Based-ADMM) as the reference for what the paper leaves open.

Consensus problem min_x sum_i f_i(x) in scaled form (dual u_i = lambda_i / rho), star network:
    x_i <- argmin_x f_i(x) + (rho_i / 2) ||x - z_i_hat + u_i||^2      (inexact: local SGD)
    x_hat_i = alpha x_i + (1 - alpha) z_i_hat                         (over-relaxation, alpha = 1: plain)
    z <- (1/N) sum_i s_i,  s_i = the server's copy of x_hat_i + u_i
    u_i <- u_i + x_hat_i - z_i_hat                                   (with the newest z the agent holds)
z_i_hat is the z agent i currently holds, which may be stale. Communication is event-triggered:
  * uplink: agent i sends v_i = x_hat_i + u_i only if ||v_i - last_i|| >= Delta_k (full-vector norm);
    two triggers beyond the paper scale that threshold per agent (``trigger``, ``trigger_units``);
  * downlink: the server broadcasts z only if ||z - z_sent|| >= Delta_z,k (full-vector norm; the
    authors' code compares only the last tensor, the output bias, because of a loop bug);
  * randomized variant: when the server stays silent, a random fraction of agents still gets z;
  * Delta_k = Delta * decay^(k-1), a decreasing threshold when decay < 1 (convergence to a
    stationary point needs Delta_k -> 0);
  * every agent warm-starts its x-update from z_i_hat and keeps its optimizer's state (momentum
    buffer, Adam's moments) across rounds (the code creates one optimizer per agent):
    ``persistent_momentum``, which is ``algorithm.local.optimizer_state = "keep"``;
  * rho_i = rho / (N p_i) with p_i = n_i / n, i.e. f_i weighted by N p_i under a common rho, which
    makes the unweighted mean of x_hat_i + u_i the exact z-update.

What travels: full vectors, not increments. The authors' code sends r_i = v_i - last_i and the
server adds it; the bytes are the same (both dense), but under message loss a dropped increment
leaves s_i wrong for good, whereas a dropped full vector leaves s_i merely stale until the next
triggered send. Either way the receiver keeps its stale copy. Every T_r rounds a resynchronisation
round opens with a broadcast of z to every agent and ends with every agent sending v_i, so all
copies agree again (where those messages are delivered).

Under loss (DESIGN.md, "Acceptance"): an agent's new state (x_hat_i, u_i, z_hat_i, last_i and its
momentum) takes effect only when the server has accepted the v_i it sent (engine/executor.py); a
lost or rejected v_i leaves the agent as it was before the round, as if it had not computed. So
the server's copy s_i is always the agent's last_i (= x_hat_i + u_i when Delta = 0), and every
dual step an agent keeps is one the server has seen. An agent the trigger kept silent sent
nothing, so its new state takes effect at once, as in the paper. A lost z leaves the agent on
its stale z_hat. Under such loss the method reaches the consensus optimum, only more slowly
(tests/test_acceptance.py).

Every agent computes in every round (``fraction = 1``); FedADMM (fedadmm.py) is this algorithm with
random participation in place of the triggers.

Buffers (BatchNorm running statistics) are no variables of the consensus problem: x_i, u_i, the
relaxation, the triggers' norms and the downlink trigger cover the weights only. An agent sends its
trained statistics with v_i, the server keeps them in the agent's copy, and z's statistics are the
mean of the copies, as z's weights are of the s_i; or, with local buffers (FedBN), each agent keeps
its own in its state and never sends them, and z keeps the initial ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from taciturn.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    ArraySpec,
    Arrival,
    ClientContext,
    ClientOutput,
    Consts,
    LocalTraining,
    Loss,
    TrainResult,
    loss_meta,
    specs_of,
)
from taciturn.core.message import Message
from taciturn.core.params import Params, add, clone, norm, sq_distance, strip_prefix, sub, with_prefix
from taciturn.core.rng import SERVER


class EventADMMConfig(AlgorithmConfig):
    name: Literal["event_admm"] = "event_admm"
    fraction: float = Field(1.0, gt=0, le=1, description="agents that compute each round (1 = all)")
    rho: float = Field(1.0, gt=0, description="ADMM penalty")
    per_agent_rho: bool = Field(True, description="rho_i = rho / (N p_i); False: rho_i = rho")
    delta: float = Field(0.0, ge=0, description="uplink trigger threshold Delta (0: always send)")
    trigger: Literal["absolute", "relative", "progress"] = Field(
        "absolute",
        description="uplink rule: ||v-last|| >= Delta (paper), >= Delta ||last||, or >= Delta N ||z step||",
    )
    progress_fade: float = Field(
        0.5, ge=0, lt=1, description="progress trigger: remembered z step shrinks by this per silent round"
    )
    delta_z: float | None = Field(
        None, ge=0, description="downlink threshold (default Delta / 100, as the code)"
    )
    delta_decay: float = Field(1.0, gt=0, le=1, description="Delta_k = Delta * decay^(k-1)")
    lucky_fraction: float = Field(
        0.0, ge=0, le=1, description="randomized variant: share of agents sent z anyway"
    )
    relaxation: float = Field(1.0, gt=0, lt=2, description="over-relaxation alpha")
    reset_every: int | None = Field(None, ge=1, description="full resynchronisation every T_r rounds")
    persistent_momentum: bool | None = Field(
        None,
        description="keep each agent's optimizer state across rounds (default true, as the authors' "
        "code); the same as local.optimizer_state = 'keep'",
    )

    @model_validator(mode="after")
    def _persistent_momentum_is_the_kept_optimizer_state(self) -> EventADMMConfig:
        said = "optimizer_state" in self.local.model_fields_set
        keep = self.local.optimizer_state == "keep"
        if self.persistent_momentum is not None and said and keep != self.persistent_momentum:
            raise ValueError(
                f"persistent_momentum = {str(self.persistent_momentum).lower()} contradicts "
                f"local.optimizer_state = '{self.local.optimizer_state}'; set one of them"
            )
        persistent = (
            self.persistent_momentum if self.persistent_momentum is not None else (keep if said else True)
        )
        local = self.local.model_copy(update={"optimizer_state": "keep" if persistent else "reset"})
        object.__setattr__(self, "local", local)
        object.__setattr__(self, "persistent_momentum", persistent)
        return self

    @model_validator(mode="after")
    def _default_delta_z(self) -> EventADMMConfig:
        if self.delta_z is None:
            object.__setattr__(self, "delta_z", self.delta / 100)
        return self

    def threshold(self, base: float, round: int) -> float:
        return base * self.delta_decay ** (round - 1)

    def is_reset(self, round: int) -> bool:
        return self.reset_every is not None and round % self.reset_every == 0


@dataclass
class EventADMMState:
    z: Params
    copies: Params  # s_i stacked over agents: name -> tensor of shape (N, *param shape)
    z_sent: Params  # the last z broadcast to everyone
    broadcast: bool  # the downlink trigger fired at the end of the last round


class EventADMM(Algorithm):
    name = "event_admm"
    Config = EventADMMConfig
    config: EventADMMConfig
    supports_buffers = True

    # ----- server -----
    def init_server(self, params: Params, num_clients: int) -> EventADMMState:
        sent = self.sent(params)
        copies = {k: v.unsqueeze(0).repeat(num_clients, *([1] * v.dim())) for k, v in sent.items()}
        return EventADMMState(clone(params), copies, clone(params), broadcast=True)  # round 1 syncs z^0

    def downlink(
        self, state: EventADMMState, round: int, clients: Sequence[int]
    ) -> dict[int, Message | None]:
        if state.broadcast or self.config.is_reset(round):
            recipients = list(clients)
        else:  # the randomized variant: a few lucky agents hear the current z anyway
            lucky = math.floor(self.config.lucky_fraction * len(clients) + 1e-9)  # floor(C N), as the code
            rng = self.streams.numpy(round, SERVER, "lucky") if lucky else None
            recipients = [int(c) for c in rng.choice(clients, size=lucky, replace=False)] if rng else []
        z = Message.from_tensors(state.z)
        return dict.fromkeys(recipients, z)

    def uplink_spec(self, state: EventADMMState) -> dict[str, ArraySpec]:
        return specs_of(self.sent(state.z))

    def aggregate(self, state: EventADMMState, round: int, arrivals: Sequence[Arrival]) -> EventADMMState:
        # The default accumulation keeps the arrivals: each full vector replaces one copy (in a new
        # table, so that a discarded aggregate leaves the server's copies as they were).
        copies = {name: s.clone() for name, s in state.copies.items()} if arrivals else state.copies
        for arrival in arrivals:  # full vectors replace the server's copy of x_hat_i + u_i
            for name, v in arrival.message.tensors().items():
                copies[name][arrival.client] = v
        z = state.z | {name: s.mean(dim=0) for name, s in copies.items()}  # FedBN: z keeps its own
        moved = norm(sub(self.weights(z), state.z_sent))
        fire = moved >= self.config.threshold(self.config.delta_z, round)
        if fire:  # broadcast z at the start of the next round
            z_sent = clone(z)
        elif self.config.is_reset(round):  # this round opened with a broadcast of state.z to everyone
            z_sent = state.z
        else:
            z_sent = state.z_sent
        return EventADMMState(z, copies, z_sent, broadcast=fire)

    def global_params(self, state: EventADMMState) -> Params:
        return state.z

    # ----- client -----
    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        state = ctx.state or {}
        if ctx.received is not None:
            z_hat = ctx.received.tensors()
        elif state:
            z_hat = strip_prefix("z_hat", state)
        else:  # never heard z: nothing to start from
            return ClientOutput(uplink=None)
        u = strip_prefix("u", state)
        if u:  # u_i <- u_i + x_hat_i - z_hat (dual ascent with the newest z held)
            u = add(u, sub(strip_prefix("x_hat", state), z_hat))
        else:
            u = {k: torch.zeros_like(v) for k, v in self.weights(z_hat).items()}
        return self.x_update(ctx, z_hat, u)

    def rho_i(self, ctx: ClientContext) -> float:
        if not self.config.per_agent_rho:
            return self.config.rho
        mean_size = ctx.data.num_samples / ctx.data.num_clients
        return self.config.rho * mean_size / ctx.num_samples  # rho / (N p_i)

    def x_update(self, ctx: ClientContext, z_hat: Params, u: Params) -> LocalTraining | ClientOutput:
        """Inexact x-update by local steps warm-started at z_hat (the optimizer's state kept across
        rounds with persistent_momentum: engine/local_training.py); override for an exact solve."""
        own = strip_prefix("buffers", ctx.state or {}) if self.local_buffers else {}  # FedBN
        return LocalTraining(
            params=z_hat | own,
            consts={"anchor": sub(self.weights(z_hat), u), "z_hat": z_hat, "u": u, "rho": self.rho_i(ctx)},
        )

    def objective(self, loss: Loss, params: Params, batch: Any, consts: Consts) -> torch.Tensor:
        # f_i(x) + (rho_i / 2) ||x - z_hat + u_i||^2, over the weights
        anchor = consts["anchor"]
        weights = {k: params[k] for k in anchor}
        return loss(params, batch) + 0.5 * consts["rho"] * sq_distance(weights, anchor)

    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput:
        return self.finish(ctx, work.consts["z_hat"], work.consts["u"], result.params, loss_meta(result))

    def finish(
        self,
        ctx: ClientContext,
        z_hat: Params,
        u: Params,
        x: Params,
        meta: dict[str, Any],
    ) -> ClientOutput:
        """Relax, apply the uplink trigger and write the agent's state."""
        alpha = self.config.relaxation
        statistics = {n: x[n] for n in self.buffers if n in x}  # trained buffers: sent or kept, never relaxed
        x = self.weights(x)
        x_hat = x if alpha == 1.0 else add({k: alpha * v for k, v in x.items()}, z_hat, 1.0 - alpha)
        v = add(x_hat, u)
        # last_i starts as the z the agent first received, which is what the server's copy holds.
        last = strip_prefix("last", ctx.state or {}) or self.weights(z_hat)
        z_step = self.z_step(ctx, z_hat)
        distance = norm(sub(v, last))
        units = self.trigger_units(ctx, last, z_step)
        threshold = self.config.threshold(self.config.delta, ctx.round) * units[self.config.trigger]
        send = self.config.is_reset(ctx.round) or distance >= threshold
        state = {
            **with_prefix("x_hat", x_hat),
            **with_prefix("u", u),
            **with_prefix("z_hat", z_hat),
            **with_prefix("last", v if send else last),
            **with_prefix("buffers", {n: statistics[n] for n in self.local_buffers}),
        }
        if self.config.trigger == "progress":
            state["z_step"] = torch.tensor(z_step, dtype=torch.float64)
        return ClientOutput(
            Message.from_tensors(v | self.sent(statistics), **meta) if send else None,
            state,
            {"trigger_norm": distance, **{f"trigger_unit/{k}": unit for k, unit in units.items()}},
        )

    def trigger_units(self, ctx: ClientContext, last: Params, z_step: float) -> dict[str, float]:
        """What Delta_k multiplies under each uplink rule; agent i sends when ||v_i - last_i|| reaches
        Delta_k times the unit of the configured ``trigger``. All three are reported (client info),
        so one Delta = 0 run calibrates every rule.

        * ``absolute`` (the paper, Alg. 1): 1, one threshold for every agent.
        * ``relative`` (beyond the paper): ||last_i||, scale-free, so an agent whose x_i + u_i is
          small is not held to the threshold of one whose x_i + u_i is large.
        * ``progress`` (beyond the paper): N ||z_step_i||, where z_step_i is how far z moved at the
          last new broadcast agent i heard. The agent's unsent share of z, ||v_i - last_i|| / N, is
          compared with the consensus' own last step: an agent with little new to say next to how
          fast z is moving stays silent, and the threshold shrinks as the method converges.
          Unknown step (first round): 0, so the first update is always sent.
        With ``delta_decay`` < 1 every rule tends to zero, so the fixed point is that of ADMM.
        """
        return {"absolute": 1.0, "relative": norm(last), "progress": ctx.data.num_clients * z_step}

    def z_step(self, ctx: ClientContext, z_hat: Params) -> float:
        """||z_hat - the z held before|| if a new z arrived this round, else the step remembered
        times ``progress_fade``: the longer the agent hears nothing new, the lower its threshold, so
        a round in which nobody speaks cannot repeat forever (no fixed point but ADMM's)."""
        state = ctx.state or {}
        held = self.weights(strip_prefix("z_hat", state))
        step = norm(sub(self.weights(z_hat), held)) if held else 0.0
        if step > 0 or "z_step" not in state:
            return step
        return self.config.progress_fade * float(state["z_step"])
