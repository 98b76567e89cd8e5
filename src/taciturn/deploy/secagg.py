"""SecAgg+ in a deployed round: Flower's own SecAggPlusWorkflow on the server, its secaggplus_mod
on the nodes (client_app.py ``secagg_app``); nothing of the protocol is taciturn's.

Bell, Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020 (SecAgg+: each node shares keys with a few neighbours), on Bonawitz et al.,
CCS 2017, Fig. 4. Flower runs its four stages as four exchanges of Flower messages: setup (public
keys), share keys (encrypted Shamir shares, routed by the server), collect masked vectors (the
train step: each node's update, weighted by n_k and quantised, then masked) and unmask (shares of
the survivors' self-masks and of the dropped nodes' keys). The server learns sum_k n_k x_k and
sum_k n_k only, and their ratio is FedAvg's weighted mean (McMahan et al. 2017, Alg. 1), to the
quantisation error.

taciturn's part, and how [secagg] maps onto the workflow:
* one node per picked client: SecAgg+ hides one node's update from the server, so under [secagg]
  each node hosts one client (a node with several would see all of theirs: refused).
* the train request (of the node's one client) rides in the workflow's FitIns (``fitins.config``); the
  node answers a FitRes with the uplink's arrays in name order and n_k as ``num_examples``, which
  the mod quantises and masks.
* every message of the four stages is metered into the ledger's ``wire_bytes`` (per client and
  direction): the SecAgg+ overhead is measured. The payload columns count the broadcast (down) and
  the masked vector (up).
* clip -> clipping_range; 2^bits - 1 -> quantization_range (modulus 2^32); graph "complete" ->
  every node holds a share of every other, "sparse" -> neighbours + 1 shares (one kept);
  threshold -> reconstruction_threshold, the fraction of shares that rebuilds a secret;
  max_weight = the largest n_k of the round, so the weights n_k / max_weight stay in (0, 1].
Unlike the simulated [secagg] (secagg/, an unweighted mean of the clients' deltas), the weight n_k
travels masked with the update, so the aggregate is the plain FedAvg aggregate to the
quantisation error. Keys, masks and the mod's stochastic rounding come from the OS and NumPy's
global generator inside Flower, as crypto must: such a run matches its plain counterpart to the
quantisation tolerance, not bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
from flwr.app import ConfigRecord, Context, Error, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.common import FitIns, Parameters, bytes_to_ndarray, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

from taciturn.algorithms.base import ArraySpec
from taciturn.core.ledger import Direction
from taciturn.deploy import protocol
from taciturn.deploy.protocol import GONE
from taciturn.engine.pipeline import ClientPipeline, RoundPart, secure_mean
from taciturn.secagg.config import SecAggConfig
from taciturn.secagg.quantize import levels

log = logging.getLogger(__name__)

Exchange = Callable[[Sequence[FlowerMessage]], dict[str, FlowerMessage]]


class _Round(Strategy):
    """The legacy Strategy the workflow talks to: ``configure_fit`` hands it the round's requests,
    ``aggregate_fit`` receives the unmasked weighted mean and who is in it."""

    def __init__(self, grid, requests: Mapping[int, FitIns]):
        self.grid, self.requests = grid, requests
        self.mean: list[np.ndarray] | None = None
        self.survivors: list[int] = []  # node ids

    def configure_fit(self, server_round, parameters, client_manager):
        return [(GridClientProxy(node, self.grid, 0), fitins) for node, fitins in self.requests.items()]

    def aggregate_fit(self, server_round, results, failures):
        if results:  # the workflow puts the unmasked mean into every result
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
        for proxy, _ in results:
            self.survivors.append(proxy.node_id)
        return None, {}

    def initialize_parameters(self, client_manager):
        return None

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class _MeteredGrid:
    """The Grid as the workflow sees it: each stage goes through the executor's push and pull (its
    round timeout, short polls), every message and reply counted in the ledger's wire bytes, and a
    masked vector of the wrong shapes turned into an error reply (the node counts as dropped and
    the protocol unmasks without it) instead of breaking the sum."""

    def __init__(self, exchange: Exchange, ledger, round: int, client_of: Mapping[int, int], shapes):
        self.exchange, self.ledger, self.round = exchange, ledger, round
        self.client_of, self.shapes = client_of, shapes
        self.sent: set[int] = set()  # clients whose train step (stage 2) was sent
        self.masked: dict[int, int] = {}  # client -> bytes of its masked vector
        self.errors: dict[int, str] = {}

    def send_and_receive(self, messages: Iterable[FlowerMessage], *, timeout=None) -> list[FlowerMessage]:
        messages = list(messages)
        for message in messages:
            client = self.client_of[message.metadata.dst_node_id]
            self.ledger.record_wire(self.round, client, Direction.DOWN, protocol.wire_size(message))
            if message.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == (
                Stage.COLLECT_MASKED_VECTORS
            ):
                self.sent.add(client)
        replies = self.exchange(messages)
        by_id = {m.metadata.message_id: m for m in messages}
        out = []
        for request_id, reply in replies.items():
            client = self.client_of[by_id[request_id].metadata.dst_node_id]
            if reply.has_error() and reply.error.code in GONE:  # the SuperLink's: the node is gone
                out.append(reply)
                continue
            self.ledger.record_wire(self.round, client, Direction.UP, protocol.wire_size(reply))
            if reply.has_error():
                self.errors[client] = reply.error.reason
            elif client in self.sent and (vector := self._masked(reply)) is not None:
                if [a.shape for a in vector] != self.shapes:
                    self.errors[client] = "its masked update does not fit the model's shapes"
                    reply = FlowerMessage(
                        Error(code=0, reason=self.errors[client]), reply_to=by_id[request_id]
                    )
                else:
                    self.masked[client] = sum(a.nbytes for a in vector)
            out.append(reply)
        return out

    @staticmethod
    def _masked(reply: FlowerMessage) -> list[np.ndarray] | None:
        record = reply.content.config_records.get(RECORD_KEY_CONFIGS)
        if record is None or Key.MASKED_PARAMETERS not in record:
            return None
        return [bytes_to_ndarray(b) for b in record[Key.MASKED_PARAMETERS]]


def workflow(config: SecAggConfig, clients: int, max_weight: float, timeout: float) -> SecAggPlusWorkflow:
    """Flower's SecAgg+ workflow with [secagg]'s settings for ``clients`` participants whose
    largest weight n_k is ``max_weight``."""
    sparse = config.graph == "sparse" and config.neighbours + 1 < clients
    return SecAggPlusWorkflow(
        num_shares=config.neighbours + 1 if sparse else 1.0,
        reconstruction_threshold=config.threshold,
        max_weight=max_weight,
        clipping_range=config.clip,
        quantization_range=levels(clients, config.bits),
        timeout=timeout,
    )


def secure_round(
    pipeline: ClientPipeline,
    exchange: Exchange,
    config: SecAggConfig,
    timeout: float,
    round: int,
    nodes: Mapping[int, int],
    requests: Mapping[int, protocol.TrainRequest],
    spec: Mapping[str, ArraySpec],
) -> RoundPart:
    """One round under SecAgg+ between the nodes ``nodes`` (client -> node) hosting the round's
    picked clients; the server gets only their weighted mean, as one arrival."""
    ledger, part = pipeline.channel.ledger, RoundPart(accumulated=pipeline.accumulate([]))
    if len(nodes) < 2:  # one update cannot hide in a sum
        part.rejected += [(c, "SecAgg+ needs two or more nodes in a round") for c in nodes]
        return part
    names = sorted(spec)
    shapes = [(1,), *(tuple(spec[n].shape) for n in names)]  # the mod puts the weight first
    client_of = {node: client for client, node in nodes.items()}
    grid = _MeteredGrid(exchange, ledger, round, client_of, shapes)
    fitins = {node: FitIns(Parameters([], ""), requests[client].fields()) for client, node in nodes.items()}
    strategy = _Round(grid, fitins)
    state = RecordDict()
    state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round})
    state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(Parameters([], ""), True)
    context = LegacyContext(Context(0, 0, {}, state, {}), strategy=strategy)
    max_weight = float(max(pipeline.data.client_size(c) for c in nodes))
    workflow(config, len(nodes), max_weight, timeout)(grid, context)

    for client in nodes:
        if client in grid.sent:
            ledger.record(
                round,
                client,
                Direction.DOWN,
                len(requests[client].payloads[0]),
                delivered=client in grid.masked,
            )
        if client in grid.errors:
            part.failed.append((client, grid.errors[client]))
    for client, nbytes in grid.masked.items():
        ledger.record(round, client, Direction.UP, nbytes, delivered=True)
    if strategy.mean is None:  # too few shares came back: the sum cannot be unmasked
        log.warning("round %d: secure aggregation failed; no update this round", round)
        part.rejected += [(c, "secure aggregation failed") for c in nodes if c in grid.masked]
        return part
    survivors = [client_of[node] for node in strategy.survivors]
    arrays = {
        n: np.asarray(a).reshape(spec[n].shape).astype(spec[n].dtype)
        for n, a in zip(names, strategy.mean, strict=True)
    }
    part.accepted += survivors  # no train_loss: a node's statistic is as private as its update
    # the mean stands for the survivors' updates (as the simulated [secagg] does, engine/pipeline.py)
    part.accumulated = pipeline.accumulate([secure_mean(arrays, len(survivors))])
    return part
