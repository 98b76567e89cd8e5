"""The server side of a deployed round: each node hosting picked clients gets one message with
their downlinks through Flower's Grid, and what comes back is checked and reduced as in simulation.

It is an executor (engine/executor.py) like the sequential one, so the round loop, the run
directory, metrics, ledger, checkpoints and report are experiments/runner.py's, unchanged.

* Clients to nodes: nodes.py (asked at the start of each round; a node whose data is not the
  run's is left out; a restarted node is found again and takes its clients back).
* A round: one ``train`` message per node hosting picked clients, carrying each one's request
  (an empty payload when the algorithm sends it nothing), pushed at once; replies are pulled until
  all are in or ``round_timeout`` passes. The clients of a node that is gone or silent past the
  timeout are dropped, exactly like messages the simulated Channel drops: their downlinks are
  counted as sent, not delivered, and nothing arrives. Uplinks are admitted in the round's client
  order, as the simulation admits them, whichever node answered first.
* Ledger: payload bytes as in simulation (the codec's encoded size, counted only for messages
  that carry a model), plus ``wire_bytes``: the serialized Flower messages, every one of them, each
  split over the clients it carries (protocol.py ``shares``).
* SecAgg+ ([secagg] on): the round runs Flower's SecAgg+ workflow instead (secagg.py): the server
  sees only the weighted mean of the nodes' updates; every message of its four stages is metered.
* Acceptance: the server tells each client, with its next request, the last round whose reply it
  took (an uplink it applied, or an empty reply: the client stayed silent); the node trains from
  its state of that round (node_state.py). These acknowledgements are saved with each checkpoint,
  so a resumed server names the states in effect then, and the run goes on exactly as it would
  have without the interruption.
* The floor: a round in which fewer than ``min_trained`` picked clients trained falls short; after
  ``patience`` short rounds in a row the run stops with an error that says why the clients were
  missing (a run that trained on almost nobody does not succeed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Message as FlowerMessage

from taciturn import __version__
from taciturn.algorithms.base import ArraySpec
from taciturn.core.codec import CodecError
from taciturn.core.ledger import Direction
from taciturn.core.message import Message
from taciturn.deploy import protocol
from taciturn.deploy.nodes import Nodes
from taciturn.deploy.protocol import GONE
from taciturn.deploy.secagg import secure_round
from taciturn.deploy.settings import DeployError
from taciturn.engine.executor import Executor
from taciturn.engine.pipeline import ClientPipeline, RoundPart
from taciturn.secagg.config import SecAggConfig

log = logging.getLogger(__name__)

ACKNOWLEDGED = "acknowledged"  # the checkpoint file (experiments/checkpoint.py, extras)


@dataclass
class Acknowledged:
    """For each client, the last round whose reply the server took (0: none), as a checkpoint keeps it."""

    rounds: np.ndarray  # int64, one entry per client


@dataclass
class Floor:
    """At least ``min_trained`` picked clients train a round; ``patience`` short rounds in a row
    end the run."""

    min_trained: int = 1
    patience: int = 3
    short: list[str] = field(default_factory=list)  # why each short round of the current streak fell short

    def check(self, round: int, picked: int, trained: int, why: str) -> None:
        if trained >= min(self.min_trained, picked) or not picked:
            self.short = []
            return
        self.short.append(f"round {round}: {trained} of {picked} trained ({why})")
        log.warning(
            "round %d fell short of the floor: %d of %d picked clients trained (%s)",
            round,
            trained,
            picked,
            why,
        )
        if len(self.short) >= self.patience:
            raise DeployError(
                f"fewer than min-trained = {self.min_trained} clients trained in {self.patience} rounds in "
                f"a row, so the run stops: {'; '.join(self.short)}. Bring the nodes back (their logs say "
                "why they failed) and continue with resume=true, or lower min-trained / raise patience"
            )


class GridExecutor(Executor):
    name = "flower"

    def __init__(
        self,
        pipeline: ClientPipeline,
        nodes: Nodes,
        secagg: SecAggConfig | None = None,
        floor: Floor | None = None,
        population: Sequence[int] = (),
    ):
        super().__init__(pipeline)
        self.nodes = nodes
        self.round_timeout = nodes.round_timeout
        self.secagg = secagg  # SecAgg+ through Flower's workflow (secagg.py), if on
        self.floor = floor or Floor()
        self.population = list(population)  # per-client data: the run-wide numbers each request carries
        self.accepted: dict[int, int] = {}  # client -> last round whose reply the server took
        self.kept: dict[int, int] = {}  # the same at the last checkpoint
        data = pipeline.data
        if nodes.expected is None:  # the run's dataset, split here: every node must split it alike
            nodes.expected = {c: data.client_size(c) for c in range(data.num_clients)}
        per_round = pipeline.algorithm.config.clients_per_round(data.num_clients)
        if self.floor.min_trained > per_round:
            raise DeployError(
                f"min-trained = {self.floor.min_trained}, but a round picks {per_round} clients: it could "
                "never be met; lower min-trained"
            )

    def commit(self, round: int, accepted: Sequence[int]) -> None:
        """The commit protocol (engine/executor.py) across the network: remember the round of each
        client's last applied uplink; its next request tells its node to train from its state then."""
        for client in accepted:
            self.accepted[client] = round

    def checkpoint_extras(self) -> dict[str, Any]:
        rounds = np.zeros(self.pipeline.data.num_clients, np.int64)
        for client, round in self.accepted.items():
            rounds[client] = round
        return {ACKNOWLEDGED: Acknowledged(rounds)}

    def checkpointed(self, extras: Mapping[str, Any]) -> None:
        saved = extras.get(ACKNOWLEDGED)  # None: a checkpoint written before acknowledgements were kept
        self.kept = {} if saved is None else {c: int(r) for c, r in enumerate(saved.rounds) if r}
        self.accepted = dict(self.kept)

    def request(
        self, round: int, clients: Sequence[int], payloads: Mapping[int, bytes]
    ) -> protocol.TrainRequest:
        return protocol.TrainRequest(
            __version__,
            round,
            tuple(self.population),
            tuple(clients),
            tuple(self.accepted.get(c, 0) for c in clients),
            tuple(self.kept.get(c, 0) for c in clients),
            tuple(payloads[c] for c in clients),
        )

    # ----- a round -----
    def serve(
        self,
        round: int,
        clients: Sequence[int],
        downlink: Mapping[int, Message | None],
        spec: Mapping[str, ArraySpec],
    ) -> RoundPart:
        self.nodes.discover()
        payloads = _payloads(downlink, clients)
        hosts = self.nodes.hosts
        missing = [c for c in clients if c not in hosts]
        if missing:
            log.warning("round %d: no node hosts %s; they are dropped", round, self._who(missing))
        if self.secagg is not None:
            nodes = {c: hosts[c] for c in clients if c in hosts}
            part = secure_round(
                self.pipeline, self.nodes.exchange, self.secagg, self.round_timeout, round, nodes,
                {c: self.request(round, [c], payloads) for c in nodes}, spec,
            )  # fmt: skip
            why = _reasons(part, missing, left_out=self.nodes.left_out, private=self.pipeline.private)
            self.floor.check(round, len(clients), len(part.accepted), why)
            return part
        part, outcome = self._exchange_round(round, clients, payloads)
        arrivals, silent = [], 0
        for client in clients:  # in the round's order, as the simulation admits them
            result = outcome.get(client)
            if result is None:
                continue
            kind, value = result
            if kind == "failed":
                part.failed.append((client, value))
            elif kind == "rejected":
                part.rejected.append((client, value))
            elif value is None:  # the client stayed silent: its state takes effect (engine/pipeline.py)
                self.accepted[client] = round
                silent += 1
            else:
                self.pipeline.admit(part, arrivals, round, client, value, spec)
        part.accumulated = self.pipeline.accumulate(arrivals)
        trained = len(part.accepted) + silent
        log.info("round %d: %d of %d picked clients trained", round, trained, len(clients))
        why = _reasons(part, missing, self.dropped, self.nodes.left_out, self.pipeline.private)
        self.floor.check(round, len(clients), trained, why)
        return part

    def _exchange_round(self, round: int, clients: Sequence[int], payloads: Mapping[int, bytes]):
        """One message to each node hosting picked clients; each client's outcome: ("failed" |
        "rejected", reason) or ("arrived", its uplink or None for silence); absent: dropped."""
        ledger = self.pipeline.channel.ledger
        by_node: dict[int, list[int]] = {}
        for client in clients:
            if (node := self.nodes.hosts.get(client)) is not None:
                by_node.setdefault(node, []).append(client)
        requests = {
            node: FlowerMessage(
                self.request(round, hosted, payloads).content(),
                node,
                protocol.TRAIN,
                group_id=str(round),
                ttl=self.round_timeout,
            )
            for node, hosted in by_node.items()
        }
        for node, request in requests.items():
            sizes = [len(payloads[c]) for c in by_node[node]]
            for client, wire in zip(
                by_node[node], protocol.shares(protocol.wire_size(request), sizes), strict=True
            ):
                ledger.record_wire(round, client, Direction.DOWN, wire)
        replies = self.nodes.exchange(list(requests.values()))
        part, outcome, self.dropped = RoundPart(accumulated=None), {}, []
        for client in clients:  # a payload that never reached a node is sent, not delivered
            node = self.nodes.hosts.get(client)
            reply = None if node is None else replies.get(requests[node].metadata.message_id)
            if payloads[client]:
                arrived = reply is not None and not (reply.has_error() and reply.error.code in GONE)
                ledger.record(round, client, Direction.DOWN, len(payloads[client]), delivered=arrived)
        for node, hosted in by_node.items():
            reply = replies.get(requests[node].metadata.message_id)
            if (why := Nodes.problem(reply, self.round_timeout)) is not None and (
                reply is None or reply.error.code in GONE
            ):
                log.warning("round %d: node %d: %s; its %s are dropped", round, node, why, self._who(hosted))
                self.dropped.append(f"node {node}: {why}")
                continue
            outcome |= self._read_reply(round, node, hosted, reply)
        return part, outcome

    def _who(self, clients: Sequence[int]) -> str:
        """Picked clients as the log names them: by count in private runs, where who was picked is
        what sampling hides (as engine/pipeline.py's log)."""
        return f"{len(clients)} picked clients" if self.pipeline.private else f"clients {list(clients)}"

    def _read_reply(self, round: int, node: int, hosted: list[int], reply: FlowerMessage) -> dict:
        ledger = self.pipeline.channel.ledger
        if reply.has_error():  # the node's ClientApp raised: every client of the message failed
            for client, wire in zip(
                hosted, protocol.shares(protocol.wire_size(reply), [0] * len(hosted)), strict=True
            ):
                ledger.record_wire(round, client, Direction.UP, wire)
            log.warning("round %d: node %d failed: %s", round, node, reply.error.reason)
            return {c: ("failed", f"node {node}: {reply.error.reason}") for c in hosted}
        try:
            answer = protocol.read_reply(reply.content)
            if answer.round != round or list(answer.clients) != hosted:
                raise CodecError(f"a reply for clients {list(answer.clients)} in round {answer.round}")
        except Exception as error:  # any decode failure (not only CodecError) is the node's failure
            wires = protocol.shares(protocol.wire_size(reply), [0] * len(hosted))
            for client, wire in zip(hosted, wires, strict=True):
                ledger.record_wire(round, client, Direction.UP, wire)
            return {c: ("rejected", f"malformed reply: {error}") for c in hosted}
        sizes = [len(p) for p in answer.payloads]
        outcome = {}
        for client, payload, error, wire in zip(
            hosted,
            answer.payloads,
            answer.errors,
            protocol.shares(protocol.wire_size(reply), sizes),
            strict=True,
        ):
            ledger.record_wire(round, client, Direction.UP, wire)
            if error:
                outcome[client] = ("failed", error)
                continue
            if not payload:
                outcome[client] = ("arrived", None)
                continue
            ledger.record(round, client, Direction.UP, len(payload), delivered=True)
            try:
                outcome[client] = ("arrived", protocol.message_of(payload))
            except Exception as error:  # any decode failure (not only CodecError) is the node's failure
                outcome[client] = ("rejected", f"malformed reply: {error}")
        return outcome


