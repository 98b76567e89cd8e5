"""The ClientApp each SuperNode runs: one client's round, on the node's own data and state.

A train request names the round, the client (one the node hosts), the server's acknowledgements
and the downlink payload. The node takes the client's state the server names (node_state.py), runs
the algorithm's ``client_begin`` / local training (engine/local_training.py, the sequential
executor's trainer) / ``client_end`` exactly as the simulation does, and replies with the uplink
payload, or an empty one when the client stays silent. Data: the node builds the run's task from
the same config and seed as the server, reading the files where its node config says
(``data.*``, settings.py), and trains only on the clients (partition ids) it hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.compat.common import recorddict_compat as compat

from taciturn.algorithms import Algorithm, build_algorithm
from taciturn.algorithms.base import ClientContext, ClientOutput, LocalTraining, Loss
from taciturn.core.message import Message as TaciturnMessage
from taciturn.core.rng import Streams
from taciturn.deploy import protocol
from taciturn.deploy.node_state import NodeStateStore
from taciturn.deploy.settings import DeployError, NodeSettings, run_config_of, run_folder
from taciturn.engine.local_training import keep_optimizer, split_state, train_locally
from taciturn.engine.pipeline import without_statistics
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
    private: bool  # [privacy]: training statistics stay on the node (engine/pipeline.py)


@lru_cache(maxsize=2)
def node_setup(config_text: str, data: tuple[tuple[str, object], ...] = ()) -> NodeSetup:
    """The run's algorithm, streams, data and loss, built from its config with the node's own
    ``data.*`` settings (where its files are; once per process)."""
    from taciturn.experiments.runner import build_task

    config = run_config_of(config_text, data)
    streams = Streams(config.seed)
    task, data = build_task(config, streams)
    algorithm = build_algorithm(config.algorithm)
    # what the server's ClientPipeline gives its algorithm, so both ends compute alike
    algorithm.use_streams(streams)
    algorithm.use_population(data.num_clients, TrustedWeights(config.server, data).total())
    buffers = getattr(task, "buffers", frozenset())
    algorithm.use_buffers(buffers)  # averaged: local ones are refused
    return NodeSetup(algorithm, streams, data, task.loss, buffers, config.privacy.enabled)


def serve_client(
    setup: NodeSetup, store: NodeStateStore, request: protocol.TrainRequest
) -> TaciturnMessage | None:
    """One client's round on this node; its uplink (None: the client stays silent)."""
    algorithm, client = setup.algorithm, request.client
    state = store.settle(client, request.accepted, request.kept)
    own, optimizer_state = split_state(state)  # the algorithm's part; the optimizer's (when kept)
    ctx = ClientContext(
        client,
        request.round,
        protocol.message_of(request.payload),
        own,
        setup.data.client_size(client),
        setup.streams,
        setup.data,
        setup.loss,
        setup.buffers,
        optimizer_state,
    )
    begun = algorithm.client_begin(ctx)
    if isinstance(begun, LocalTraining):
        result = train_locally(algorithm, ctx, begun, algorithm.config.local)
        output = keep_optimizer(algorithm, ctx, algorithm.client_end(ctx, begun, result), result)
    else:
        output = begun
    assert isinstance(output, ClientOutput)
    # in effect once the server names this round (node_state.py); None: its state is unchanged
    store.save(client, request.round, state if output.state is None else output.state)
    if setup.private and output.uplink is not None:
        return without_statistics(output.uplink)
    return output.uplink


def serve_request(
    message: Message, context: Context, record: str
) -> tuple[protocol.TrainRequest, TaciturnMessage | None]:
    """The train request in ``message`` (ConfigRecord ``record``), served on this node."""
    node = NodeSettings.from_node_config(context.node_config)
    request = protocol.read_request(message.content, record)
    if request.client not in node.clients:
        raise DeployError(f"this node hosts clients {list(node.clients)}, not client {request.client}")
    setup = node_setup(str(context.run_config["taciturn-config"]), node.data)
    hosted_size(setup, request.client)
    store = NodeStateStore(node.state_dir / run_folder(context.run_config))  # runs never share state
    return request, serve_client(setup, store, request)


@app.train()
def train(message: Message, context: Context) -> Message:
    request, uplink = serve_request(message, context, protocol.RECORD)
    payload = protocol.payload_of(uplink)
    return Message(protocol.train_reply(request.round, request.client, payload), reply_to=message)


def query(message: Message, context: Context) -> Message:
    """Which clients this node hosts and their sizes on its data (the server maps clients to nodes
    with it, and checks that the node's data splits as its own does)."""
    node = NodeSettings.from_node_config(context.node_config)
    setup = node_setup(str(context.run_config["taciturn-config"]), node.data)
    return Message(protocol.query_reply({c: hosted_size(setup, c) for c in node.clients}), reply_to=message)


def hosted_size(setup: NodeSetup, client: int) -> int:
    if client >= setup.data.num_clients:
        raise DeployError(f"client {client} does not exist: the run has {setup.data.num_clients}")
    return setup.data.client_size(client)


def masked_reply(request: protocol.TrainRequest, uplink: TaciturnMessage | None) -> RecordDict:
    """The node's FitRes for the mod to mask: the uplink's arrays in name order, weight n_k. No
    metrics: a FitRes's metrics travel in the clear beside the masked vector, so a train_loss there
    would hand the server one client's statistic that SecAgg+ is meant to hide."""
    if uplink is None:
        raise DeployError(f"client {request.client} sent no update; SecAgg+ masks one from every node")
    return compat.fitres_to_recorddict(
        FitRes(
            Status(Code.OK, ""),
            ndarrays_to_parameters([np.asarray(uplink.arrays[n]) for n in sorted(uplink.arrays)]),
            int(uplink.meta["num_samples"]),
            {},
        ),
        keep_input=False,
    )


app.query()(query)
# Runs with [secagg]: Flower's SecAgg+ mod (Bell et al., CCS 2020) wraps the train step: it answers
# the protocol's key stages itself and masks the update this step returns (deploy/secagg.py).
secagg_app = ClientApp(mods=[secaggplus_mod])
secagg_app.query()(query)


@secagg_app.train()
def train_masked(message: Message, context: Context) -> Message:
    request, uplink = serve_request(message, context, protocol.FIT_CONFIG)
    return Message(masked_reply(request, uplink), reply_to=message)
