"""Sizes checked against the machine before any work: a config that cannot fit (a hidden layer of
10**9 units, 10**12 synthetic samples, a Q-table of terabytes) is a ConfigError, not an allocation
traceback or a swapping machine. The estimates are lower bounds: they catch what can never fit, not
what merely might not. The limit is the machine's memory; ``TACITURN_MAX_MEMORY_GIB`` lowers or
raises it (never the config: see experiments/limits.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

from taciturn.experiments.config import ConfigError

# float32 parameters live at least four times over in a round: the server's, a client's copy, its
# gradients and the update being aggregated.
PARAMETER_COPIES = 4
VARIABLE = "TACITURN_MAX_MEMORY_GIB"


def physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_limit() -> tuple[int, str]:
    """The bytes a run may need, and what that limit is."""
    text = os.environ.get(VARIABLE)
    if text is None:
        return physical_memory(), "this machine's memory"
    try:
        gib = float(text)
    except ValueError:
        raise ConfigError(f"{VARIABLE}={text!r} must be a number of GiB") from None
    if not gib > 0:
        raise ConfigError(f"{VARIABLE}={text!r} must be a positive number of GiB")
    return int(gib * 2**30), f"{VARIABLE}"


def check_fits(what: str, nbytes: int | float, fix: str) -> None:
    total, source = memory_limit()
    if nbytes > total:
        raise ConfigError(
            f"{what} needs at least {nbytes / 2**30:,.1f} GiB, more than the limit of "
            f"{total / 2**30:,.1f} GiB ({source}); {fix}, or raise the limit: "
            f"export {VARIABLE}={max(1, int(nbytes / 2**30) + 1)}"
        )


def check_model(build: Callable[[], nn.Module], what: str = "a model") -> None:
    """Count the parameters of the model ``build`` makes without allocating them (PyTorch's meta
    device), and check they fit."""
    try:
        with torch.device("meta"):
            count = sum(p.numel() for p in build().parameters())
    except (RuntimeError, OverflowError) as error:  # sizes whose product overflows even on meta
        raise ConfigError(f"{what} is too large to lay out ({error}); make it smaller") from None
    check_fits(f"{what} of {count:,} parameters", PARAMETER_COPIES * 4 * count, "make it smaller")
