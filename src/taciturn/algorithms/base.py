"""The one shape every round-based algorithm has (FedAvg, FedProx, SCAFFOLD, FedADMM,
event-based ADMM, Ferret, FedKSeed).

Server:  init_server -> select_clients -> downlink -> ... -> aggregate -> global_params
Client:  client_begin -> [local steps on ``objective``, run by the executor] -> client_end

* The server state is a small dataclass of tensors and scalars (checkpointed generically).
* ``downlink`` returns a Message per picked client, or None to stay silent (an event trigger).
* ``client_begin`` reads what arrived (None if nothing did), the client's persistent state and
  returns either a ``LocalTraining`` request or a finished ``ClientOutput`` (clients that do
  their own work, e.g. zeroth-order or closed-form updates).
* ``objective(loss, params, batch, consts)`` is a pure function: the task loss plus whatever the
  algorithm adds (a proximal term, a control-variate correction, an augmented Lagrangian).
  ``consts`` holds the tensors it reads (anchor, control variates, duals) so that a vectorized
  executor can stack them over clients and ``vmap`` the gradient.
* ``client_end`` turns the trained parameters into an uplink Message (or None: "nothing to say")
  and the client's new persistent state.
* ``aggregate`` receives only uplinks that arrived and passed validation.

An algorithm never knows where clients run; executors never know an algorithm's math.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import torch
from pydantic import Field, model_validator

from taciturn.algorithms.config import MAX_LR, StrictModel
from taciturn.algorithms.schedule import Schedule
from taciturn.core.message import Message
from taciturn.core.params import Params, sub
from taciturn.core.rng import Streams
from taciturn.core.state_store import ClientState
from taciturn.data.batching import batch_plan
from taciturn.tasks.base import ClientData

Loss = Callable[[Params, Any], torch.Tensor]
Consts = dict[str, Any]  # a pytree of tensors
# What a link's float arrays are, for compression ([compression], compression/config.py):
# "updates" (this round's change, applied to a model whose own dynamics correct what compression
# got wrong: every compressor and feedback applies), "increments" (changes the receiver adds into a
# running sum: SCAFFOLD's c, event ADMM's copies; EF21's server copy would stand for each increment
# and the sum would drift, so only the memory, which keeps the sum exact up to what it holds),
# "values" (a model or other quantities themselves: only compressors whose error is bounded per
# value), "exact" (must arrive bit for bit).
Carries = Literal["updates", "increments", "values", "exact"]


class LocalConfig(StrictModel):
    """How a client trains locally: a schedule of minibatches, an optimizer and its learning rate."""

    epochs: int = Field(
        1, ge=1, le=100_000, description="passes over the local data (ignored when steps is set)"
    )
    steps: int | None = Field(
        None, ge=1, le=10_000_000, description="exact number of minibatch steps, overriding epochs"
    )
    batch_size: int = Field(
        32, ge=1, description="minibatch size; a value >= the client's data is full-batch"
    )
    optimizer: Literal["sgd", "adam", "adamw"] = Field(
        "sgd", description="torch.optim.SGD, Adam or AdamW's update (engine/optimizers.py)"
    )
    lr: float = Field(0.05, gt=0, le=MAX_LR, description="local learning rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd: heavy-ball momentum (PyTorch SGD semantics)")
    nesterov: bool = Field(False, description="sgd: Nesterov momentum (needs momentum > 0)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam, adamw: moment decay rates")
    eps: float = Field(1e-8, gt=0, le=1, description="adam, adamw: added to the denominator")
    weight_decay: float | None = Field(
        None, ge=0, le=MAX_LR, description="L2 penalty (adamw: decoupled); default 0, adamw 0.01 as torch"
    )
    clip_norm: float | None = Field(None, gt=0, description="clip each gradient to this global L2 norm")
    optimizer_state: Literal["reset", "keep"] = Field(
        "reset",
        description="reset: a fresh optimizer every round; keep: momentum or Adam's moments and step "
        "count are client state, stored when the server accepts the client's update",
    )
    schedule: Schedule = Field(Schedule(), description="the learning rate over a round's local steps")
    round_schedule: Schedule = Field(Schedule(), description="the local learning rate over rounds")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="autocast of the forward pass (fp16 with a gradient scaler); weights stay fp32"
    )

    @model_validator(mode="after")
    def _options_of_the_optimizer(self) -> LocalConfig:
        fields = type(self).model_fields
        given = [k for k in ("momentum", "nesterov", "betas", "eps") if getattr(self, k) != fields[k].default]
        stray = [k for k in given if (k in ("momentum", "nesterov")) != (self.optimizer == "sgd")]
        if stray:
            owner = "'sgd'" if stray[0] in ("momentum", "nesterov") else "'adam' or 'adamw'"
            raise ValueError(f"{', '.join(stray)} applies only with optimizer = {owner}")
        if self.nesterov and not self.momentum:
            raise ValueError("nesterov needs momentum > 0 (as torch.optim.SGD)")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {list(self.betas)}")
        if self.weight_decay is None:  # torch's defaults: AdamW decays 0.01, the others do not
            object.__setattr__(self, "weight_decay", 0.01 if self.optimizer == "adamw" else 0.0)
        return self

    @property
    def plain_sgd_steps(self) -> bool:
        """SGD at one learning rate through the round, in fp32: what written-out algebra covers."""
        return (
            self.optimizer == "sgd"
            and not self.nesterov
            and self.schedule.constant
            and self.precision == "fp32"
        )

    def round_lr(self, round: int) -> float:
        """The local learning rate of a round (before the schedule over its steps)."""
        return self.lr * self.round_schedule.factor(round - 1)


class AlgorithmConfig(StrictModel):
    name: str
    fraction: float = Field(0.1, gt=0, le=1, description="fraction of clients sampled per round")
    local: LocalConfig = LocalConfig()

    def clients_per_round(self, num_clients: int) -> int:
        return max(1, math.floor(round(self.fraction * num_clients, 6)))


@dataclass
class ClientContext:
    client: int
    round: int
    received: Message | None  # what arrived on the downlink this round (None: nothing did)
    state: ClientState | None  # the client's persistent state (None: it has none yet)
    num_samples: int  # size of the client's local data
    streams: Streams
    data: ClientData  # the federated training set (this client's part via client_indices)
    loss: Loss  # the task loss, a pure function of (params, batch)
    # names in the parameters that take no gradient (BatchNorm statistics)
    buffers: frozenset[str] = frozenset()
    # the optimizer state this client kept from its last accepted round (optimizer_state = "keep")
    optimizer_state: Params | None = None

    def batch_indices(self, config: LocalConfig) -> list[np.ndarray]:
        """Which samples each of this round's local steps uses, from the client's own seeded stream."""
        indices = self.data.client_indices(self.client)
        rng = self.streams.numpy(self.round, self.client, "batches")
        plan = batch_plan(len(indices), config.batch_size, config.epochs, config.steps, rng)
        return [indices[positions] for positions in plan]

    def batches(self, config: LocalConfig) -> Iterator[Any]:
        """This client's minibatches for this round."""
        for indices in self.batch_indices(config):
            yield self.data.batch(indices)


