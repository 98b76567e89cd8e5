"""In-memory classification datasets and the registry the config names them by."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from taciturn.core.errors import TaciturnError


class DataError(TaciturnError, ValueError):
    """Data that cannot be used: missing, corrupt, or not what the config says."""


class DatasetNotFound(DataError, FileNotFoundError):
    """No source could provide a dataset; the message lists what was tried and how to fix it."""


@dataclass(frozen=True)
class ArrayDataset:
    name: str
    x_train: torch.Tensor  # float32, (n, *input_shape)
    y_train: torch.Tensor  # int64, (n,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    source: str  # where the data came from (shown in the report)
    groups: np.ndarray | None = None  # a client id per training sample (the "natural" partition)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def load_dataset(
    name: str,
    rng: np.random.Generator,
    path: Path | None = None,
    classes: Sequence[int] | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    **options,
) -> ArrayDataset:
    """Load a dataset by its config name. ``rng`` drives anything random (synthetic data, splits).

    ``classes``, ``train_size`` and ``test_size`` cut a smaller problem from it (data/subset.py).
    """
    from taciturn.data import digits, fashion_mnist, synthetic
    from taciturn.data.subset import subset

    if name == "fashion_mnist":
        dataset = fashion_mnist.load(path=path, **options)
    elif name == "digits":
        dataset = digits.load(rng)
    elif name == "synthetic":
        dataset = synthetic.load(rng, **options)
    else:
        raise ValueError(f"unknown dataset {name!r}; choose fashion_mnist, digits or synthetic")
    return subset(dataset, rng, classes, train_size, test_size)
