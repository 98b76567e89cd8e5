"""Per-client data (``[data] dataset = "clients"``, data/clients.py) in a run: who reads what.

* The simulation reads every client's data (``simulated``).
* A deployed node reads only its own clients' data, from its own ``--node-config`` paths
  (``on_node``, deploy/client_app.py); the run-wide numbers a client's algorithm may use (how many
  clients, how many samples in all, the classes) come from the server with each request.
* A deployed server reads none of it (``on_server``): before round 1 the nodes tell it each
  client's number of training and held-out samples and the data's shapes and classes
  (``Census``), which it checks and builds the model for. It evaluates on its own held-out set
  (``[data] test``) when it has one, and otherwise asks the clients to (federated evaluation,
  tasks/federated_eval.py), exactly as the simulation of the same data does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from taciturn.data.clients import ClientSet, Schema, client_set, held_out, merged, read_files, schema_of
from taciturn.data.datasets import ArrayDataset, DataError
from taciturn.data.federated import FederatedData
from taciturn.engine.trust import TrustedWeights
from taciturn.experiments.config import ConfigError, RunConfig
from taciturn.experiments.plugins import load_callable
from taciturn.tasks.federated_eval import Scores


@dataclass(frozen=True)
class Census:
    """What the nodes tell the server about their clients before round 1."""

    sizes: list[int]  # training samples of clients 0 .. N-1 (FedAvg's n_k)
    test_sizes: list[int]  # their held-out samples (federated evaluation's weights)
    schema: Schema


class RemoteClients(Protocol):
    """A deployment's view of its clients' data (deploy/server_app.py ``Deployment``)."""

    def census(self, config: RunConfig) -> Census: ...

    def evaluate(self, params: dict[str, torch.Tensor], population: Population) -> list[Scores]: ...


@dataclass(frozen=True)
class Population:
    """The run-wide numbers a client's algorithm and model may need and a node cannot know alone."""

    num_clients: int
    num_samples: int
    total_weight: int  # the server's sum of all clients' weights (engine/trust.py)
    classes: int

    def fields(self) -> list[int]:
        return [self.num_clients, self.num_samples, self.total_weight, self.classes]


@dataclass(frozen=True)
class ClientsSetup:
    probe: ArrayDataset  # the model is built and checked on it; its test split: the server's held-out set
    data: Any  # ClientData
    evaluate: Callable[[Any, dict], list[Scores]] | None = None  # (task, params) -> per-client scores
    note: str = ""  # how the run evaluates (run.json, the report)
    schema: Schema | None = None  # a node's: what it tells the server


def read_clients(config: RunConfig) -> list[ClientSet]:
    """Every client's data, as ``[data]`` names it (a folder or file, or a factory)."""
    data = config.data
    if data.path is not None:
        try:
            return read_files(data.path)
        except DataError as error:
            raise ConfigError(f"[data.path] {error}") from None
    factory = load_callable(data.factory, "data.factory")
    try:
        items = factory(**data.kwargs)
    except Exception as error:
        raise ConfigError(
            f"[data.factory] {data.factory}(**{dict(data.kwargs)}) raised {type(error).__name__}: {error}"
        ) from None
    if not isinstance(items, Sequence) or isinstance(items, str | bytes):
        raise ConfigError(
            f"[data.factory] {data.factory} returns a {type(items).__name__}: return a list, an item a client"
        )
    try:
        return [client_set(item, f"client {i} of {data.factory}") for i, item in enumerate(items)]
    except DataError as error:
        raise ConfigError(f"[data.factory] {error}") from None


def _server_test(config: RunConfig, schema: Schema) -> tuple[torch.Tensor, torch.Tensor] | None:
    if config.data.test is None:
        return None
    try:
        x, y = held_out(config.data.test)
    except DataError as error:
        raise ConfigError(f"[data.test] {error}") from None
    if tuple(x.shape[1:]) != schema.input_shape or tuple(y.shape[1:]) != schema.target_shape:
        raise ConfigError(
            f"[data.test] its samples are {tuple(x.shape[1:])} -> {tuple(y.shape[1:])}, the clients' "
            f"{schema.input_shape} -> {schema.target_shape}"
        )
    return x, y.long() if schema.classes else y.float()


def _probe(schema: Schema, name: str, source: str, test) -> ArrayDataset:
    """Two zero samples with the clients' shapes (the model is built and checked on them) and the
    server's held-out set, or an empty one."""
    x = torch.zeros((2, *schema.input_shape))
    y = torch.zeros((2, *schema.target_shape), dtype=torch.int64 if schema.classes else torch.float32)
    x_test, y_test = test if test is not None else (x[:0], y[:0])
    return ArrayDataset(name, x, y, x_test, y_test, schema.classes, source)


def _evaluation_note(test, census_tests: Sequence[int]) -> str:
    if test is not None:
        return f"on the server's held-out set ({len(test[1])} samples, [data] test)"
    clients = sum(1 for n in census_tests if n)
    return (
        f"federated: each client evaluates the global model on its own held-out split ({sum(census_tests)} "
        f"samples on {clients} clients), the metrics are their sample-weighted mean"
    )


