"""Executors decide where and how the client side of a round runs; they know no algorithm's math.

* ``sequential``: one client after another, in this process. The reference.
* ``vectorized``: the local steps of all of a round's clients at once with torch.func (vmap).
* ``parallel``: clients spread over worker processes, one thread each (engine/parallel.py);
  ``parallel_vectorized``: the same, each worker training its share as the vectorized executor does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from taciturn.algorithms.base import Algorithm, ArraySpec, ClientContext, LocalTraining, TrainResult
from taciturn.core.message import Message
from taciturn.engine.local_training import train_locally
from taciturn.engine.pipeline import ClientPipeline, RoundPart


class Executor(ABC):
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
