"""In-memory classification datasets and the registry the config names them by."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


class DatasetNotFound(FileNotFoundError):
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

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def train_subset(dataset: ArrayDataset, size: int, rng: np.random.Generator) -> ArrayDataset:
    """The same dataset with a random subset of ``size`` training samples (test set unchanged)."""
    if size > len(dataset.y_train):
        raise ValueError(f"train_subset={size} exceeds the {len(dataset.y_train)} training samples")
    keep = torch.from_numpy(np.sort(rng.choice(len(dataset.y_train), size=size, replace=False)))
    return dataclasses.replace(
        dataset,
        x_train=dataset.x_train[keep],
        y_train=dataset.y_train[keep],
        source=f"{dataset.source} (random {size} of {len(dataset.y_train)} training samples)",
    )


def load_dataset(name: str, rng: np.random.Generator, path: Path | None = None, **options) -> ArrayDataset:
    """Load a dataset by its config name. ``rng`` drives anything random (synthetic data, splits)."""
    from taciturn.data import digits, fashion_mnist, synthetic

    if name == "fashion_mnist":
        return fashion_mnist.load(path=path, **options)
    if name == "digits":
        return digits.load(rng)
    if name == "synthetic":
        return synthetic.load(rng, **options)
    raise ValueError(f"unknown dataset {name!r}; choose fashion_mnist, digits or synthetic")
