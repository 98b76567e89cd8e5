"""Cluster recovery: pairwise F1 of "these two agents share samples" against "same true cluster"."""

from __future__ import annotations

import numpy as np


def pair_f1(membership: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """F1 over agent pairs i < j, per repetition: membership (R, N, N) bool, labels (R, N).

    bandpy scores the inferred graph's upper triangle the same way (sklearn ``f1_score``). When
    there is no true pair and none is predicted (e.g. two agents in two clusters, correctly apart)
    recovery is perfect and F1 is 1; sklearn would report 0 with a warning.
    """
    upper = np.triu(np.ones(labels.shape[1:] * 2, dtype=bool), k=1)
    truth = (labels[:, :, None] == labels[:, None, :])[:, upper]
    predicted = membership[:, upper]
    true_positive = (truth & predicted).sum(axis=1)
    wrong = (truth != predicted).sum(axis=1)
    denominator = 2 * true_positive + wrong
    return np.where(denominator > 0, 2 * true_positive / np.maximum(denominator, 1), 1.0)
