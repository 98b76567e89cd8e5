"""Limits checked against this machine before any work: processes, threads, iterations, classes.

A config may come from someone else, or carry a typo: ``workers = 4096`` once forked thousands of
processes and froze the machine, ``engine.threads = 1e8`` aborted inside OpenMP, ``iterations =
1e9`` of centered clipping never ended. Each is refused before the first fork, thread or allocation,
with a message that says the limit and how to raise it. A limit is raised with an environment
variable, never by the config: the one who writes the config is not always the one whose machine
runs it. Memory is checked the same way (experiments/memory.py).
"""

from __future__ import annotations

import os
from typing import Any

from taciturn.experiments.config import ConfigError

CORE_MULTIPLE = 4  # workers or threads per core allowed: a small multiple (hyper-threads, I/O waits)
MAX_ITERATIONS = 10_000  # centered clipping's L per round (Karimireddy et al. use 1 to 3)
MAX_CLASSES = 100_000  # class labels: a partition keeps a clients x classes histogram


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def limit(name: str, default: int) -> int:
    """``TACITURN_<NAME>`` if set (a positive integer), else ``default``."""
    variable = f"TACITURN_{name}"
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{variable}={text!r} must be a positive integer") from None
    if value < 1:
        raise ConfigError(f"{variable}={text!r} must be a positive integer")
    return value


def check(what: str, value: int, name: str, default: int, why: str) -> None:
    """Refuse ``value`` above the limit ``TACITURN_<name>`` (default ``default``), saying both."""
    bound = limit(name, default)
    if value > bound:
        raise ConfigError(
            f"{what} is {value:,}, over the limit of {bound:,} ({why}); use a smaller value, or raise the "
            f"limit for this shell if you mean it: export TACITURN_{name}={value}"
        )


def check_engine(engine: Any) -> None:
    """[engine] workers and threads against this machine's cores, before anything forks."""
    here = cores()
    local = engine.executor != "ray" or engine.ray_address is None  # Ray actors on a cluster are not ours
    if local:
        check(
            "[engine.workers]",
            engine.workers,
            "MAX_WORKERS",
            CORE_MULTIPLE * here,
            f"{CORE_MULTIPLE} worker processes per core of this machine's {here}",
        )
    check(
        "[engine.threads]",
        engine.threads,
        "MAX_THREADS",
        CORE_MULTIPLE * here,
        f"{CORE_MULTIPLE} threads per core of this machine's {here}",
    )


def check_iterations(what: str, value: int) -> None:
    check(what, value, "MAX_ITERATIONS", MAX_ITERATIONS, "iterations of work per round")


def check_classes(what: str, value: int) -> None:
    check(what, value, "MAX_CLASSES", MAX_CLASSES, "class labels; a partition keeps a histogram of them")
