"""A Flower Grid in this process: the ServerApp's messages go straight to the ClientApp.

It is Flower's own Message, RecordDict, serialization and ClientApp dispatch, without SuperLink
processes, so the deployed round logic can be checked exactly against the simulation in
milliseconds (tests/test_deploy.py) and the framing Flower adds to taciturn's payloads measured
without a network (benchmarks/deploy.py). Not a transport: real runs go through a SuperLink. A reply
can be lost on purpose (``lose``), as a network would lose it, and a node can be down for some
rounds and come back under a new node id (``outages``), as a restarted SuperNode does, and the
server can be stopped in the middle of a round (``stop_in``: after the nodes served its requests,
before any reply reached it), as a killed ServerApp is, and a node can be one the SuperLink answers
for itself (``unavailable``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from taciturn.deploy import client_app, protocol
from taciturn.experiments.config import RunConfig, to_toml

SERVER_NODE = 0


class ServerStopped(Exception):
    """The server process died (``stop_in``)."""


class InProcessGrid(Grid):
    def __init__(
        self,
        config: RunConfig,
        hosts: list[list[int]],
        state_root: Path,
        lose=frozenset(),
        outages=None,
        node_data: dict[int, dict[str, str]] | None = None,
        stop_in: int | None = None,
        unavailable: dict[int, int] | None = None,
    ):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SERVER_NODE, 1
        self.run_config = {"taciturn-config": to_toml(config)}
        self.node_configs = {  # node_data: a node's own data.* settings (where its files are)
            node: {"clients": ",".join(map(str, clients)), "state-dir": str(state_root / f"node{node}")}
            | (node_data or {}).get(node, {})
            for node, clients in enumerate(hosts, start=1)
        }
        self.lose = set(lose)  # (round, client): the reply carrying that client's uplink never arrives
        self.outages = dict(outages or {})  # node -> (first, last) round it is down; then a new id
        self.round = 0  # the executor asks for the nodes once at the start of each round
        self.stop_in = stop_in  # the round (counted from this grid's first) in which the server dies
        # node -> the round from which the SuperLink answers for it (NODE_UNAVAILABLE, from its own
        # node id), as for a node it still lists but cannot reach
        self.unavailable = dict(unavailable or {})
        self.replies: dict[str, Message] = {}
        self.requests: list[Message] = []
        # each node's run state (the SecAgg+ mod keeps its keys there)
        self.states: dict[int, RecordDict] = {}
        self.client_app = client_app.secagg_app if config.secagg.enabled else client_app.app

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        self.round += 1
        for node, (_, last) in self.outages.items():
            if self.round == last + 1:  # restarted: same config and state folder, a new node id
                self.node_configs[100 + node] = self.node_configs[node]
        down = {n for n, (first, last) in self.outages.items() if first <= self.round}
        return [n for n in self.node_configs if n not in down]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id  # as Flower's grid does
            ids.append(message.object_id)
            self.requests.append(message)
            node = message.metadata.dst_node_id
            if self.round >= self.unavailable.get(node, self.round + 1):
                gone = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node unavailable")
                reply = Message(gone, reply_to=message)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
                self.replies[message.object_id] = reply
                continue
            state = self.states.setdefault(node, RecordDict())
            context = Context(1, node, self.node_configs[node], state, self.run_config)
            try:
                # a copy, as a node receives a deserialized one (mods edit what they receive)
                reply = self.client_app(copy.deepcopy(message), context)
            except Exception as error:  # the SuperNode turns a ClientApp's exception into an error reply
                reply = Message(Error(code=0, reason=f"{type(error).__name__}: {error}"), reply_to=message)
            if (
                protocol.RECORD in message.content.config_records
                and message.metadata.message_type == protocol.TRAIN
            ):
                request = protocol.read_request(message.content)
                if any((request.round, client) in self.lose for client in request.clients):
                    continue  # the node's reply, for all the clients it carries
            self.replies[message.object_id] = reply
        if self.round == self.stop_in:
            raise ServerStopped(f"the server stopped in round {self.round}, its requests served")
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("the deployed executor pushes and pulls itself")
