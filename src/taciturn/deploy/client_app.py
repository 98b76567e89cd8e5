"""The ClientApp each SuperNode runs: its picked clients' round, on the node's own data and state.

A train request names the round and, for each of the node's picked clients, the server's
acknowledgements and the downlink payload (protocol.py). For each client the node takes the state
the server names (node_state.py), runs the algorithm's ``client_begin`` / local training
(engine/local_training.py, the sequential executor's trainer) / ``client_end`` exactly as the
simulation does, and replies with every client's uplink payload (empty when it stays silent) or
the reason it failed. An evaluate request carries the global model: the node scores it on each of
its clients' held-out splits (federated evaluation, tasks/federated_eval.py).

Data: with per-client data (``[data] dataset = "clients"``) the node reads only its own clients'
data, from its node config (``data.*``, settings.py), and the run-wide numbers a client needs come
with each request (experiments/clients.py). Otherwise it builds the run's dataset and partition from
the config and seed, reading its own copy of the files, and trains only the partition ids it hosts.

What the node builds from a run's config is kept between messages of the same process (the
long-lived ClientApp of ``taciturn deploy node`` serves every round from memory; worker.py).
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

from taciturn import __version__
from taciturn.algorithms import Algorithm, build_algorithm
from taciturn.algorithms.base import ClientContext, ClientOutput, LocalTraining, Loss
from taciturn.core.message import Message as TaciturnMessage
from taciturn.core.rng import Streams
from taciturn.data.clients import ClientSet
from taciturn.deploy import protocol
from taciturn.deploy.node_state import NodeStateStore
from taciturn.deploy.settings import DeployError, NodeSettings, run_config_of, run_folder, same_version
from taciturn.engine.local_training import end_training, split_state, train_locally
from taciturn.engine.pipeline import without_statistics
from taciturn.engine.trust import TrustedWeights
from taciturn.experiments.clients import Population, on_node, read_clients
from taciturn.tasks.base import ClientData

app = ClientApp()
DataSettings = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class NodeSetup:
    algorithm: Algorithm
    streams: Streams
    data: ClientData
    loss: Loss
    buffers: frozenset[str]
    task: object
    private: bool  # [privacy]: training statistics stay on the node (engine/pipeline.py)
    clients: tuple[ClientSet, ...] = ()  # per-client data: the node's clients, in the order of ``ids``


@lru_cache(maxsize=2)
def own_clients(config_text: str, data: DataSettings) -> tuple[ClientSet, ...]:
    """This node's clients' data (per-client data), read once per process."""
    return tuple(read_clients(run_config_of(config_text, data)))


@lru_cache(maxsize=2)
def node_setup(
    config_text: str, data: DataSettings = (), ids: tuple[int, ...] = (), population: tuple[int, ...] = ()
) -> NodeSetup:
    """The run's algorithm, streams, data and loss, built from its config with the node's own
    ``data.*`` settings (once per process); ``ids`` and ``population``: per-client data's."""
    from taciturn.experiments.runner import build_task

    config = run_config_of(config_text, data)
    streams = Streams(config.seed)
    clients: tuple[ClientSet, ...] = ()
    if config.data.dataset == "clients":
        if len(population) != 4:
            raise DeployError("a request for per-client data names the run's population; update the server")
        clients = own_clients(config_text, data)
        setup = on_node(config, ids, Population(*population), clients)
        task, clients_data = build_task(config, streams, clients=setup)
        total = population[2]
    else:
        task, clients_data = build_task(config, streams)
        total = TrustedWeights(config.server, clients_data).total()
    algorithm = build_algorithm(config.algorithm)
    # what the server's ClientPipeline gives its algorithm, so both ends compute alike
    algorithm.use_streams(streams)
    algorithm.use_population(clients_data.num_clients, total)
    buffers = getattr(task, "buffers", frozenset())
    algorithm.use_buffers(buffers)  # averaged: local ones are refused
    private = config.privacy.enabled
    return NodeSetup(algorithm, streams, clients_data, task.loss, buffers, task, private, clients)


