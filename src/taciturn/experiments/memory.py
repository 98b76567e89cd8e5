"""Sizes checked against the machine before any work: a config that cannot fit (a hidden layer of
10**9 units, 10**12 synthetic samples) is a ConfigError, not an allocation traceback or a swapping
machine. The estimates are lower bounds: they catch what can never fit, not what merely might not.
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


def physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(what: str, nbytes: int, fix: str) -> None:
    total = physical_memory()
    if nbytes > total:
        raise ConfigError(
            f"{what} needs at least {nbytes / 2**30:,.1f} GiB, more than this machine's "
            f"{total / 2**30:,.1f} GiB of memory; {fix}"
        )


def check_model(build: Callable[[], nn.Module]) -> None:
    """Count the parameters of the model ``build`` makes without allocating them (PyTorch's meta
    device), and check they fit."""
    with torch.device("meta"):
        count = sum(p.numel() for p in build().parameters())
    check_fits(f"a model of {count:,} parameters", PARAMETER_COPIES * 4 * count, "make it smaller")