def _no_held_out(config: RunConfig) -> ConfigError:
    return ConfigError(
        "[data] the run has no held-out data to evaluate on: give the server's own with data.test, or "
        "x_test and y_test in the clients' data (federated evaluation)"
    )


def simulated(config: RunConfig) -> ClientsSetup:
    """Every client's data in this process: the simulation of a silo federation."""
    clients = read_clients(config)
    try:
        schema = schema_of(clients)
    except DataError as error:
        raise ConfigError(f"[data] {error}") from None
    test = _server_test(config, schema)
    tests = [len(c.y_test) for c in clients]
    if test is None and not sum(tests):
        raise _no_held_out(config)
    source = f"{len(clients)} clients' own data ({config.data.path or config.data.factory})"
    data = merged(clients, schema, "clients", source)
    probe = _probe(schema, "clients", source, test)

    def evaluate(task, params) -> list[Scores]:
        device = next(iter(params.values())).device
        return [
            Scores(c, len(s.y_test), task.evaluate_on(params, s.x_test.to(device), s.y_test.to(device)))
            for c, s in enumerate(clients)
            if len(s.y_test)
        ]

    return ClientsSetup(probe, data, None if test is not None else evaluate, _evaluation_note(test, tests))


class NodeClients:
    """A node's own clients (their global ids), with the population as the server told it."""

    def __init__(self, local: FederatedData, ids: Sequence[int], population: Population):
        self.local, self.population = local, population
        self.position = {c: i for i, c in enumerate(ids)}
        self.dataset = local.dataset

    @property
    def num_clients(self) -> int:
        return self.population.num_clients

    @property
    def num_samples(self) -> int:
        return self.population.num_samples

    def client_size(self, client: int) -> int:
        return self.local.client_size(self.position[client])

    def client_indices(self, client: int) -> np.ndarray:
        return self.local.client_indices(self.position[client])

    def batch(self, indices: np.ndarray):
        return self.local.batch(indices)

    def to(self, device: torch.device) -> NodeClients:
        return NodeClients(self.local.to(device), list(self.position), self.population)


def on_node(
    config: RunConfig, ids: Sequence[int], population: Population | None, clients: Sequence[ClientSet]
) -> ClientsSetup:
    """A node's own ``clients`` (its data, read by ``read_clients``), with the ids its node config
    gives them, in order; ``population``: the server's numbers (None: only the node's own, to
    answer the server's census)."""
    if len(clients) != len(ids):
        raise ConfigError(
            f"[data] this node's data holds {len(clients)} clients, its node config names {len(ids)} "
            f"({', '.join(map(str, ids))}): give one client id per client, in the order of its data"
        )
    try:
        schema = schema_of(clients, ids)
    except DataError as error:
        raise ConfigError(f"[data] {error}") from None
    if population is not None:
        if schema.classes > population.classes or (schema.classes == 0) != (population.classes == 0):
            raise ConfigError(
                f"[data] this node's labels need {schema.classes} classes, the run has {population.classes}"
            )
        schema = Schema(schema.input_shape, population.classes, schema.target_shape)
    source = f"this node's clients {', '.join(map(str, ids))}"
    local = merged(clients, schema, "clients", source)
    data = NodeClients(local, ids, population or Population(len(ids), local.num_samples, 0, schema.classes))
    return ClientsSetup(_probe(schema, "clients", source, None), data, schema=schema)


class KnownSizes:
    """The clients as the server of a silo federation knows them: their sizes, no samples."""

    def __init__(self, census: Census, dataset: ArrayDataset):
        self.sizes = list(census.sizes)
        self.dataset = dataset  # the probe: shapes and the server's held-out set, no training sample

    @property
    def num_clients(self) -> int:
        return len(self.sizes)

    @property
    def num_samples(self) -> int:
        return sum(self.sizes)

    def client_size(self, client: int) -> int:
        return self.sizes[client]

    def client_indices(self, client: int):
        raise DataError("the server holds no client's samples: they stay on the nodes")

    def batch(self, indices):
        raise DataError("the server holds no client's samples: they stay on the nodes")

    def histogram(self) -> None:
        return None  # the clients' labels stay on their nodes

    def to(self, device: torch.device) -> KnownSizes:
        return self


def population_of(config: RunConfig, data: Any, classes: int) -> Population:
    """The run-wide numbers the nodes are told, from the clients as the server knows them."""
    return Population(
        data.num_clients, data.num_samples, TrustedWeights(config.server, data).total(), classes
    )


def on_server(config: RunConfig, nodes: RemoteClients) -> ClientsSetup:
    """The server of a silo federation: sizes, shapes and classes from the nodes; no sample."""
    census = nodes.census(config)
    test = _server_test(config, census.schema)
    if test is None and not sum(census.test_sizes):
        raise _no_held_out(config)
    source = f"on the nodes: {len(census.sizes)} clients' own data"
    probe = _probe(census.schema, "clients", source, test)
    data = KnownSizes(census, probe)

    def evaluate(task, params) -> list[Scores]:
        return nodes.evaluate(params, population_of(config, data, census.schema.classes))

    note = _evaluation_note(test, census.test_sizes)
    return ClientsSetup(probe, data, None if test is not None else evaluate, note)
