"""Minibatch plans: which of a client's samples each local step uses."""

from __future__ import annotations

import math

import numpy as np


def batch_plan(
    num_samples: int, batch_size: int, epochs: int, steps: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    """Positions (into the client's data) of each minibatch: reshuffled every epoch, last batch kept.

    With ``steps`` set, epochs are chained until exactly that many batches are taken.
    """
    size = min(batch_size, num_samples)
    per_epoch = math.ceil(num_samples / size)
    if steps is not None:
        epochs = math.ceil(steps / per_epoch)
    batches = []
    for _ in range(epochs):
        order = rng.permutation(num_samples)
        batches += [order[i : i + size] for i in range(0, num_samples, size)]
    return batches if steps is None else batches[:steps]
