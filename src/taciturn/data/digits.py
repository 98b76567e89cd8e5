"""scikit-learn's bundled 8x8 handwritten digits (1,797 images): small enough for fast tests."""

from __future__ import annotations

import numpy as np
import torch

from taciturn.data.datasets import ArrayDataset

TEST_FRACTION = 0.2


def load(rng: np.random.Generator) -> ArrayDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy((bunch.images / 16.0).astype(np.float32)).unsqueeze(1)  # (n, 1, 8, 8)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    order = torch.from_numpy(rng.permutation(len(y)))
    n_test = round(TEST_FRACTION * len(y))
    test, train = order[:n_test], order[n_test:]
    return ArrayDataset("digits", x[train], y[train], x[test], y[test], 10, "scikit-learn load_digits")
