"""The server side of a deployed round: each picked client's downlink goes to the SuperNode that
hosts it through Flower's Grid, and what comes back is checked and reduced as in simulation.

It is an executor (engine/executor.py) like the sequential one, so the round loop, the run
directory, metrics, ledger, checkpoints and report are experiments/runner.py's, unchanged.

* Clients to nodes: each node says which clients it hosts and their sizes on its data (a
  ``query`` message, protocol.py), asked of every node the server has not heard from yet, at the
  start of each round; a node whose sizes are not the run's is left out (its data is another);
  a node that left is forgotten, and a restarted node is found again and takes its clients back.
* A round: one ``train`` message per picked client (an empty payload when the algorithm sends it
  nothing), pushed at once; replies are pulled until all are in or ``round_timeout`` passes. A
  client whose node is gone or silent past the timeout is dropped, exactly like a message the
  simulated Channel drops: its downlink is counted as sent, not delivered, and nothing arrives.
* Ledger: payload bytes as in simulation (the codec's encoded size, counted only for messages
  that carry a model), plus ``wire_bytes``: the serialized Flower messages, every one of them.
* SecAgg+ ([secagg] on): the round runs Flower's SecAgg+ workflow instead (secagg.py): the server
  sees only the weighted mean of the nodes' updates; every message of its four stages is metered.
* Acceptance: the server tells each client, with its next request, the last round whose reply it
  took (an uplink it applied, or an empty reply: the client stayed silent); the node trains from
  its state of that round (node_state.py). These acknowledgements are saved with each checkpoint,
  so a resumed server names the states in effect then, and the run goes on exactly as it would
  have without the interruption.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message as FlowerMessage
from flwr.app import RecordDict
from flwr.serverapp import Grid

from taciturn.algorithms.base import ArraySpec
from taciturn.core.codec import CodecError
from taciturn.core.ledger import Direction
from taciturn.core.message import Message
from taciturn.deploy import protocol
from taciturn.deploy.protocol import GONE
from taciturn.deploy.secagg import secure_round
from taciturn.deploy.settings import DeployError
from taciturn.engine.executor import Executor
from taciturn.engine.pipeline import ClientPipeline, RoundPart
from taciturn.secagg.config import SecAggConfig

log = logging.getLogger(__name__)

POLL_S = 0.05  # between pulls of replies (Flower's own send_and_receive sleeps 3 s)
ACKNOWLEDGED = "acknowledged"  # the checkpoint file (experiments/checkpoint.py, extras)


@dataclass
class Acknowledged:
    """For each client, the last round whose reply the server took (0: none), as a checkpoint keeps it."""

    rounds: np.ndarray  # int64, one entry per client


class GridExecutor(Executor):
    name = "flower"

    def __init__(
        self,
        pipeline: ClientPipeline,
        grid: Grid,
        round_timeout: float,
        secagg: SecAggConfig | None = None,
        min_nodes: int = 1,
    ):
        super().__init__(pipeline)
        self.grid = grid
        self.round_timeout = round_timeout
        self.min_nodes = min_nodes
        self.secagg = secagg  # SecAgg+ through Flower's workflow (secagg.py), if on
        self.hosts: dict[int, int] = {}  # client -> node id
        self.nodes: set[int] = set()  # nodes that said which clients they host
        self.accepted: dict[int, int] = {}  # client -> last round whose reply the server took
        self.kept: dict[int, int] = {}  # the same at the last checkpoint

    # ----- which node hosts which client -----
    def online(self) -> set[int]:
        """The connected nodes, once ``min_nodes`` of them are (or the round timeout passed)."""
        deadline = time.monotonic() + self.round_timeout
        while len(online := set(self.grid.get_node_ids())) < self.min_nodes and time.monotonic() < deadline:
            time.sleep(10 * POLL_S)
        if len(online) < self.min_nodes:
            log.warning("only %d of min-nodes %d SuperNodes connected; going on", len(online), self.min_nodes)
        return online

    def discover(self) -> None:
        online = self.online()
        for gone in self.nodes - online:
            self.hosts = {c: n for c, n in self.hosts.items() if n != gone}
        self.nodes &= online
        new = sorted(online - self.nodes)
        if not new:
            return
        asks = [
            FlowerMessage(RecordDict(), node, protocol.QUERY, group_id="hosts", ttl=self.round_timeout)
            for node in new
        ]
        for reply in self._exchange(asks).values():
            if reply.has_error():
                log.warning(
                    "node %d could not say which clients it hosts: %s",
                    reply.metadata.src_node_id,
                    reply.error.reason,
                )
                continue
            try:
                sizes = protocol.read_query_reply(reply.content)
            except Exception as error:  # whatever a node's bytes make fail is that node's failure
                log.warning("node %d: malformed query reply: %s", reply.metadata.src_node_id, error)
                continue
            node, clients = reply.metadata.src_node_id, list(sizes)
            data = self.pipeline.data
            expected = {c: data.client_size(c) if c < data.num_clients else None for c in clients}
            if sizes != expected:  # it read other data, or split it otherwise: its updates would not fit
                log.warning(
                    "node %d is left out: its clients' sizes %s differ from the run's %s (the node's "
                    "data is not the run's dataset, or it splits it otherwise)",
                    node,
                    sizes,
                    expected,
                )
                continue
            if self.secagg is not None and len(clients) > 1:
                raise DeployError(
                    f"node {node} hosts clients {list(clients)}; under [secagg] each node hosts one "
                    "client, since SecAgg+ hides a node's update, not a client's"
                )
            self.nodes.add(node)
            for client in clients:
                self.hosts[client] = node
            log.info("node %d hosts clients %s", node, list(clients))

    def _exchange(self, messages: Sequence[FlowerMessage]) -> dict[str, FlowerMessage]:
        """Push ``messages`` and pull replies until all are in or the round timeout passes; the
        replies by the id of the message they answer."""
        ids = [i for i in self.grid.push_messages(messages) if i]
        waiting, replies = set(ids), {}
        deadline = time.monotonic() + self.round_timeout
        while waiting and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(waiting)):
                replies[reply.metadata.reply_to_message_id] = reply
                waiting.discard(reply.metadata.reply_to_message_id)
            if waiting:
                time.sleep(POLL_S)
        return replies

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

    def request(self, round: int, client: int, payload: bytes) -> protocol.TrainRequest:
        return protocol.TrainRequest(
            round, client, self.accepted.get(client, 0), self.kept.get(client, 0), payload
        )

    # ----- a round -----
    def serve(
        self,
        round: int,
        clients: Sequence[int],
        downlink: Mapping[int, Message | None],
        spec: Mapping[str, ArraySpec],
    ) -> RoundPart:
        self.discover()
        ledger = self.pipeline.channel.ledger
        payloads = {c: protocol.payload_of(downlink.get(c)) for c in clients}
        if self.secagg is not None:
            for client in clients:
                if client not in self.hosts:
                    log.warning("round %d: no node hosts client %d; it is dropped", round, client)
            nodes = {c: self.hosts[c] for c in clients if c in self.hosts}
            return secure_round(
                self.pipeline, self._exchange, self.secagg, self.round_timeout, round, nodes,
                {c: self.request(round, c, payloads[c]) for c in nodes}, spec,
            )  # fmt: skip
        requests: dict[int, FlowerMessage] = {}
        for client in clients:
            node = self.hosts.get(client)
            if node is None:
                log.warning("round %d: no node hosts client %d; it is dropped", round, client)
                continue
            content = self.request(round, client, payloads[client]).content()
            request = FlowerMessage(
                content, node, protocol.TRAIN, group_id=str(round), ttl=self.round_timeout
            )
            ledger.record_wire(round, client, Direction.DOWN, protocol.wire_size(request))
            requests[client] = request
        replies = self._exchange(list(requests.values()))
        part, arrivals = RoundPart(accumulated=None), []
        for client in clients:
            request = requests.get(client)
            reply = None if request is None else replies.get(request.metadata.message_id)
            arrived = reply is not None and not (reply.has_error() and reply.error.code in GONE)
            if payloads[client]:
                ledger.record(round, client, Direction.DOWN, len(payloads[client]), delivered=arrived)
            if reply is None:
                if request is not None:
                    log.warning(
                        "round %d: client %d did not reply in %g s; dropped",
                        round,
                        client,
                        self.round_timeout,
                    )
                continue
            if not arrived:  # the SuperLink's own error reply: nothing came from the node
                log.warning("round %d: client %d's node is gone; dropped", round, client)
                continue
            ledger.record_wire(round, client, Direction.UP, protocol.wire_size(reply))
            if reply.has_error():
                part.failed.append((client, reply.error.reason))
                continue
            try:
                answer = protocol.read_reply(reply.content)
                if (answer.round, answer.client) != (round, client):
                    raise CodecError(f"reply for client {answer.client} in round {answer.round}")
                uplink = protocol.message_of(answer.payload)
            except Exception as error:  # any decode failure (not only CodecError) is this node's failure
                part.rejected.append((client, f"malformed reply: {error}"))
                continue
            if uplink is None:  # the client stayed silent: its state takes effect (engine/pipeline.py)
                self.accepted[client] = round
                continue
            ledger.record(round, client, Direction.UP, len(answer.payload), delivered=True)
            self.pipeline.admit(part, arrivals, round, client, uplink, spec)
        part.accumulated = self.pipeline.accumulate(arrivals)
        return part
