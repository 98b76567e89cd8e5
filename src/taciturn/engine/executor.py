"""Executors run the client side of a round. The sequential executor is the reference."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence

from taciturn.algorithms.base import Algorithm, ClientContext, ClientOutput, LocalTraining
from taciturn.engine.local_training import train_locally

log = logging.getLogger(__name__)


class ClientFailed(RuntimeError):
    """A client's work raised; the round goes on without it."""


class Executor(ABC):
    def __init__(self, algorithm: Algorithm):
        self.algorithm = algorithm

    @abstractmethod
    def run(self, contexts: Sequence[ClientContext]) -> list[ClientOutput | ClientFailed]:
        """One output per context, in order; a client whose work raised yields ClientFailed."""


class SequentialExecutor(Executor):
    """One client after another, in this process."""

    def run_one(self, ctx: ClientContext) -> ClientOutput:
        work = self.algorithm.client_begin(ctx)
        if isinstance(work, ClientOutput):
            return work
        assert isinstance(work, LocalTraining)
        result = train_locally(self.algorithm, ctx, work, self.algorithm.config.local)
        return self.algorithm.client_end(ctx, work, result)

    def run(self, contexts: Sequence[ClientContext]) -> list[ClientOutput | ClientFailed]:
        outputs: list[ClientOutput | ClientFailed] = []
        for ctx in contexts:
            try:
                outputs.append(self.run_one(ctx))
            except Exception as error:  # one broken client must not end the federation
                log.exception("client %d failed in round %d", ctx.client, ctx.round)
                outputs.append(ClientFailed(f"{type(error).__name__}: {error}"))
        return outputs