def serve_client(
    setup: NodeSetup,
    store: NodeStateStore,
    round: int,
    client: int,
    accepted: int,
    kept: int,
    received: TaciturnMessage | None,
) -> TaciturnMessage | None:
    """One client's round on this node, on the downlink it ``received`` (read-only: a broadcast's
    receivers share it, as in the simulated channel); its uplink (None: the client stays silent)."""
    algorithm = setup.algorithm
    state = store.settle(client, accepted, kept)
    own, optimizer_state = split_state(state)  # the algorithm's part; the optimizer's (when kept)
    ctx = ClientContext(
        client,
        round,
        received,
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
        output = end_training(algorithm, ctx, begun, result)
    else:
        output = begun
    assert isinstance(output, ClientOutput)
    # in effect once the server names this round (node_state.py); None: its state is unchanged
    store.save(client, round, state if output.state is None else output.state)
    if setup.private and output.uplink is not None:
        return without_statistics(output.uplink)
    return output.uplink


def _setup(context: Context, node: NodeSettings, population: tuple[int, ...]) -> NodeSetup:
    return node_setup(str(context.run_config["taciturn-config"]), node.data, node.clients, population)


def serve_request(
    message: Message, context: Context, record: str
) -> tuple[protocol.TrainRequest, list[bytes], list[str]]:
    """The train request in ``message`` (ConfigRecord ``record``), served on this node: each client's
    uplink payload, or why it failed."""
    node = NodeSettings.from_node_config(context.node_config)
    request = protocol.read_request(message.content, record)
    same_version(request.version, "server")
    strangers = [c for c in request.clients if c not in node.clients]
    if strangers:
        raise DeployError(f"this node hosts clients {list(node.clients)}, not {strangers}")
    setup = _setup(context, node, request.population)
    store = NodeStateStore(node.state_dir / run_folder(context.run_config))  # runs never share state
    payloads, errors = [], []
    decoded: dict[bytes, TaciturnMessage | None] = {}  # a broadcast: the same payload for each client
    for client, accepted, kept, payload in zip(
        request.clients, request.accepted, request.kept, request.payloads, strict=True
    ):
        try:
            if payload not in decoded:
                decoded[payload] = protocol.message_of(payload)
            uplink = serve_client(setup, store, request.round, client, accepted, kept, decoded[payload])
            payloads.append(protocol.payload_of(uplink))
            errors.append("")
        except Exception as error:  # one broken client must not take the node's others with it
            payloads.append(b"")
            errors.append(f"{type(error).__name__}: {error}")
    return request, payloads, errors


@app.train()
def train(message: Message, context: Context) -> Message:
    request, payloads, errors = serve_request(message, context, protocol.RECORD)
    content = protocol.train_reply(request.round, list(request.clients), payloads, errors)
    return Message(content, reply_to=message)


def query(message: Message, context: Context) -> Message:
    """Which clients this node hosts and their sizes on its data (the server maps clients to nodes
    with it and checks the node's data); with per-client data also their held-out sizes and the
    data's shapes and classes, which the server builds the model for."""
    same_version(protocol.read_version(message.content), "server")
    node = NodeSettings.from_node_config(context.node_config)
    text = str(context.run_config["taciturn-config"])
    config = run_config_of(text, node.data)
    if config.data.dataset != "clients":
        setup = _setup(context, node, ())  # what its train requests will use: built once
        hosted = protocol.Hosted(__version__, {c: hosted_size(setup, c) for c in node.clients})
        return Message(protocol.query_reply(hosted), reply_to=message)
    clients = own_clients(text, node.data)
    setup = on_node(config, node.clients, None, clients)
    sizes = {c: len(s.y_train) for c, s in zip(node.clients, clients, strict=True)}
    tests = {c: len(s.y_test) for c, s in zip(node.clients, clients, strict=True)}
    hosted = protocol.Hosted(__version__, sizes, tests, setup.schema)
    return Message(protocol.query_reply(hosted), reply_to=message)


def evaluate(message: Message, context: Context) -> Message:
    """Federated evaluation: the global model scored on each of this node's clients' held-out splits."""
    node = NodeSettings.from_node_config(context.node_config)
    request = protocol.read_evaluate_request(message.content)
    same_version(request.version, "server")
    setup = _setup(context, node, request.population)
    model = protocol.message_of(request.payload)
    if model is None:
        raise DeployError("an evaluate request carries the global model; this one is empty")
    params = dict(model.tensors())
    scores = [
        (c, len(s.y_test), setup.task.evaluate_on(params, s.x_test, s.y_test))
        for c, s in zip(node.clients, setup.clients, strict=True)
        if len(s.y_test)
    ]
    return Message(protocol.evaluate_reply(scores), reply_to=message)


def hosted_size(setup: NodeSetup, client: int) -> int:
    if client >= setup.data.num_clients:
        raise DeployError(f"client {client} does not exist: the run has {setup.data.num_clients}")
    return setup.data.client_size(client)


def masked_reply(request: protocol.TrainRequest, payloads: list[bytes], errors: list[str]) -> RecordDict:
    """The node's FitRes for the mod to mask: its one client's uplink arrays in name order, weight
    n_k. No metrics: a FitRes's metrics travel in the clear beside the masked vector, so a
    train_loss there would hand the server one client's statistic that SecAgg+ is meant to hide."""
    if errors[0]:
        raise DeployError(f"client {request.clients[0]} failed: {errors[0]}")
    uplink = protocol.message_of(payloads[0])
    if uplink is None:
        raise DeployError(f"client {request.clients[0]} sent no update; SecAgg+ masks one from every node")
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
app.evaluate()(evaluate)
# Runs with [secagg]: Flower's SecAgg+ mod (Bell et al., CCS 2020) wraps the train step: it answers
# the protocol's key stages itself and masks the update this step returns (deploy/secagg.py).
secagg_app = ClientApp(mods=[secaggplus_mod])
secagg_app.query()(query)
secagg_app.evaluate()(evaluate)


@secagg_app.train()
def train_masked(message: Message, context: Context) -> Message:
    request, payloads, errors = serve_request(message, context, protocol.FIT_CONFIG)
    if len(request.clients) != 1:
        raise DeployError("under [secagg] a node hosts one client, since SecAgg+ hides a node's update")
    return Message(masked_reply(request, payloads, errors), reply_to=message)
