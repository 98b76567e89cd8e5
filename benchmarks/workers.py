"""Worker processes for benchmarks that run many independent, seeded runs: one run per process."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)  # one run per core: runs of these small models do not scale past one thread


def one_run_per_core(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` spawned processes with torch on one thread each (spawn, not fork: forking a process
    whose torch threads have started can deadlock). The runs are seeded, so the numbers do not
    depend on ``jobs``."""
    return ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_one_thread)
