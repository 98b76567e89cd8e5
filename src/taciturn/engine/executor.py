"""Executors decide where and how the client side of a round runs; they know no algorithm's math.

* ``sequential``: one client after another, in this process. The reference.
* ``vectorized``: the local steps of all of a round's clients at once with torch.func (vmap).
* ``parallel``: clients spread over worker processes, one thread each (engine/parallel.py);
  ``parallel_vectorized``: the same, each worker training its share as the vectorized executor does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from taciturn.algorithms.base import Algorithm, ArraySpec, ClientContext, LocalTraining, TrainResult
from taciturn.core.message import Message
from taciturn.engine.local_training import train_locally
from taciturn.engine.pipeline import ClientPipeline, RoundPart


class Executor(ABC):
    """Runs the client side of each round somewhere, and commits client state once the server decides.

    The commit protocol (DESIGN.md, "Acceptance"): ``serve`` runs the round's clients through the
    client pipeline, which *stages* each client's new persistent state instead of storing it,
    except for a client that sent nothing (there is nothing to acknowledge, so its state is stored
    at once). After the Federation has validated and aggregated the round it calls
    ``commit(round, accepted)`` exactly once, with the clients whose uplink it accepted (empty if
    it discarded the round): the executor moves their staged state into the client-state store
    and drops every other staged state of that round, wherever the clients ran (in this process,
    in worker processes, on a cluster). So a dropped or rejected uplink leaves the client's state
    as it was before the round, just as it leaves the server's. In simulation ``commit`` returns
    only when the store holds the committed states (a checkpoint may be written right after it); a
    deployment (deploy/grid_executor.py) tells each node with its client's next request.
    """

    name: str

    def __init__(self, pipeline: ClientPipeline):
        self.pipeline = pipeline

    @abstractmethod
    def serve(
        self,
        round: int,
        clients: Sequence[int],
        downlink: Mapping[int, Message | None],
        spec: Mapping[str, ArraySpec],
    ) -> RoundPart: ...

    def commit(self, round: int, accepted: Sequence[int]) -> None:
        """Store the staged state of ``accepted`` clients of ``round``; drop the rest (see above)."""
        self.pipeline.commit(round, accepted)

    def checkpoint_extras(self) -> dict[str, Any]:
        """State of its own a checkpoint must keep for a resume to go on exactly (runner.py), by
        file name: none where the client states are in the run's store; a deployment's
        acknowledgements (deploy/grid_executor.py). On resume these are the templates it is read with."""
        return {}

    def checkpointed(self, extras: Mapping[str, Any]) -> None:  # noqa: B027 (nothing kept, nothing to do)
        """A checkpoint holding ``extras`` is on disk: just written, or read back by a resume (an
        extra the checkpoint lacks is None)."""

    def close(self) -> None:  # noqa: B027 (in-process executors hold nothing to release)
        """Release workers or other resources."""


class LoopTrainer:
    """Each client's local steps in turn (engine/local_training.py)."""

    def train(
        self, algorithm: Algorithm, items: Sequence[tuple[ClientContext, LocalTraining]]
    ) -> list[TrainResult | Exception]:
        results: list[TrainResult | Exception] = []
        for ctx, work in items:
            try:
                results.append(train_locally(algorithm, ctx, work, algorithm.config.local))
            except Exception as error:
                results.append(error)
        return results


class SequentialExecutor(Executor):
    name = "sequential"

    def serve(self, round, clients, downlink, spec) -> RoundPart:
        return self.pipeline.serve(round, clients, downlink, spec, LoopTrainer())
