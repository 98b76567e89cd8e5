"""A synthetic classification set: Gaussian classes around random means (a known, easy problem)."""

from __future__ import annotations

import numpy as np
import torch

from taciturn.data.datasets import ArrayDataset


def load(
    rng: np.random.Generator,
    num_samples: int = 2000,
    num_features: int = 20,
    num_classes: int = 4,
    separation: float = 2.0,
    test_fraction: float = 0.2,
) -> ArrayDataset:
    # Each coordinate of a class mean is N(0, separation^2 / d), so two means lie about
    # separation * sqrt(2) apart whatever the dimension, against unit noise along any direction.
    means = rng.normal(0.0, separation / np.sqrt(num_features), size=(num_classes, num_features))
    n_total = int(num_samples / (1.0 - test_fraction))
    y = rng.integers(0, num_classes, size=n_total)
    x = means[y] + rng.normal(size=(n_total, num_features))
    x_t = torch.from_numpy(x.astype(np.float32))
    y_t = torch.from_numpy(y.astype(np.int64))
    return ArrayDataset(
        "synthetic",
        x_t[:num_samples],
        y_t[:num_samples],
        x_t[num_samples:],
        y_t[num_samples:],
        num_classes,
        f"synthetic: {num_classes} Gaussian classes in {num_features} dimensions",
    )
