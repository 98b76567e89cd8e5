"""Measure, don't guess: the first rounds of a run try the candidate executors and keep the faster.

The probe of engine/choice.py times one local step with all threads and with one. It cannot see
what a real round adds: starting worker processes, sending shares and merging partials, two
single-thread workers sharing the memory bandwidth, the machine's load at run time. So where the
probe says processes may pay, ``auto`` runs the first rounds alternately on the in-process
executor (the incumbent) and the parallel one (the challenger): A B A B. Each is timed per unit
of work (its round's seconds over the samples or steps it trained), the best of its rounds counts
(the first parallel round carries the fork, which is paid once and is sunk by the time we decide),
and the challenger is kept only if it is at least ``MARGIN`` faster, so a tie stays in-process.
The loser is closed and the decision is logged with its numbers.

The candidates compute the same local steps and differ only in the order partial sums are
added, so a run's numbers agree with any single executor's up to floating-point rounding; a run
that must be bit-for-bit repeatable names its executor in ``[engine] executor``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from taciturn.engine.executor import Executor
from taciturn.engine.pipeline import RoundPart

log = logging.getLogger(__name__)
TRIAL_ROUNDS = 2  # rounds each candidate serves before the choice
MARGIN = 0.97  # the challenger must take under 97% of the incumbent's time per unit of work
MIN_ROUNDS = 3 * TRIAL_ROUNDS  # a shorter run keeps the incumbent: the trial would cost more than it saves


class TrialExecutor(Executor):
    """``work(clients)``: the amount of local work a round's clients do (samples or steps), so that
    rounds of different sizes compare; ``clock``: injectable for tests."""

    def __init__(
        self,
        incumbent: Executor,
        challenger: Executor,
        work: Callable[[Sequence[int]], float],
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__(incumbent.pipeline)
        self.candidates = (incumbent, challenger)
        self.work = work
        self.clock = clock
        self.seconds_per_unit: tuple[list[float], list[float]] = ([], [])
        self.kept: Executor | None = None
        self.last: Executor = incumbent  # served the latest round: its commit goes there
        self.name = f"auto ({incumbent.name} or {challenger.name})"

    def serve(self, round, clients, downlink, spec) -> RoundPart:
        if self.kept is None and all(len(times) >= TRIAL_ROUNDS for times in self.seconds_per_unit):
            self._decide()  # only now: the last trial round's commit has reached its executor
        if self.kept is not None:
            self.last = self.kept
            return self.kept.serve(round, clients, downlink, spec)
        self.last = self.candidates[sum(len(times) for times in self.seconds_per_unit) % 2]
        started = self.clock()
        part = self.last.serve(round, clients, downlink, spec)
        self.seconds_per_unit[self.candidates.index(self.last)].append(
            (self.clock() - started) / max(self.work(clients), 1e-12)
        )
        return part

    def commit(self, round: int, accepted: Sequence[int]) -> None:
        """The clients' staged state is where the round ran (workers, or this process)."""
        self.last.commit(round, accepted)

    def _decide(self) -> None:
        incumbent, challenger = self.candidates
        a, b = (min(times) for times in self.seconds_per_unit)
        keep_challenger = b < MARGIN * a
        self.kept, loser = (challenger, incumbent) if keep_challenger else (incumbent, challenger)
        loser.close()
        self.name = self.kept.name
        log.info(
            "executor trial (best of %d rounds each, per unit of work): %s %.3g s, %s %.3g s (%.2fx): "
            "keeping %s",
            TRIAL_ROUNDS,
            incumbent.name,
            a,
            challenger.name,
            b,
            b / a,
            self.kept.name,
        )

    def close(self) -> None:
        for executor in (self.kept,) if self.kept is not None else self.candidates:
            executor.close()
