"""The SuperNodes of a deployed run as the server sees them: which clients each hosts, and what it
runs, asked through Flower's Grid.

* Which node hosts which client: each node says so in its answer to a ``query`` message
  (protocol.py), with its taciturn version and its clients' sizes. Nodes are asked when first seen:
  before round 1 (``census``) and at the start of each round (``discover``), so a restarted node
  (a new node id) is found again and takes its clients back, and a node that left is forgotten.
* The census, before round 1, is strict: every node online then must answer, with the server's
  taciturn version, and with per-client data the clients must be 0 .. N-1, each on one node, all
  with the same shapes. Otherwise the run stops before it starts, naming each node and why: a
  node that cannot read its data must not shrink the federation silently.
* Later, a node that does not answer, runs another version, or whose clients' sizes are not those
  of the run (other data) is left out with a warning naming it by its node id, and its clients
  count as dropped.
* Federated evaluation (``evaluate``): the global model goes to every node hosting a client with
  a held-out split; each answers its clients' scores (tasks/federated_eval.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from flwr.app import Message as FlowerMessage
from flwr.serverapp import Grid

from taciturn import __version__
from taciturn.core.message import Message
from taciturn.data.clients import Schema
from taciturn.deploy import protocol
from taciturn.deploy.protocol import GONE, Hosted
from taciturn.deploy.settings import DeployError
from taciturn.experiments.clients import Census, Population
from taciturn.tasks.federated_eval import Scores

log = logging.getLogger(__name__)

POLL_S = 0.02  # between pulls of replies (Flower's own send_and_receive sleeps 3 s)


class Nodes:
    def __init__(self, grid: Grid, round_timeout: float, min_nodes: int = 1, one_client_each: bool = False):
        self.grid, self.round_timeout, self.min_nodes = grid, round_timeout, min_nodes
        self.one_client_each = one_client_each  # SecAgg+ hides a node's update, not a client's
        self.hosts: dict[int, int] = {}  # client -> node id
        self.nodes: set[int] = set()  # nodes that said which clients they host
        self.expected: dict[int, int] | None = None  # client -> the run's size for it
        self.test_sizes: dict[int, int] = {}  # per-client data: client -> held-out samples
        self.left_out: dict[int, str] = {}  # online nodes not taken at the last discovery, and why

    # ----- talking to nodes -----
    def exchange(self, messages: Sequence[FlowerMessage]) -> dict[str, FlowerMessage]:
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

    def ask(self, nodes: Sequence[int], kind: str, contents: Mapping[int, object], group: str):
        """Send each node its content; (node, reply or None) for each, in ``nodes`` order."""
        messages = {
            node: FlowerMessage(contents[node], node, kind, group_id=group, ttl=self.round_timeout)
            for node in nodes
        }
        replies = self.exchange(list(messages.values()))
        return [(node, replies.get(message.metadata.message_id)) for node, message in messages.items()]

    @staticmethod
    def problem(reply: FlowerMessage | None, timeout: float) -> str | None:
        """Why a reply carries nothing usable (None: it does)."""
        if reply is None:
            return f"no answer in {timeout:g} s"
        if reply.has_error():
            if reply.error.code in GONE:
                return "it left the SuperLink"
            return f"its ClientApp failed: {reply.error.reason}"
        return None

    # ----- who hosts whom -----
    def online(self, strict: bool = False) -> set[int]:
        """The connected nodes, once ``min_nodes`` of them are (or the round timeout passed: an
        error if ``strict``, else a warning)."""
        deadline = time.monotonic() + self.round_timeout
        while len(online := set(self.grid.get_node_ids())) < self.min_nodes and time.monotonic() < deadline:
            time.sleep(0.2)
        if len(online) < self.min_nodes:
            why = f"only {len(online)} of min-nodes {self.min_nodes} SuperNodes connected"
            why += f" after {self.round_timeout:g} s"
            if strict:
                raise DeployError(f"{why}: start the nodes (docs/deploy.md, step 3), or lower --min-nodes")
            log.warning("%s; going on", why)
        return online

    def hosted(self, nodes: Sequence[int]) -> tuple[dict[int, Hosted], dict[int, str]]:
        """What each node says it hosts, and why a node said nothing usable."""
        answers, problems = {}, {}
        content = protocol.version_request(__version__)
        for node, reply in self.ask(nodes, protocol.QUERY, dict.fromkeys(nodes, content), "hosts"):
            if (why := self.problem(reply, self.round_timeout)) is not None:
                problems[node] = why
                continue
            try:
                hosted = protocol.read_query_reply(reply.content)
            except Exception as error:  # any decode failure (not only CodecError) is the node's failure
                problems[node] = f"a malformed answer: {error}"
                continue
            if hosted.version != __version__:
                problems[node] = (
                    f"taciturn versions differ: {hosted.version} on the node, {__version__} on the "
                    "server; install the same version on the server and every node"
                )
                continue
            if self.one_client_each and len(hosted.sizes) > 1:
                raise DeployError(
                    f"node {node} hosts clients {list(hosted.sizes)}; under [secagg] each node hosts one "
                    "client, since SecAgg+ hides a node's update, not a client's"
                )
            answers[node] = hosted
        return answers, problems

    def take(self, node: int, clients: Sequence[int]) -> None:
        self.nodes.add(node)
        for client in clients:
            self.hosts[client] = node
        log.info("node %d hosts clients %s", node, list(clients))

    def discover(self) -> None:
        """At the start of a round: forget the nodes that left, ask the new ones."""
        online = self.online()
        for gone in self.nodes - online:
            self.hosts = {c: n for c, n in self.hosts.items() if n != gone}
        self.nodes &= online
        new = sorted(online - self.nodes)
        self.left_out = {}
        if not new:
            return
        answers, problems = self.hosted(new)
        for node, why in problems.items():
            log.warning("node %d is left out: %s", node, why)
            self.left_out[node] = why
        for node, hosted in answers.items():
            expected = {c: (self.expected or {}).get(c) for c in hosted.sizes}
            if (
                hosted.sizes != expected
            ):  # it read other data, or split it otherwise: its updates would not fit
                log.warning(
                    "node %d is left out: its clients' sizes %s differ from the run's %s (the node's "
                    "data is not the run's, or it splits it otherwise)",
                    node,
                    hosted.sizes,
                    expected,
                )
                self.left_out[node] = "its data is not the run's"
                continue
            self.take(node, list(hosted.sizes))

    def census(self, must_match: Sequence[int] | None = None) -> Census:
        """Before round 1, with per-client data: every client's sizes and the data's schema, from
        every node online (at least min-nodes); any problem stops the run here, named."""
        online = sorted(self.online(strict=True))
        answers, problems = self.hosted(online)
        lines = [f"node {node}: {why}" for node, why in problems.items()]
        owners: dict[int, int] = {}
        for node, hosted in answers.items():
            if hosted.schema is None:
                lines.append(f"node {node}: it does not read per-client data (a node of another run?)")
                continue
            for client in hosted.sizes:
                if client in owners:
                    lines.append(f"client {client} is on node {owners[client]} and node {node}")
                owners[client] = node
        wanted = list(range(len(owners)))
        if not lines and sorted(owners) != wanted:
            missing = sorted(set(range(max(owners, default=-1) + 1)) - set(owners))
            lines.append(
                f"the clients are {sorted(owners)}: every id 0 .. N-1 must be on one node, and "
                f"{missing} are on none (start their nodes, or number the clients from 0)"
            )
        if lines:
            raise DeployError("before round 1: " + "; ".join(lines))
        schema = self._schema({node: answers[node].schema for node in answers})
        sizes = [answers[owners[c]].sizes[c] for c in wanted]
        tests = [answers[owners[c]].test_sizes[c] for c in wanted]
        if must_match is not None and list(must_match) != sizes:
            raise DeployError(
                f"the nodes' clients have {sizes} training samples, the run being resumed had "
                f"{list(must_match)}: its data changed; start a new run instead"
            )
        for node, hosted in sorted(answers.items()):
            self.take(node, list(hosted.sizes))
        self.expected = dict(enumerate(sizes))
        self.test_sizes = dict(enumerate(tests))
        return Census(sizes, tests, schema)

    @staticmethod
    def _schema(schemas: Mapping[int, Schema]) -> Schema:
        (first, head), *rest = sorted(schemas.items())
        for node, schema in rest:
            if (schema.input_shape, schema.target_shape) != (head.input_shape, head.target_shape):
                raise DeployError(
                    f"before round 1: node {node}'s samples are {schema.input_shape} -> "
                    f"{schema.target_shape}, node {first}'s {head.input_shape} -> {head.target_shape}: "
                    "every client's data must have the same shapes"
                )
            if (schema.classes == 0) != (head.classes == 0):
                raise DeployError(
                    f"before round 1: node {node} and node {first} disagree on the targets: class labels on "
                    "one, floating targets on the other"
                )
        classes = max(s.classes for s in schemas.values())
        return Schema(head.input_shape, classes, head.target_shape)

    # ----- federated evaluation -----
    def evaluate(self, params, population: Population) -> list[Scores]:
        """The global model scored by every node hosting a client with a held-out split."""
        holders = sorted({n for c, n in self.hosts.items() if self.test_sizes.get(c)})
        payload = protocol.payload_of(Message.from_tensors({k: v.detach().cpu() for k, v in params.items()}))
        content = protocol.evaluate_request(__version__, population.fields(), payload)
        scores: list[Scores] = []
        for node, reply in self.ask(holders, protocol.EVALUATE, dict.fromkeys(holders, content), "evaluate"):
            if (why := self.problem(reply, self.round_timeout)) is not None:
                log.warning("evaluation: node %d is left out: %s", node, why)
                continue
            try:
                answers = protocol.read_evaluate_reply(reply.content)
            except Exception as error:  # any decode failure (not only CodecError) is the node's failure
                log.warning("evaluation: node %d is left out: a malformed answer: %s", node, error)
                continue
            theirs = {c: n for c, n, _ in answers}
            ours = {
                c: self.test_sizes[c] for c, n in self.hosts.items() if n == node and self.test_sizes.get(c)
            }
            if theirs != ours:
                log.warning(
                    "evaluation: node %d is left out: it scored clients and samples %s, not %s",
                    node,
                    theirs,
                    ours,
                )
                continue
            scores += [Scores(c, n, metrics) for c, n, metrics in answers]
        return scores
