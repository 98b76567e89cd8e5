"""The round loop: select, send down, run clients, send up, validate, aggregate.

Every message crosses the Channel (so the Ledger counts it and drops can hit it), every uplink
is validated before the algorithm sees it, and client state is written back to the store.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from taciturn.algorithms.base import Algorithm, Arrival, ClientContext, ClientOutput, Loss
from taciturn.core.channel import Channel
from taciturn.core.ledger import Direction
from taciturn.core.rng import SERVER, Streams
from taciturn.core.state_store import ClientStateStore
from taciturn.engine.executor import ClientFailed, Executor
from taciturn.engine.validation import uplink_problem
from taciturn.tasks.base import ClientData

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    round: int
    selected: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    train_loss: float | None = None  # mean local loss over accepted uplinks that report one
    arrivals: list[Arrival] = field(default_factory=list)  # the accepted uplinks, for analysis


class Federation:
    def __init__(
        self,
        algorithm: Algorithm,
        executor: Executor,
        channel: Channel,
        store: ClientStateStore,
        streams: Streams,
        data: ClientData,
        loss: Loss,
    ):
        self.algorithm = algorithm
        self.executor = executor
        self.channel = channel
        self.store = store
        self.streams = streams
        self.data = data
        self.loss = loss

    def run_round(self, state: Any, round: int) -> tuple[Any, RoundReport]:
        algorithm, report = self.algorithm, RoundReport(round)
        selected = algorithm.select_clients(
            state, round, self.data.num_clients, self.streams.numpy(round, SERVER, "select")
        )
        report.selected = [int(c) for c in selected]
        downlink = algorithm.downlink(state, round, report.selected)
        contexts = []
        for client in report.selected:
            message = downlink.get(client)
            received = None if message is None else self.channel.send(Direction.DOWN, round, client, message)
            contexts.append(
                ClientContext(
                    client,
                    round,
                    received,
                    self.store.get(client),
                    self.data.client_size(client),
                    self.streams,
                    self.data,
                    self.loss,
                )
            )
        outputs = self.executor.run(contexts)
        arrivals = report.arrivals = self._collect(
            round, contexts, outputs, algorithm.uplink_spec(state), report
        )
        losses = [a.message.meta["train_loss"] for a in arrivals if "train_loss" in a.message.meta]
        report.train_loss = math.fsum(losses) / len(losses) if losses else None
        return algorithm.aggregate(state, round, arrivals), report

    def _collect(self, round, contexts, outputs, spec, report: RoundReport) -> list[Arrival]:
        arrivals = []
        for ctx, output in zip(contexts, outputs, strict=True):
            if isinstance(output, ClientFailed):
                report.failed.append((ctx.client, str(output)))
                continue
            assert isinstance(output, ClientOutput)
            if output.state is not None:
                self.store.put(ctx.client, output.state)
            if output.uplink is None:
                continue
            arrived = self.channel.send(Direction.UP, round, ctx.client, output.uplink)
            if arrived is None:
                continue
            reason = uplink_problem(arrived, spec) or self.algorithm.check_uplink_meta(arrived)
            if reason is not None:
                log.warning("round %d: rejected the update of client %d: %s", round, ctx.client, reason)
                report.rejected.append((ctx.client, reason))
                continue
            report.accepted.append(ctx.client)
            arrivals.append(Arrival(ctx.client, arrived))
        return arrivals