def _payloads(downlink: Mapping[int, Message | None], clients: Sequence[int]) -> dict[int, bytes]:
    """Each picked client's downlink payload; a broadcast (one Message object sent to many clients)
    is encoded once, as the simulated channel encodes it (core/channel.py)."""
    encoded: dict[int, bytes] = {}  # id of a message in ``downlink`` (alive while it is) -> its bytes
    payloads = {}
    for client in clients:
        message = downlink.get(client)
        if id(message) not in encoded:
            encoded[id(message)] = protocol.payload_of(message)
        payloads[client] = encoded[id(message)]
    return payloads


def _reasons(
    part: RoundPart,
    missing: Sequence[int],
    dropped: Sequence[str] = (),
    left_out: Mapping[int, str] = {},
    private: bool = False,
) -> str:
    """Why the clients of a round that did not train, in a few words for the operator (``private``:
    naming no client)."""
    why = list(dropped)
    if missing:
        why.append(
            f"{len(missing)} picked clients on no node" if private else f"clients {list(missing)} on no node"
        )
    why += [f"node {node} is left out: {reason}" for node, reason in left_out.items()]
    for kind, items in (("failed", part.failed), ("rejected", part.rejected)):
        if items:
            client, reason = items[0]
            example = "a client" if private else f"client {client}"
            why.append(f"{len(items)} {kind}, e.g. {example}: {reason}")
    return "; ".join(why) or "nobody was picked"
