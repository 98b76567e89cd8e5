"""Smaller problems cut from a dataset: a subset of its classes and a stratified sample of it.

The theory of wide networks is tested on small two-class problems (Jian & Liu, ICML 2025, use
about 108 MNIST images of the digits 0 and 1); CPU budgets also call for subsampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from taciturn.data.datasets import ArrayDataset


def stratified_sample(labels: np.ndarray, size: int, rng: np.random.Generator, split: str) -> np.ndarray:
    """``size`` indices drawn without replacement, each class in proportion to its share (sorted)."""
    if size > len(labels):
        raise ValueError(
            f"data.{split}_size = {size}, but only {len(labels)} {split} samples are available; "
            f"lower data.{split}_size"
        )
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * size / len(labels)
    take = np.floor(exact).astype(int)
    for c in np.argsort(-(exact - take), kind="stable")[: size - take.sum()]:  # largest remainders
        take[c] += 1
    chosen = [
        rng.choice(np.flatnonzero(labels == c), n, replace=False) for c, n in zip(classes, take, strict=True)
    ]
    return np.sort(np.concatenate(chosen))


def subset(
    dataset: ArrayDataset,
    rng: np.random.Generator,
    classes: Sequence[int] | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
) -> ArrayDataset:
    """Keep ``classes`` (relabelled 0, 1, ... in the order given), then sample each split to its size."""
    x_train, y_train, x_test, y_test = dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test
    num_classes, notes = dataset.num_classes, []
    if classes is not None:
        bad = [c for c in classes if not 0 <= c < dataset.num_classes]
        if bad or len(set(classes)) != len(classes) or len(classes) < 2:
            raise ValueError(
                f"data.classes must be at least two distinct labels in [0, {dataset.num_classes}), "
                f"got {list(classes)}"
            )
        relabel = torch.full((dataset.num_classes,), -1, dtype=torch.int64)
        relabel[torch.tensor(list(classes))] = torch.arange(len(classes))
        keep_train, keep_test = relabel[y_train] >= 0, relabel[y_test] >= 0
        x_train, y_train = x_train[keep_train], relabel[y_train[keep_train]]
        x_test, y_test = x_test[keep_test], relabel[y_test[keep_test]]
        num_classes = len(classes)
        notes.append(f"classes {list(classes)}")
    if train_size is not None:
        keep = torch.from_numpy(stratified_sample(y_train.numpy(), train_size, rng, "train"))
        x_train, y_train = x_train[keep], y_train[keep]
        notes.append(f"{train_size} training samples")
    if test_size is not None:
        keep = torch.from_numpy(stratified_sample(y_test.numpy(), test_size, rng, "test"))
        x_test, y_test = x_test[keep], y_test[keep]
        notes.append(f"{test_size} test samples")
    if not notes:
        return dataset
    return replace(
        dataset,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=num_classes,
        source=f"{dataset.source}; subset: {', '.join(notes)}",
    )
