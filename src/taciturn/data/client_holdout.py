"""Each client's own held-out split, carved from its own data (``[eval] clients``).

Federated benchmarks with naturally partitioned data give every client a test split of its own, so
that the global model can be scored on each client's data and the per-client distribution reported
(LEAF, Caldas et al. 2018, ``split_data.py``: each user's samples are shuffled and cut into a
training part of ``max(1, int(train_frac * n))`` samples and a test part of the rest). The same
cut is made here, with ``train_frac = 1 - holdout``: a client of ``n`` samples keeps
``max(1, floor((1 - holdout) n))`` for training and holds out the others, chosen by a permutation
drawn from the client's own stream (run seed, client, "client_holdout"), so a split depends on the
seed and that client's data only, not on the number of clients or the executor. The held-out
samples are removed from the client's training data for the whole run; a client too small to spare
one (``n = 1``, or ``floor`` leaves it all) holds none out and is never evaluated.
"""

from __future__ import annotations

import math

import numpy as np

from taciturn.core.rng import Streams

PURPOSE = "client_holdout"


def kept_for_training(size: int, holdout: float) -> int:
    """LEAF's rule: ``max(1, floor((1 - holdout) size))`` samples train, the others are held out."""
    if size == 0:
        return 0
    return max(1, math.floor(round((1 - holdout) * size, 9)))  # round: (1 - 0.2) * 10 is 7.999...


def carve(
    parts: list[np.ndarray], holdout: float, streams: Streams
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(training parts, held-out parts): client k's indices split by a permutation from its stream;
    both keep the order the partition gave (a client's training batches stay a slice of its data)."""
    train, held_out = [], []
    for client, part in enumerate(parts):
        keep = kept_for_training(len(part), holdout)
        order = streams.numpy(0, client, PURPOSE).permutation(len(part))
        out = np.zeros(len(part), dtype=bool)
        out[order[keep:]] = True
        train.append(part[~out])
        held_out.append(part[out])
    return train, held_out