@dataclass
class LocalTraining:
    """A request to run local minibatch steps on ``objective`` from ``params``."""

    params: Params
    consts: Consts
    optimizer_state: Params | None = None  # where the optimizer starts (engine/optimizers.py; None: fresh)
    track_gradient: bool = False  # also return the mean gradient of the objective over the steps


@dataclass
class TrainResult:
    params: Params
    optimizer_state: Params | None  # the optimizer's state after the steps (None: it keeps none)
    steps: int
    mean_loss: float  # mean objective over the steps taken
    mean_gradient: Params | None = None  # mean objective gradient (raw: before decay/clipping), if tracked
    delta: Params | None = None  # params minus the start, where the trainer formed it directly

    def change(self, start: Params) -> Params:
        """The trained parameters minus the starting ones (what FedAvg-style uplinks carry)."""
        return self.delta if self.delta is not None else sub(self.params, start)


@dataclass
class ClientOutput:
    uplink: Message | None  # None: the client stays silent
    state: ClientState | None = None  # None: leave its stored state unchanged
    info: Mapping[str, float] = field(default_factory=dict)  # simulation telemetry, never on the wire


class ArraySpec(NamedTuple):
    """What one uplink array must be: its shape (None: any length along that axis) and its dtype."""

    shape: tuple[int | None, ...]
    dtype: np.dtype


