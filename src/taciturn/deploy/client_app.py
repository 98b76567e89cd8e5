"""The ClientApp each SuperNode runs: one client's round, on the node's own data and state.

A train request names the round, the client (one the node hosts), the server's acknowledgement
and the downlink payload. The node settles the client's staged state (node_state.py), runs the
algorithm's ``client_begin`` / local training (engine/local_training.py, the sequential
executor's trainer) / ``client_end`` exactly as the simulation does, and replies with the uplink
payload, or an empty one when the client stays silent. Data: the node builds the run's task from
the same config and seed as the server and trains only on the clients it hosts (a partition id
of a built-in dataset, as in Flower's own examples).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from taciturn.algorithms import Algorithm, build_algorithm
from taciturn.algorithms.base import ClientContext, ClientOutput, LocalTraining, Loss
from taciturn.core.rng import Streams
from taciturn.deploy import protocol
from taciturn.deploy.node_state import NodeStateStore
from taciturn.deploy.settings import DeployError, NodeSettings, run_config_of
from taciturn.engine.local_training import train_locally
from taciturn.engine.trust import TrustedWeights
from taciturn.tasks.base import ClientData

app = ClientApp()


@dataclass(frozen=True)
class NodeSetup:
    algorithm: Algorithm
    streams: Streams
    data: ClientData
    loss: Loss
    buffers: frozenset[str]


@lru_cache(maxsize=2)
def node_setup(config_text: str) -> NodeSetup:
    """The run's algorithm, streams, data and loss, built from its config (once per process)."""
    from taciturn.experiments.runner import build_task

    config = run_config_of(config_text)
    streams = Streams(config.seed)
    task, data = build_task(config, streams)
    algorithm = build_algorithm(config.algorithm)
    # what the server's ClientPipeline gives its algorithm, so both ends compute alike
    algorithm.use_streams(streams)
    algorithm.use_population(data.num_clients, TrustedWeights(config.server, data).total())
    return NodeSetup(algorithm, streams, data, task.loss, getattr(task, "buffers", frozenset()))


def serve_client(setup: NodeSetup, store: NodeStateStore, request: protocol.TrainRequest) -> bytes:
    """One client's round on this node; the uplink payload (empty: the client stays silent)."""
    algorithm, client = setup.algorithm, request.client
    store.settle(client, request.accepted)
    ctx = ClientContext(
        client,
        request.round,
        protocol.message_of(request.payload),
        store.get(client),
        setup.data.client_size(client),
        setup.streams,
        setup.data,
        setup.loss,
        setup.buffers,
    )
    begun = algorithm.client_begin(ctx)
    if isinstance(begun, LocalTraining):
        output = algorithm.client_end(
            ctx, begun, train_locally(algorithm, ctx, begun, algorithm.config.local)
        )
    else:
        output = begun
    assert isinstance(output, ClientOutput)
    if output.uplink is None:
        if output.state is not None:  # nothing sent, nothing to acknowledge
            store.put(client, output.state)
        return b""
    if output.state is not None:
        store.stage(client, request.round, output.state)
    return protocol.payload_of(output.uplink)


@app.train()
def train(message: Message, context: Context) -> Message:
    node = NodeSettings.from_node_config(context.node_config)
    request = protocol.read_request(message.content)
    if request.client not in node.clients:
        raise DeployError(f"this node hosts clients {list(node.clients)}, not client {request.client}")
    setup = node_setup(str(context.run_config["taciturn-config"]))
    if request.client >= setup.data.num_clients:
        raise DeployError(f"client {request.client} does not exist: the run has {setup.data.num_clients}")
    payload = serve_client(setup, NodeStateStore(node.state_dir), request)
    return Message(protocol.train_reply(request.round, request.client, payload), reply_to=message)


@app.query()
def query(message: Message, context: Context) -> Message:
    """Which clients this node hosts (the server maps clients to nodes with it)."""
    node = NodeSettings.from_node_config(context.node_config)
    return Message(protocol.query_reply(node.clients), reply_to=message)
