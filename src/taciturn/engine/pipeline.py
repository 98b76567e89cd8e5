"""The client side of a round, for any group of clients: what every executor runs.

For each client: the downlink crosses the channel, the algorithm begins its work, local training
runs (through the executor's trainer: one client at a time, or many at once), the algorithm ends
its work, the uplink crosses the channel, the server validates it and replaces its claimed
weight by the one it trusts (engine/trust.py), and the accepted arrivals are reduced with
``algorithm.accumulate``. A parallel executor runs this for each worker's share and merges the
parts.

Private runs ([privacy], [secagg]): a client's training statistics (``train_loss``) never leave
it, since no mechanism covers them, and under [privacy] the server's log names no client (which
clients took part is what amplification by sampling assumes hidden).

Acceptance (DESIGN.md): a client's new state is only *staged* while its uplink travels. It goes to
the store when the server has accepted that uplink (``commit``, called by the Federation once the
round's aggregate is validated); a dropped or rejected uplink, or a skipped round, leaves the
client's stored state as it was. A client that sends nothing has nothing to wait for: its new
state is stored at once.

Compression (compression/link.py): what arrives on the downlink is rebuilt before the algorithm
sees it; an uplink is compressed last, after local DP and any simulated attack, and the server
rebuilds and checks it in ``admit`` before anything else. The links' own client state (error
memory, the downlink reference) is stored beside the algorithm's, under names starting with "~",
and follows the same acceptance rule; the algorithm never sees it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from taciturn.algorithms.base import (
    Algorithm,
    ArraySpec,
    Arrival,
    ClientContext,
    ClientOutput,
    LocalTraining,
    Loss,
    TrainResult,
)
from taciturn.attacks.poisoning import ModelPoisoning
from taciturn.compression.chain import CompressionError
from taciturn.compression.link import Downlink, Uplink, split_links
from taciturn.core.channel import Channel
from taciturn.core.ledger import Direction
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams
from taciturn.core.state_store import ClientState, ClientStateStore
from taciturn.engine.local_training import end_training, split_state
from taciturn.engine.trust import TrustConfig, TrustedWeights
from taciturn.engine.validation import overflow_problem, uplink_problem
from taciturn.privacy.gaussian import LocalGaussian
from taciturn.secagg.config import SecAggFailed
from taciturn.secagg.quantize import dequantize_sum, levels, quantize
from taciturn.tasks.base import ClientData

if TYPE_CHECKING:  # the protocol needs the optional extra 'secagg'
    from taciturn.secagg.protocol import SecureSum

log = logging.getLogger(__name__)

STATISTICS = ("train_loss",)  # uplink metadata that only reports on training: kept home in private runs


class Trainer(Protocol):
    def train(
        self, algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]]
    ) -> list[TrainResult | Exception]:
        """Run each item's local steps; a client whose training raised yields its exception."""


@dataclass
class RoundPart:
    """What serving a group of clients produced; parts of one round merge into one."""

    accumulated: Any
    accepted: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # train_loss of accepted uplinks that report one
    client_info: dict[int, Mapping[str, float]] = field(default_factory=dict)
    arrivals: list[Arrival] = field(default_factory=list)  # only when the pipeline keeps them
    heard: list[int] = field(default_factory=list)  # clients a downlink message reached
    settled: list[int] = field(default_factory=list)  # clients whose new state was stored at once


@dataclass
class _Held:
    """A client's stored state during its round: the algorithm's part, the links' part (after this
    round's downlink), whether the links' part changed, and whether a downlink message arrived."""

    own: ClientState | None
    links: ClientState
    changed: bool = False
    heard: bool = False


