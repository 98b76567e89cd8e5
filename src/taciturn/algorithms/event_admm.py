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

Beyond the paper (taciturn's own rules; the defaults keep the paper's behaviour, which the
benchmark of record, benchmarks/event_admm.py, runs):
  * sampling and triggering together (``fraction`` < 1): each round the server samples C N agents
    (McMahan et al.'s uniform draw); only they compute, and the uplink trigger decides which of them
    speak. With sampling, the paper's one broadcast would reach only the agents sampled in the round
    after it fires, so sampling takes ``downlink = "per_client"`` (the default ``"auto"`` picks it
    whenever ``fraction`` < 1; ``"broadcast"`` with sampling and Delta_z > 0 is refused);
  * ``downlink = "per_client"``: the server keeps z_sent_i, the z it last sent agent i, and sends z to
    a sampled agent only if ||z - z_sent_i|| >= Delta_z,k (and z changed), so an agent that was away
    gets the z it missed and one that holds a recent z is spared. With C = 1 and no lucky agents
    every z_sent_i equals the paper's z_sent, so the two rules send the same messages. The randomized
    variant's lucky agents are drawn among the sampled agents the trigger skipped. As with the
    paper's broadcast, the server counts a z as held once sent: a lost z leaves the agent on its stale
    copy until the trigger or a reset sends it again;
  * ``start = "common"``: every agent starts from z^0, the common initial model the run seed
    builds (the authors' code seeds every agent model and the global model alike, x_i^0 = z^0;
    research/event_admm.md, Sec. 1.2), so round 1 sends nothing down; ``"broadcast"`` (the default,
    taciturn's earlier behaviour) opens the run with z^0 sent to every agent;
  * ``uplink = "change"``: an agent sends r_i = v_i - last_i and the server adds it to s_i, as the
    authors' code does. The bytes are those of v_i uncompressed, but a change can be compressed
    (compression/): with error memory (``[compression] up_feedback = "memory"``) the agent's memory
    e_i holds last_i - s_i, so C(r_i + e_i) = C(v_i - s_i) is EF21's compressed step toward the
    server's copy (Richtarik, Sokolov, Fatkhullin, NeurIPS 2021, Alg. 1). The trigger still compares
    v_i with last_i, what the agent meant to send.
Which config reproduces what: the paper's Alg. 1 (vanilla) is the default (``lucky_fraction = 0``);
its randomized variant ``lucky_fraction`` > 0; both with Delta_z set (the code's Delta / 100 is the
default). ``start = "common"`` removes the round-1 broadcast, as the authors' code initialises.

Buffers (BatchNorm running statistics) are no variables of the consensus problem: x_i, u_i, the
relaxation, the triggers' norms and the downlink triggers cover the weights only. An agent sends its
trained statistics whole with v_i (also under ``uplink = "change"``), the server keeps them in the
agent's copy, and z's statistics are the mean of the copies, as z's weights are of the s_i; or, with
local buffers (FedBN), each agent keeps its own in its state and never sends them, and z keeps the
initial ones.
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
    Carries,
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
    start: Literal["broadcast", "common"] = Field(
        "broadcast",
        description="broadcast: round 1 sends z^0 to every agent; common: agents start from the common "
        "initial model, nothing is sent",
    )
    downlink: Literal["auto", "broadcast", "per_client"] = Field(
        "auto",
        description="broadcast: one trigger ||z - z_sent|| >= Delta_z (the paper); per_client: the server "
        "tracks the z each agent was sent and triggers per agent; auto: broadcast unless agents are sampled",
    )
    uplink: Literal["full", "change"] = Field(
        "full", description="full: send x_hat_i + u_i; change: send its change since last sent (compressible)"
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

    @model_validator(mode="after")
    def _sampling_needs_per_client_downlink(self) -> EventADMMConfig:
        if self.downlink == "auto":
            object.__setattr__(self, "downlink", "per_client" if self.fraction < 1 else "broadcast")
        if self.fraction < 1 and self.downlink == "broadcast" and (self.delta_z or self.lucky_fraction):
            raise ValueError(
                f"fraction = {self.fraction} samples agents, but the paper's broadcast (downlink = "
                "'broadcast', Delta_z > 0) reaches only the agents sampled in the round after it fires, "
                "and the others never get that z: set downlink = 'per_client'"
            )
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
    held: Params | None = None  # per_client: z_sent_i, the z last sent to each agent, (N, *shape)
    sent: torch.Tensor | None = None  # per_client: whether agent i holds any z (bool, (N,))


class EventADMM(Algorithm):
    name = "event_admm"
    Config = EventADMMConfig
    config: EventADMMConfig
    supports_buffers = True

    @classmethod
    def carries(cls, config: AlgorithmConfig) -> tuple[Carries, Carries]:
        return "increments" if getattr(config, "uplink", "full") == "change" else "values", "values"

    def __init__(self, config: EventADMMConfig):
        super().__init__(config)
        self.initial: Params | None = None  # z^0, which start = "common" has every agent hold
        self._sent_to: tuple[int, list[int]] = (0, [])  # per_client: (round, agents sent z that round)

    # ----- server -----
    def init_server(self, params: Params, num_clients: int) -> EventADMMState:
        self.initial = clone(params)
        # s_i = z^0: what every agent holds before it speaks (less the buffers FedBN agents keep)
        copies = stacked(self.sent(params), num_clients)
        common = self.config.start == "common"
        held = sent = None
        if self.config.downlink == "per_client":
            held, sent = stacked(self.weights(params), num_clients), torch.full((num_clients,), common)
        # start = "broadcast": round 1 syncs z^0 to every agent
        return EventADMMState(clone(params), copies, clone(params), not common, held, sent)

    def downlink(
        self, state: EventADMMState, round: int, clients: Sequence[int]
    ) -> dict[int, Message | None]:
        if self.config.downlink == "per_client":
            return self.per_client_downlink(state, round, clients)
        if state.broadcast or self.config.is_reset(round):
            recipients = list(clients)
        else:  # the randomized variant: a few lucky agents hear the current z anyway
            lucky = math.floor(self.config.lucky_fraction * len(clients) + 1e-9)  # floor(C N), as the code
            rng = self.streams.numpy(round, SERVER, "lucky") if lucky else None
            recipients = [int(c) for c in rng.choice(clients, size=lucky, replace=False)] if rng else []
        z = Message.from_tensors(state.z)
        return dict.fromkeys(recipients, z)

    def per_client_downlink(
        self, state: EventADMMState, round: int, clients: Sequence[int]
    ) -> dict[int, Message | None]:
        """z to each sampled agent i that holds none, or whose z_sent_i is Delta_z,k or more from z
        (Delta_z,k of round k - 1, the round that made z: the paper's trigger, evaluated per agent);
        every sampled agent in a reset round; then floor(C_lucky m) lucky ones of the rest."""
        assert state.held is not None and state.sent is not None
        threshold = self.config.threshold(self.config.delta_z, max(round - 1, 1))
        reset = self.config.is_reset(round)
        recipients, skipped = [], []
        for c in (int(c) for c in clients):
            gap = norm({k: state.z[k] - v[c] for k, v in state.held.items()}) if state.sent[c] else None
            needs = reset or gap is None or (gap > 0 and gap >= threshold)
            (recipients if needs else skipped).append(c)
        lucky = min(len(skipped), math.floor(self.config.lucky_fraction * len(clients) + 1e-9))
        if lucky:
            rng = self.streams.numpy(round, SERVER, "lucky")
            recipients += [int(c) for c in rng.choice(skipped, size=lucky, replace=False)]
        self._sent_to = (round, sorted(recipients))
        z = Message.from_tensors(state.z)
        return dict.fromkeys(sorted(recipients), z)

    def uplink_spec(self, state: EventADMMState) -> dict[str, ArraySpec]:
        return specs_of(self.sent(state.z))

    def aggregate(self, state: EventADMMState, round: int, arrivals: Sequence[Arrival]) -> EventADMMState:
        # The default accumulation keeps the arrivals: each full vector replaces one copy (in a new
        # table, so that a discarded aggregate leaves the server's copies as they were).
        copies = {name: s.clone() for name, s in state.copies.items()} if arrivals else state.copies
        for arrival in arrivals:  # full vectors replace the server's copy of x_hat_i + u_i
            for name, v in arrival.message.tensors().items():
                if self.config.uplink == "change" and name not in self.buffers:  # s_i += r_i, as the code
                    copies[name][arrival.client] += v
                else:
                    copies[name][arrival.client] = v
        z = state.z | {name: s.mean(dim=0) for name, s in copies.items()}  # FedBN: z keeps its own
        if self.config.downlink == "per_client":
            return EventADMMState(z, copies, state.z_sent, False, *self._record_sent(state, round))
        moved = norm(sub(self.weights(z), state.z_sent))
        fire = moved >= self.config.threshold(self.config.delta_z, round)
        if fire:  # broadcast z at the start of the next round
            z_sent = clone(z)
        elif self.config.is_reset(round):  # this round opened with a broadcast of state.z to everyone
            z_sent = state.z
        else:
            z_sent = state.z_sent
        return EventADMMState(z, copies, z_sent, broadcast=fire)

    def _record_sent(self, state: EventADMMState, round: int) -> tuple[Params, torch.Tensor]:
        """z_sent_i <- z for the agents sent z this round (counted as held once sent, as the paper's
        broadcast is)."""
        assert state.held is not None and state.sent is not None
        sent_round, recipients = self._sent_to
        if sent_round != round or not recipients:
            return state.held, state.sent
        held = {name: h.clone() for name, h in state.held.items()}
        for name, h in held.items():
            h[recipients] = state.z[name]
        sent = state.sent.clone()
        sent[recipients] = True
        return held, sent

    def global_params(self, state: EventADMMState) -> Params:
        return state.z

    # ----- client -----
    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput:
        state = ctx.state or {}
        if ctx.received is not None:
            z_hat = ctx.received.tensors()
        elif state:
            z_hat = strip_prefix("z_hat", state)
        elif self.config.start == "common":  # z^0, which every agent builds from the run seed
            if self.initial is None:
                raise RuntimeError("start = 'common' needs the initial model: init_server runs first")
            z_hat = self.initial
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
        last = strip_prefix("last", ctx.state or {}) or self.first_last(z_hat)
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
        sent = sub(v, last) if self.config.uplink == "change" else v
        return ClientOutput(
            Message.from_tensors(sent | self.sent(statistics), **meta) if send else None,
            state,
            {"trigger_norm": distance, **{f"trigger_unit/{k}": unit for k, unit in units.items()}},
        )

    def first_last(self, z_hat: Params) -> Params:
        """last_i before agent i first speaks: the server's copy s_i = z^0. Full vectors: the z the agent
        first received, which is z^0 unless a broadcast was lost (the first full v_i replaces s_i anyway).
        Changes add up on s_i, so they must start from z^0 itself."""
        if self.config.uplink == "full":
            return self.weights(z_hat)
        if self.initial is None:
            raise RuntimeError("uplink = 'change' needs the initial model: init_server runs first")
        return self.weights(self.initial)

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


def stacked(params: Params, n: int) -> Params:
    """n copies of ``params`` along a new leading axis."""
    return {k: v.unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in params.items()}
