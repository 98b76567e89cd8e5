"""Choose the executor for a run from measurements on this machine, and say why.

The choice depends on the model (how well one local step uses several threads), the workload
(clients per round) and the machine (cores, GPU). A short probe times one local step of the real
model on a real batch with all threads and with one thread (about a tenth of a second for the CNN;
it runs at every start, because a cached timing would outlive the load it was measured under).
Each timing is the fastest of several repetitions. The estimated round times then decide whether
workers are worth trying:

    sequential  ~ C * K * t_all                (one client after another, all threads)
    parallel    ~ C * K * t_one / W + o        (W single-thread workers, W = cores; o per round)
with C clients a round taking K local steps each.

With a GPU the vectorized executor (vmap over stacked per-client weights) is chosen. On CPU vmap
loses to the loop (with distinct weights per client each step is a small product that reads the
whole layer). But where local training is SGD (without clipping) on a ReLU MLP with FedAvg's
objective, the vectorized trainer runs written-out algebra instead of autograd: for plain SGD the
exact low-rank algebra across clients where its corrections pay (few samples per client,
``lowrank.pays``), else fused steps one client at a time (engine/mlp_steps.py). Both beat the
autograd loop, so there sequential becomes ``vectorized`` and parallel becomes
``parallel_vectorized`` (every worker trains its share that way). One core or one client per
round: no workers.

The probe cannot see worker start-up, the per-round merge, or two workers sharing the memory
bandwidth. So a parallel pick is not trusted: ``Choice.tried`` turns it into a trial on the run's
own first rounds (engine/trial.py), and the in-process executor stays unless the workers measure
faster.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from taciturn.engine.trial import MIN_ROUNDS
from taciturn.tasks.base import Task

log = logging.getLogger(__name__)
PROBE_STEPS = 8
# Workers are tried wherever the probe does not rule them out; the trial (engine/trial.py), not
# the probe, decides. The probe under-rates them on the CNN: in one W run of the speed benchmark it
# estimated workers at 0.94x sequential (a 10% bar kept sequential: 131 s), where in the other
# four runs the trial measured them at 0.73-0.86x sequential's time per sample (97-106 s a run).
TRY_WORKERS_BELOW = 1.0
PARALLEL_ROUND_OVERHEAD_S = 0.004  # sending a share and receiving a partial, per round (benchmarks/speed.py)


@dataclass(frozen=True)
class Choice:
    """``challenger``: a parallel executor that the first rounds try against ``executor``
    (engine/trial.py); the run keeps whichever measures faster."""

    executor: str
    workers: int
    reason: str
    challenger: str | None = None

    def tried(self, rounds: int) -> Choice:
        """Where the probe says processes pay, verify it on the run itself: the in-process
        executor first, the parallel one as the challenger. A run too short for the trial stays
        in-process, where start-up costs nothing."""
        if not self.executor.startswith("parallel"):
            return self
        in_process = "vectorized" if self.executor.endswith("vectorized") else "sequential"
        if rounds < MIN_ROUNDS:
            reason = f"{self.reason}; but {rounds} rounds are too few to try workers against {in_process}"
            return Choice(in_process, 0, reason)
        reason = f"{self.reason}; the first rounds try {self.executor} against {in_process}"
        return Choice(in_process, self.workers, reason, challenger=self.executor)


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose(
    task: Task,
    batch: tuple[torch.Tensor, ...],
    clients_per_round: int,
    steps: float,
    vectorized: bool,
    mlp_algebra: str | None = None,
) -> Choice:
    """``vectorized``: whether the vectorized executor can train this task's clients;
    ``mlp_algebra``: "low-rank" or "fused" where local training is SGD on a ReLU MLP, whose
    written-out algebra the vectorized trainer runs (engine/lowrank.py, engine/mlp_steps.py)."""
    cores = available_cores()
    if torch.cuda.is_available() and vectorized:
        return Choice("vectorized", 0, "a GPU is present: all clients' local steps in one vmapped call")
    placed = _place(task, batch, clients_per_round, steps, cores)
    if not (vectorized and mlp_algebra):
        return placed
    how = {
        "low-rank": "the exact low-rank algebra trains a process's clients at once (few samples each)",
        "fused": "fused forward and backward steps without autograd, one client at a time",
    }[mlp_algebra]
    reason = f"{placed.reason}; local SGD on a ReLU MLP: {how}"
    return Choice(
        "parallel_vectorized" if placed.executor == "parallel" else "vectorized", placed.workers, reason
    )


def _place(
    task: Task, batch: tuple[torch.Tensor, ...], clients_per_round: int, steps: float, cores: int
) -> Choice:
    """Sequential or parallel, from the estimated round times."""
    if cores < 2:
        return Choice("sequential", 0, "one CPU core: nothing to run in parallel")
    if clients_per_round < 2:
        return Choice("sequential", 0, "one client per round: nothing to run in parallel")
    timing = _probe(task, batch, cores)
    c = clients_per_round
    workers = min(cores, c)
    sequential = c * steps * timing["all_threads"]
    parallel = c * steps * timing["one_thread"] / workers + PARALLEL_ROUND_OVERHEAD_S
    measured = (
        f"one local step takes {timing['all_threads'] * 1e3:.2f} ms with {cores} threads and "
        f"{timing['one_thread'] * 1e3:.2f} ms with one"
    )
    if parallel >= TRY_WORKERS_BELOW * sequential:
        return Choice("sequential", 0, f"{measured}: {workers} workers would save nothing")
    reason = (
        f"{measured}: estimated {sequential / parallel:.2f}x the sequential speed for {c} clients a round"
    )
    return Choice("parallel", workers, reason)


def _probe(task: Task, batch: tuple[torch.Tensor, ...], cores: int) -> dict:
    params = task.init_params(torch.Generator().manual_seed(0))
    previous = torch.get_num_threads()
    timing: dict[str, float] = {}
    try:
        for label, threads in (("all_threads", cores), ("one_thread", 1)):
            torch.set_num_threads(threads)
            timing[label] = _time_steps(task, params, batch)
    finally:
        torch.set_num_threads(previous)
    return timing


def _time_steps(task: Task, params, batch) -> float:
    live = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    durations = []
    for _ in range(PROBE_STEPS + 2):
        started = time.perf_counter()
        grads = torch.autograd.grad(task.loss(live, batch), list(live.values()))
        with torch.no_grad():
            torch._foreach_add_(list(live.values()), list(grads), alpha=-1e-3)
        durations.append(time.perf_counter() - started)
    return min(durations[2:])