class ClientPipeline:
    def __init__(
        self,
        algorithm: Algorithm,
        channel: Channel,
        store: ClientStateStore,
        streams: Streams,
        data: ClientData,
        loss: Loss,
        keep_arrivals: bool = False,
        trust: TrustConfig | None = None,
        buffers: frozenset[str] = frozenset(),
        per_client: bool = False,
        poisoning: ModelPoisoning | None = None,
        local_dp: LocalGaussian | None = None,
        secure_sum: SecureSum | None = None,
        private: bool = False,
        uplink: Uplink | None = None,
        downlink: Downlink | None = None,
    ):
        self.algorithm = algorithm
        self.buffers = buffers  # parameter names local training updates without a gradient
        # Per-client updates for analysis (engine/analysis.py); in-process executors only, since
        # a parallel worker sends back its reduced part, not every update.
        self.keep_arrivals = keep_arrivals
        # The server chain needs every update (server/aggregation.py): parts carry the arrivals
        # themselves instead of the algorithm's partial sums.
        self.per_client = per_client
        self.poisoning = poisoning  # simulated attackers' uplinks (attacks/poisoning.py), if any
        self.local_dp = local_dp  # each client's own clip and noise (privacy/gaussian.py), if any
        self.secure_sum = secure_sum  # the server sees only the sum (secagg/), if any
        self.private = private  # [privacy]: no client named in the log
        self.keep_statistics = not private and secure_sum is None
        self.uplink, self.downlink = uplink, downlink  # compression of each link, if any
        self._held: dict[int, _Held] = {}  # this round's clients, between context and _collect
        algorithm.use_streams(streams)  # before any worker forks: every copy of the algorithm has them
        self.trust = TrustedWeights(trust or TrustConfig(), data)
        algorithm.use_population(data.num_clients, self.trust.total())
        self.channel = channel
        self.store = store
        self.streams = streams
        self.data = data
        self.loss = loss
        self._staged: dict[int, ClientState] = {}  # client -> new state awaiting acceptance
        self._staged_round: int | None = None

    def context(self, round: int, client: int, message: Message | None) -> ClientContext:
        received = None if message is None else self.channel.send(Direction.DOWN, round, client, message)
        own, links = split_links(self.store.get(client))  # the links' part stays with the pipeline
        held = self._held[client] = _Held(own, links, heard=received is not None)
        if received is not None and self.downlink is not None:
            received, held.links = self.downlink.receive(round, client, received, links)
            held.changed = held.links is not links
        state, optimizer_state = split_state(own)  # the algorithm sees its own part
        return ClientContext(
            client,
            round,
            received,
            state,
            self.data.client_size(client),
            self.streams,
            self.data,
            self.loss,
            self.buffers,
            optimizer_state,
        )

    def serve(
        self,
        round: int,
        clients: Sequence[int],
        downlink: Mapping[int, Message | None],
        spec: Mapping[str, ArraySpec],
        trainer: Trainer,
    ) -> RoundPart:
        algorithm = self.algorithm
        contexts = [self.context(round, c, downlink.get(c)) for c in clients]
        outputs: list[ClientOutput | Exception | None] = [None] * len(contexts)
        works: dict[int, LocalTraining] = {}
        for i, ctx in enumerate(contexts):
            try:
                begun = algorithm.client_begin(ctx)
            except Exception as error:  # one broken client must not end the federation
                outputs[i] = self._failed(ctx, error)
                continue
            if isinstance(begun, LocalTraining):
                works[i] = begun
            else:
                outputs[i] = begun
        results = trainer.train(algorithm, [(contexts[i], w) for i, w in works.items()])
        for (i, work), result in zip(works.items(), results, strict=True):
            if isinstance(result, Exception):
                outputs[i] = self._failed(contexts[i], result)
                continue
            try:
                outputs[i] = end_training(algorithm, contexts[i], work, result)
            except Exception as error:
                outputs[i] = self._failed(contexts[i], error)
        return self._collect(round, contexts, outputs, spec)

    def _collect(self, round, contexts, outputs, spec) -> RoundPart:
        part, arrivals, uplinks = RoundPart(accumulated=None), [], []
        waiting: dict[int, ClientState | None] = {}  # new algorithm state of clients that sent
        part.heard = [ctx.client for ctx in contexts if self._held[ctx.client].heard]
        for ctx, output in zip(contexts, outputs, strict=True):
            if isinstance(output, Exception):
                part.failed.append((ctx.client, f"{type(output).__name__}: {output}"))
                continue
            assert isinstance(output, ClientOutput)
            if output.info:
                part.client_info[ctx.client] = dict(output.info)
            if output.uplink is None:  # nothing sent, nothing to acknowledge: stored at once
                if (state := self._full_state(ctx.client, output.state, spec)) is not None:
                    self.store.put(ctx.client, state)
                    part.settled.append(ctx.client)
                continue
            waiting[ctx.client] = output.state
            uplinks.append(
                (ctx.client, output.uplink if self.keep_statistics else without_statistics(output.uplink))
            )
        if self.local_dp is not None:
            uplinks = [(client, self.local_dp.apply(round, client, uplink)) for client, uplink in uplinks]
        if self.poisoning is not None:
            uplinks = self.poisoning.forge(round, uplinks)
        if self.uplink is not None:  # last: compression is post-processing of what the client releases
            uplinks = self._compress_all(part, round, {ctx.client: ctx for ctx in contexts}, uplinks, waiting)
        for client, own in waiting.items():
            if (state := self._full_state(client, own, spec)) is not None:
                self._stage(round, client, state)
        if self.secure_sum is not None:
            self._secure(part, arrivals, round, uplinks, spec)
        for client, uplink in uplinks if self.secure_sum is None else ():
            arrived = self.channel.send(Direction.UP, round, client, uplink)
            if arrived is None:
                continue
            self.admit(part, arrivals, round, client, arrived, spec)
        part.accumulated = self.accumulate(arrivals)
        if self.keep_arrivals:
            part.arrivals = arrivals
        self._held = {}
        return part

    def _compress_all(self, part, round, contexts, uplinks, waiting) -> list[tuple[int, Message]]:
        """Each uplink compressed by its client. A client whose compression fails (a non-finite
        update: its block scales cannot be encoded, nor its error memory rebuilt) fails alone, as
        in a deployment its ClientApp would: logged, nothing sent, its state (memory included) not
        staged; the round goes on without it."""
        sent = []
        for client, uplink in uplinks:
            try:
                sent.append((client, self._compress(round, client, uplink)))
            except Exception as error:
                error = self._failed(contexts[client], error)
                part.failed.append((client, f"{type(error).__name__}: {error}"))
                del waiting[client]
        return sent

    def _compress(self, round: int, client: int, uplink: Message) -> Message:
        assert self.uplink is not None
        held = self._held[client]
        sent, links = self.uplink.send(round, client, uplink, held.links)
        if links is not held.links:
            held.links, held.changed = links, True
        return sent

    def _full_state(self, client: int, own: ClientState | None, spec) -> ClientState | None:
        """The state to store for ``client``: its new algorithm state (None: unchanged) with the links'
        part; None when neither changed. Error memory is always complete (zeros where nothing was
        dropped yet), so every state a client stores has one layout (core/disk_store.py)."""
        held = self._held[client]
        if own is None and not held.changed:
            return None
        links = held.links
        if self.uplink is not None and self.uplink.stateful:
            links = self.uplink.memory_template(spec) | links
        state = {**(own if own is not None else held.own or {}), **links}
        return state or None

    def _secure(self, part, arrivals, round, uplinks, spec) -> None:
        """Secure aggregation instead of plain uplinks: each client quantises its update and takes
        part in SecAgg (secagg/protocol.py, every message on the channel); the server gets the
        sum over the clients that made it to the end, and its mean stands for the round's updates.
        The server cannot check updates it cannot see: quantisation clips every coordinate."""
        assert self.secure_sum is not None
        config = self.secure_sum.config
        names = sorted(spec)
        inputs = {}
        for client, uplink in uplinks:
            if set(uplink.arrays) != set(names) or any(
                uplink.arrays[n].shape != spec[n].shape for n in names
            ):
                part.rejected.append((client, "its update does not fit the secure-aggregation vector"))
                continue
            inputs[client] = np.concatenate([uplink.arrays[n].reshape(-1) for n in names])
        if not inputs:
            return
        level = levels(len(inputs), config.bits)
        quantized = {c: quantize(x, config.clip, level) for c, x in inputs.items()}
        try:
            survivors, total = self.secure_sum.run(self.channel, round, quantized)
        except SecAggFailed as error:
            why = "secure aggregation failed" + ("" if self.private else f": {error}")  # it may name a client
            log.warning("round %d: %s", round, why)
            part.rejected += [(c, why) for c in inputs]
            return
        if not survivors:
            return
        mean = dequantize_sum(total, config.clip, level, len(survivors)) / len(survivors)
        arrays, offset = {}, 0
        for n in names:
            size = int(np.prod(spec[n].shape))
            arrays[n] = mean[offset : offset + size].reshape(spec[n].shape).astype(spec[n].dtype)
            offset += size
        part.accepted += survivors
        arrivals.append(secure_mean(arrays, len(survivors)))

    def accumulate(self, arrivals: Sequence[Arrival]) -> Any:
        return list(arrivals) if self.per_client else self.algorithm.accumulate(arrivals)

    def combine(self, partials: Sequence[Any]) -> Any:
        if self.per_client:
            return [arrival for partial in partials for arrival in partial]
        return self.algorithm.combine(partials)

    def admit(
        self,
        part: RoundPart,
        arrivals: list[Arrival],
        round: int,
        client: int,
        arrived: Message,
        spec: Mapping[str, ArraySpec],
    ) -> None:
        """The server's check of an uplink that arrived (in simulation or from a deployed node):
        rejected with a reason, or accepted into ``arrivals`` with the weight the server trusts."""
        if self.uplink is not None:
            try:
                arrived = self.uplink.receive(round, client, arrived, spec)
            except CompressionError as error:
                log.warning("round %d: rejected the update of %s: %s", round, self._who(client), error)
                part.rejected.append((client, str(error)))
                return
        reason = (
            uplink_problem(arrived, spec)
            or self.algorithm.check_uplink_meta(arrived)
            or overflow_problem(arrived, self.algorithm.total_weight)
        )
        if reason is not None:
            log.warning("round %d: rejected the update of %s: %s", round, self._who(client), reason)
            part.rejected.append((client, reason))
            return
        arrived = self.trust.apply(client, arrived)
        part.accepted.append(client)
        if self.keep_statistics and isinstance(loss := arrived.meta.get("train_loss"), float):
            part.losses.append(loss)
        arrivals.append(Arrival(client, arrived))

    def _who(self, client: int) -> str:
        return "a client" if self.private else f"client {client}"

    def _failed(self, ctx: ClientContext, error: Exception) -> Exception:
        log.error(
            "%s failed in round %d: %s: %s",
            self._who(ctx.client),
            ctx.round,
            type(error).__name__,
            error,
            exc_info=error,
        )
        return error

    def _stage(self, round: int, client: int, state: ClientState) -> None:
        if self._staged_round != round:  # an earlier round never committed: nothing of it was accepted
            self._staged, self._staged_round = {}, round
        self._staged[client] = state

    def commit(self, round: int, accepted: Iterable[int]) -> None:
        """Store the staged state of the clients whose uplink the server accepted in ``round``;
        forget the rest (their uplink was dropped or rejected, or the round was discarded)."""
        if self._staged_round not in (None, round):
            raise RuntimeError(
                f"commit for round {round}, but the staged state is round {self._staged_round}'s"
            )
        for client in accepted:
            if (state := self._staged.get(client)) is not None:
                self.store.put(client, state)
        self._staged, self._staged_round = {}, None


