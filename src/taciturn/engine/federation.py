"""The round loop: select, decide what to send down, serve the clients, aggregate, commit.

Every message crosses the Channel (so the Ledger counts it and drops can hit it), every uplink is
validated before the algorithm sees it, and the executor decides where the clients' work runs
(engine/executor.py). A new server state with a non-finite value (finite float32 updates can
still sum to Inf) is discarded: the round is skipped (run as if no uplink had arrived), the model
kept, and the reason logged and reported. Then the executor commits the staged state of the
clients whose uplink the server accepted and applied, and only theirs (none in a skipped round).
A round whose aggregation rule cannot keep its guarantee for the updates that arrived (too few
for Krum's f, for the trimmed mean's cut: ``OutsideGuarantee``) is skipped the same way.
With a compressed downlink (compression/link.py) the server encodes what the algorithm sends. With a
per-client reference (EF21 up, EF21-P down) it advances its copy of a client's reference exactly
when the client's own copy advances: up, when it applied the update; down, when the message
arrived and the client's new state took effect.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from taciturn.algorithms.base import Algorithm, Arrival
from taciturn.compression.link import Downlink, Uplink
from taciturn.core.rng import SERVER, Streams
from taciturn.engine.executor import Executor
from taciturn.engine.validation import state_problem
from taciturn.server.aggregation import ServerAggregation
from taciturn.server.transform import OutsideGuarantee
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
    client_info: dict[int, Mapping[str, float]] = field(default_factory=dict)  # ClientOutput.info
    arrivals: list[Arrival] = field(default_factory=list)  # kept only when the pipeline keeps them (analysis)
    skipped: str | None = None  # why this round's aggregate was discarded (None: it was applied)
    server_info: dict[str, float] = field(default_factory=dict)  # the server chain's numbers (clip norm...)


class Federation:
    def __init__(
        self,
        algorithm: Algorithm,
        executor: Executor,
        streams: Streams,
        data: ClientData,
        aggregation: ServerAggregation | None = None,
        poisson_rate: float | None = None,
        uplink: Uplink | None = None,
        downlink: Downlink | None = None,
    ):
        self.algorithm = algorithm
        self.executor = executor
        self.streams = streams
        self.data = data
        self.aggregation = aggregation  # the server chain (robust rules, clipping, DP), if any
        # Poisson sampling (DP accounting): each client joins a round with this probability,
        # instead of the algorithm's fixed-size draw.
        self.poisson_rate = poisson_rate
        # the server's side of each link's compression, if any (the pipeline holds the same objects)
        self.uplink, self.downlink = uplink, downlink

    def run_round(self, state: Any, round: int) -> tuple[Any, RoundReport]:
        algorithm = self.algorithm
        rng = self.streams.numpy(round, SERVER, "select")
        if self.poisson_rate is None:
            chosen = algorithm.select_clients(state, round, self.data.num_clients, rng)
        else:
            chosen = np.flatnonzero(rng.random(self.data.num_clients) < self.poisson_rate)
        selected = [int(c) for c in chosen]
        downlink = algorithm.downlink(state, round, selected)
        if self.downlink is not None:
            downlink = self.downlink.send(round, downlink)
        spec = algorithm.uplink_spec(state)
        part = self.executor.serve(round, selected, downlink, spec)
        report = RoundReport(
            round,
            selected,
            part.accepted,
            part.rejected,
            part.failed,
            math.fsum(part.losses) / len(part.losses) if part.losses else None,
            part.client_info,
            part.arrivals,
        )
        accumulated, chain_state, problem = part.accumulated, None, None
        if self.aggregation is not None:  # the chain's result stands for all the round's updates
            try:
                standing, chain_state, report.server_info = self.aggregation.apply(round, accumulated, spec)
                accumulated = algorithm.accumulate(standing)
            except OutsideGuarantee as outside:
                problem = str(outside)
        if problem is None:
            new_state = algorithm.aggregate(state, round, accumulated)
            problem = state_problem(new_state)
        applied = report.accepted
        if problem is not None:
            log.warning("round %d skipped, the model kept: %s", round, problem)
            report.skipped, applied = problem, []
            new_state = algorithm.aggregate(state, round, algorithm.accumulate([]))  # as if none arrived
        elif self.aggregation is not None:
            self.aggregation.state = chain_state
        self.executor.commit(round, applied)
        if self.uplink is not None:  # EF21: the server's copy advances with an accepted update
            self.uplink.settle(applied)
        if self.downlink is not None:
            took_effect = set(part.settled) | set(applied)
            self.downlink.settle(c for c in part.heard if c in took_effect)
        return new_state, report