def specs_of(params: Mapping[str, torch.Tensor]) -> dict[str, ArraySpec]:
    """Each tensor's shape and (NumPy) dtype: the spec of an uplink that carries these tensors."""
    return {
        name: ArraySpec(tuple(p.shape), np.dtype(str(p.dtype).removeprefix("torch.")))
        for name, p in params.items()
    }


@dataclass(frozen=True)
class Arrival:
    client: int
    message: Message


class Algorithm(ABC):
    name: ClassVar[str]
    Config: ClassVar[type[AlgorithmConfig]]
    keeps_client_state: ClassVar[bool] = True  # False: clients are stateless (no store traffic)
    # True: the algorithm federates a model's floating buffers (BatchNorm statistics: carried in the
    # parameters, updated by the forward pass, never differentiated). Its math (steps, proximal
    # terms, control variates, duals, triggers) applies to the weights only; the buffers are
    # averaged as the server averages models, or kept by each client (``use_buffers``, FedBN).
    # False (projections onto shared bases, zeroth-order steps): models with buffers are refused.
    supports_buffers: ClassVar[bool] = False
    # The uplink arrays the server chain (server/aggregation.py: robust rules, clipping, DP) and
    # local DP combine, as one vector per client, by name prefix ("": all of them); None: the
    # uplink is not a vector they can combine.
    delta_prefix: ClassVar[str | None] = None
    # The uplink arrays that carry what a client learned from its data (per-client secrets), by
    # name prefix ("": all of them). A privacy or robustness mechanism must cover every one, or
    # the combination is refused before work (``covers_secrets``): SCAFFOLD's control-variate
    # update is as much a function of the client's data as its model delta.
    secret_prefixes: ClassVar[tuple[str, ...]] = ("",)

    @classmethod
    def covers_secrets(cls) -> bool:
        """Whether the arrays the server chain combines include every per-client secret."""
        prefix = cls.delta_prefix
        return prefix is not None and all(secret.startswith(prefix) for secret in cls.secret_prefixes)

    @classmethod
    def carries(cls, config: AlgorithmConfig) -> tuple[Carries, Carries]:
        """What the uplink's and the downlink's float arrays are under ``config`` (see ``Carries``)."""
        return "exact", "exact"

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.streams: Streams | None = None
        self.num_clients = 0  # the population, told by the federation (use_population)
        self.total_weight = 0  # the server's sum of every client's weight (trusted num_samples)
        self.buffers: frozenset[str] = frozenset()  # the model's buffers (use_buffers)
        self.local_buffers: frozenset[str] = frozenset()  # those kept by each client (FedBN)
        self.keeps_client_state = self._stateful()

    def use_streams(self, streams: Streams) -> None:
        """The run's seeded streams, given by the federation before the first round: the server
        draws its own randomness (lucky recipients, shared bases, seeds) from the same streams as clients."""
        self.streams = streams

    def use_population(self, num_clients: int, total_weight: int) -> None:
        """The population as the server knows it: the number of clients and the sum of all their
        weights under the server's weighting rule (engine/trust.py), given before the first round."""
        self.num_clients = num_clients
        self.total_weight = total_weight

    def use_buffers(self, names: frozenset[str], local: bool = False) -> None:
        """The model's buffers, told before the first round (both ends of a deployment): averaged
        by the server, or with ``local`` kept by each client in its client state and never sent
        (FedBN: Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1)."""
        self.buffers = frozenset(names)
        self.local_buffers = self.buffers if local else frozenset()
        self.keeps_client_state = self._stateful()

    def _stateful(self) -> bool:
        """Whether clients keep state: the algorithm's own, their statistics (FedBN) or their
        optimizer's (``optimizer_state = "keep"``)."""
        kept = self.config.local.optimizer_state == "keep"
        return type(self).keeps_client_state or bool(self.local_buffers) or kept

    def weights(self, params: Mapping[str, torch.Tensor]) -> Params:
        """The tensors the algorithm's math applies to: every one but the buffers."""
        return {n: p for n, p in params.items() if n not in self.buffers}

    def sent(self, params: Mapping[str, torch.Tensor]) -> Params:
        """The tensors a client sends up: every one but the buffers it keeps (FedBN)."""
        return {n: p for n, p in params.items() if n not in self.local_buffers}

    def server_step(self, params: Params, mean_delta: Mapping[str, torch.Tensor], lr: float) -> Params:
        """``params`` moved by ``lr`` times the clients' mean delta on the weights; the buffers become
        the clients' mean (a step of 1 whatever ``lr``: a larger step would extrapolate a running
        variance, possibly below zero). Only the tensors in ``mean_delta`` move."""
        return {k: params[k] + (1.0 if k in self.buffers else lr) * d for k, d in mean_delta.items()}

    # ----- server -----
    @abstractmethod
    def init_server(self, params: Params, num_clients: int) -> Any: ...

    def select_clients(
        self, state: Any, round: int, num_clients: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Uniform sampling without replacement (McMahan et al. 2017, Alg. 1: S_t, m = max(C K, 1))."""
        m = self.config.clients_per_round(num_clients)
        return np.sort(rng.choice(num_clients, size=m, replace=False))

    @abstractmethod
    def downlink(self, state: Any, round: int, clients: Sequence[int]) -> Mapping[int, Message | None]:
        """What the server sends each picked client this round (None: stay silent to it)."""

    @abstractmethod
    def uplink_spec(self, state: Any) -> Mapping[str, ArraySpec]:
        """Names, shapes and dtypes every uplink must have; anything else is rejected."""

    def check_uplink_meta(self, message: Message) -> str | None:
        """Algorithm-specific checks of an uplink's metadata; return the reason to reject, or None."""
        return None

    def accumulate(self, arrivals: Sequence[Arrival]) -> Any:
        """Reduce a group of arrivals to a partial aggregate.

        Executors that spread clients over workers call this in each worker and ``combine`` the
        partials, so an algorithm whose aggregate is a weighted sum ships one sum per worker
        instead of every update (pfl-research's pattern). The default keeps the arrivals.
        """
        return list(arrivals)

    def combine(self, partials: Sequence[Any]) -> Any:
        """Merge partial aggregates (in the order of the clients they cover)."""
        return [arrival for partial in partials for arrival in partial]

    @abstractmethod
    def aggregate(self, state: Any, round: int, accumulated: Any) -> Any:
        """The new server state from this round's accumulated arrivals (all that arrived and passed
        validation; an empty round's accumulation may be empty)."""

    @abstractmethod
    def global_params(self, state: Any) -> Params: ...

    def client_models(self, state: Any, arrivals: Sequence[Arrival]) -> list[tuple[float, Params]] | None:
        """For analysis: the arrived clients' trained models with their averaging weights, each model
        given relative to one common point (any point: only their differences are used); None when
        the uplinks do not carry models. ``state`` is the server state the round started from."""
        return None

    # ----- client -----
    @abstractmethod
    def client_begin(self, ctx: ClientContext) -> LocalTraining | ClientOutput: ...

    def objective(self, loss: Loss, params: Params, batch: Any, consts: Consts) -> torch.Tensor:
        return loss(params, batch)

    @abstractmethod
    def client_end(self, ctx: ClientContext, work: LocalTraining, result: TrainResult) -> ClientOutput: ...


def positive_count(message: Message, key: str) -> str | None:
    """Reason to reject an uplink whose ``key`` metadata is not a positive integer, else None."""
    value = message.meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"metadata {key!r} must be a positive integer, got {value!r}"
    return None


def loss_meta(result: TrainResult) -> dict[str, float]:
    """The mean local loss as uplink metadata, omitted when it is not finite (the arrays tell)."""
    return {"train_loss": result.mean_loss} if math.isfinite(result.mean_loss) else {}