def secure_mean(arrays: dict[str, np.ndarray], survivors: int) -> Arrival:
    """The unmasked mean of a secure sum, one arrival standing for its ``survivors``' updates with
    equal weights (the simulated [secagg] and the deployed SecAgg+ alike, deploy/secagg.py)."""
    return Arrival(SERVER, Message(arrays, {"num_samples": survivors, "clients": survivors}))


def without_statistics(uplink: Message) -> Message:
    """``uplink`` without the metadata that only reports on training (no mechanism covers it)."""
    return Message(uplink.arrays, {k: v for k, v in uplink.meta.items() if k not in STATISTICS})


def merge(pipeline: ClientPipeline, parts: Sequence[RoundPart], clients: Sequence[int]) -> RoundPart:
    """One part from several (each covering other clients), its client lists in the round's order
    ``clients`` whichever worker served whom."""
    merged = RoundPart(accumulated=pipeline.combine([p.accumulated for p in parts]))
    for p in parts:
        merged.accepted += p.accepted
        merged.rejected += p.rejected
        merged.failed += p.failed
        merged.losses += p.losses
        merged.client_info.update(p.client_info)
        merged.arrivals += p.arrivals
        merged.heard += p.heard
        merged.settled += p.settled
    order = {c: i for i, c in enumerate(clients)}
    merged.accepted.sort(key=order.__getitem__)
    merged.rejected.sort(key=lambda item: order[item[0]])
    merged.failed.sort(key=lambda item: order[item[0]])
    return merged
