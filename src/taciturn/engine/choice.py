"""Choose the executor for a run from measurements on this machine, and say why.

The choice depends on the model (how well one local step uses several threads), the workload
(clients per round, batch size) and the machine (cores, GPU). A short probe times one local step
of the real model on a real batch with all threads and with one thread, and a vmapped step over
several clients (about a tenth of a second for the CNN; it runs at every start, because a cached
timing would outlive the load it was measured under). Each timing is the fastest of several
repetitions, the best guess at what the hardware can do when other processes interfere.
The estimated round times then decide:

    sequential  ~ C * K * t_all                (one client after another, all threads)
    parallel    ~ C * K * t_one / W + o        (W single-thread workers, W = cores; o per round)
    vectorized  ~ K_max * t_vmap(C)            (one vmapped step for all C clients; for plain FedAvg on
                                               a ReLU MLP, 1.5 x one step on all C clients' rows)
with C clients a round taking K local steps each on average. The vectorized executor runs as many
steps as the round's longest client, K_max, masking the others once they are done, so clients of
unequal sizes (a Dirichlet partition) cost it K_max / K times more than their steps.

A GPU always gets the vectorized executor; one core or one client per round, the sequential one.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.func import grad, vmap

from taciturn.tasks.base import Task

log = logging.getLogger(__name__)
PROBE_STEPS = 8
PROBE_CLIENTS = 8
PARALLEL_MARGIN = 0.9  # parallel must promise at least a 10% saving to pay for its processes
PARALLEL_ROUND_OVERHEAD_S = 0.004  # sending a share and receiving a partial, per round (benchmarks/speed.py)
LOWRANK_OVERHEAD = 1.5  # low-rank corrections and bookkeeping on top of the shared product


@dataclass(frozen=True)
class Choice:
    executor: str
    workers: int
    reason: str


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose(
    task: Task,
    batch: tuple[torch.Tensor, ...],
    clients_per_round: int,
    steps: float,
    vectorized: str,
    longest_steps: float | None = None,
) -> Choice:
    """``vectorized``: how the vectorized executor would train these clients ("vmap", "lowrank"
    for plain FedAvg on a ReLU MLP, engine/lowrank.py) or "none" if it cannot. ``steps``: mean
    local steps per client; ``longest_steps``: expected steps of a round's longest client."""
    cores = available_cores()
    if torch.cuda.is_available() and vectorized != "none":
        return Choice("vectorized", 0, "a GPU is present: all clients' local steps in one vmapped call")
    if cores < 2:
        return Choice("sequential", 0, "one CPU core: nothing to run in parallel")
    if clients_per_round < 2:
        return Choice("sequential", 0, "one client per round: nothing to run in parallel")
    timing = _probe(task, batch, min(clients_per_round, PROBE_CLIENTS), cores, vectorized)
    c = clients_per_round
    workers = min(cores, c)
    estimates = {
        "sequential": c * steps * timing["all_threads"],
        "parallel": c * steps * timing["one_thread"] / workers + PARALLEL_ROUND_OVERHEAD_S,
    }
    measured = (
        f"one local step takes {timing['all_threads'] * 1e3:.2f} ms with {cores} threads and "
        f"{timing['one_thread'] * 1e3:.2f} ms with one"
    )
    if "vectorized" in timing:
        per_client = timing["vectorized"] / timing["vectorized_clients"]
        estimates["vectorized"] = (
            (longest_steps or steps) * c * per_client * (LOWRANK_OVERHEAD if vectorized == "lowrank" else 1.0)
        )
        what = "one step on their stacked batches" if vectorized == "lowrank" else "a vmapped step"
        measured += f"; {what} for {timing['vectorized_clients']} clients {timing['vectorized'] * 1e3:.2f} ms"
        if longest_steps:
            measured += f", {longest_steps:.1f} steps for the longest client against {steps:.1f} on average"
    best = min(estimates, key=estimates.get)
    if best == "parallel" and estimates["parallel"] > PARALLEL_MARGIN * estimates["sequential"]:
        best = "sequential"
    ratio = estimates["sequential"] / estimates[best]
    reason = f"{measured}: estimated {ratio:.2f}x the sequential speed for {c} clients a round"
    return Choice(best, workers if best == "parallel" else 0, reason)


def expected_longest(steps: Sequence[float], k: int) -> float:
    """E[max] of ``k`` values drawn without replacement from ``steps``: with s_(1) <= ... <= s_(N),
    the j-th smallest is the maximum with probability C(j-1, k-1) / C(N, k)."""
    ordered, n = sorted(steps), len(steps)
    k = min(k, n)
    log_total = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return sum(
        s * math.exp(math.lgamma(j) - math.lgamma(k) - math.lgamma(j - k + 1) - log_total)
        for j, s in enumerate(ordered, start=1)
        if j >= k
    )


def _probe(task: Task, batch: tuple[torch.Tensor, ...], clients: int, cores: int, vectorized: str) -> dict:
    params = task.init_params(torch.Generator().manual_seed(0))
    previous = torch.get_num_threads()
    timing: dict[str, float] = {}
    try:
        for label, threads in (("all_threads", cores), ("one_thread", 1)):
            torch.set_num_threads(threads)
            timing[label] = _time_steps(task, params, batch)
        torch.set_num_threads(cores)
        if vectorized == "vmap":
            timing["vectorized"] = _time_vmap(task, params, batch, clients)
        elif vectorized == "lowrank":  # the shared product dominates: one step on all clients' rows
            timing["vectorized"] = _time_steps(
                task, params, tuple(b.repeat(clients, *[1] * (b.dim() - 1)) for b in batch)
            )
        if vectorized != "none":
            timing["vectorized_clients"] = clients
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


def _time_vmap(task: Task, params, batch, clients: int) -> float:
    stacked = {k: v.unsqueeze(0).repeat(clients, *([1] * v.dim())) for k, v in params.items()}
    weight = torch.ones(batch[0].shape[0])
    batches = tuple(b.unsqueeze(0).repeat(clients, *([1] * b.dim())) for b in (*batch, weight))
    step = vmap(grad(task.loss))
    durations = []
    for _ in range(PROBE_STEPS // 2 + 1):
        started = time.perf_counter()
        step(stacked, batches)
        durations.append(time.perf_counter() - started)
    return min(durations[1:])
