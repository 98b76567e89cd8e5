"""Data poisoning: the attackers' training labels flipped y -> C - 1 - y (the label-flipping attack
of Biggio et al. 2012 as run in federated benchmarks, e.g. Fang et al., USENIX Security 2020,
Sec. 5), before any training, so every executor trains the attackers on the same poisoned data."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from taciturn.data.federated import FederatedData


def flip_labels(data: FederatedData, attackers: frozenset[int]) -> FederatedData:
    """A copy of ``data`` whose attackers' training labels are flipped (the original untouched)."""
    classes = data.dataset.num_classes
    if classes < 2:
        raise ValueError("label_flip needs a classification dataset")
    y = data.dataset.y_train.clone()
    if attackers:
        idx = torch.from_numpy(np.concatenate([data.client_indices(c) for c in sorted(attackers)]))
        y[idx] = classes - 1 - y[idx]
    return dataclasses.replace(data, dataset=dataclasses.replace(data.dataset, y_train=y))
