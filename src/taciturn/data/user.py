"""Your own data as a taciturn dataset: tensors, torch Datasets or Hugging Face datasets.

Everything becomes an ``ArrayDataset`` (all samples in one tensor, which the federated view slices
per client without copying). Integer targets are class labels (any partition applies); floating
targets are regression targets, and several integers per sample (token labels, a causal LM's next
tokens) stay integers (both num_classes = 0: only the iid and natural partitions apply, and the run
needs a loss for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from taciturn.data.datasets import ArrayDataset, DataError

HOLDOUT = 0.1  # the share of a single dataset held out for evaluation when no test set is given


def _tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as error:
        raise DataError(f"{what} must be a tensor or an array, got {type(value).__name__}: {error}") from None


def from_tensors(
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    name: str = "tensors",
    num_classes: int | None = None,
    groups: Any = None,
) -> ArrayDataset:
    """A dataset from four tensors (or arrays): inputs with samples along the first dimension,
    targets either class labels (integers 0..C-1), several integers per sample (token labels, which
    a loss of yours reads) or floating regression targets. ``groups``: a client id per training
    sample, for ``partition.kind = "natural"``."""
    xs = [_tensor(x_train, "x_train"), _tensor(x_test, "x_test")]
    ys = [_tensor(y_train, "y_train"), _tensor(y_test, "y_test")]
    for split, x, y in (("train", xs[0], ys[0]), ("test", xs[1], ys[1])):
        if x.ndim == 0 or len(x) == 0:
            raise DataError(f"x_{split} holds no samples")
        if len(x) != len(y):
            raise DataError(f"x_{split} has {len(x)} samples but y_{split} has {len(y)}")
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise DataError(f"train inputs are {tuple(xs[0].shape[1:])} but test inputs {tuple(xs[1].shape[1:])}")
    if ys[0].shape[1:] != ys[1].shape[1:]:
        raise DataError(
            f"train targets are {tuple(ys[0].shape[1:])} but test targets {tuple(ys[1].shape[1:])}"
        )
    xs = [x.float() if x.is_floating_point() else x for x in xs]
    integers = not ys[0].is_floating_point() and not ys[0].is_complex()
    if integers and ys[0].ndim > 1:  # token labels, next tokens: integers for the loss, not classes
        ys = [y.long() for y in ys]
        classes = 0
    elif integers:
        ys = [y.long() for y in ys]
        low = min(int(y.min()) for y in ys)
        if low < 0:
            raise DataError(f"class labels must be 0, 1, ...; found {low}")
        top = max(int(y.max()) for y in ys) + 1
        if num_classes is not None and num_classes < top:
            raise DataError(f"num_classes = {num_classes} but the labels go up to {top - 1}")
        classes = num_classes or max(top, 2)
    else:
        ys = [y.float() for y in ys]
        classes = 0
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != (len(ys[0]),):
            raise DataError(
                f"groups must hold one client id per training sample ({len(ys[0])}), got {groups.shape}"
            )
    source = f"{name}: {len(ys[0])} training and {len(ys[1])} test samples given by the user"
    return ArrayDataset(name, xs[0], ys[0], xs[1], ys[1], classes, source, groups)


def _stack(dataset: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All (x, y) items of a map-style torch Dataset, stacked."""
    try:
        items = [dataset[i] for i in range(len(dataset))]
    except TypeError:
        raise DataError(
            f"{what}: a map-style dataset (len and [i]) is needed, got {type(dataset).__name__}"
        ) from None
    if not items or not all(isinstance(item, Sequence) and len(item) == 2 for item in items[:1]):
        raise DataError(f"{what}: items must be (x, y) pairs")
    x = torch.stack([_tensor(item[0], f"{what} x") for item in items])
    y = torch.stack([_tensor(item[1], f"{what} y") for item in items])
    return x, y


def from_torch(train: Any, test: Any, name: str = "dataset") -> ArrayDataset:
    """A dataset from two map-style torch Datasets whose items are (x, y) pairs."""
    return from_tensors(*_stack(train, "train"), *_stack(test, "test"), name=name)


def _hf_columns(dataset: Any, x: str | None, y: str | None) -> tuple[str, str]:
    columns = list(dataset.column_names)
    y = y or next((c for c in ("label", "labels", "y", "target") if c in columns), None)
    rest = [c for c in columns if c != y]
    x = x or (rest[0] if len(rest) == 1 else None)
    if y not in columns or x not in columns:
        raise DataError(
            f"which columns are the inputs and the targets? columns: {', '.join(columns)}; "
            "use taciturn.data.from_hf(train, test, x=..., y=...)"
        )
    return x, y


def from_hf(
    train: Any,
    test: Any,
    x: str | None = None,
    y: str | None = None,
    name: str = "hf",
    groups: str | None = None,
) -> ArrayDataset:
    """A dataset from two Hugging Face ``datasets.Dataset`` with numeric input column ``x`` and
    target column ``y`` (found by name when there is no doubt: "label", "labels", "y", "target");
    ``groups``: the column that names each training sample's client (the natural partition)."""
    if groups is not None and groups not in train.column_names:
        raise DataError(f"no column {groups!r} to partition by; columns: {', '.join(train.column_names)}")
    if groups is not None and x is None:
        train_columns = [c for c in train.column_names if c != groups]
        x = next((c for c in train_columns if c not in (y, "label", "labels", "y", "target")), None)
    x, y = _hf_columns(train, x, y)
    splits = []
    for split in (train, test):
        table = split.with_format("torch", columns=[x, y])
        splits += [_tensor(table[x], f"{name} {x}"), _tensor(table[y], f"{name} {y}")]
    ids = None if groups is None else np.asarray(train[groups])
    return from_tensors(splits[0], splits[1], splits[2], splits[3], name=name, groups=ids)


def _is_hf(value: Any) -> bool:
    return type(value).__module__.startswith("datasets")


def held_out(dataset: ArrayDataset, rng: np.random.Generator) -> ArrayDataset:
    """Split one set into train and a seeded HOLDOUT share for evaluation."""
    n = len(dataset.y_train)
    order = torch.from_numpy(rng.permutation(n))
    cut = max(1, round(HOLDOUT * n))
    test, train = order[:cut], order[cut:]
    x, y = dataset.x_train, dataset.y_train
    source = f"{dataset.name}: {len(train)} training samples, {cut} held out ({HOLDOUT:.0%}, seeded)"
    groups = None if dataset.groups is None else dataset.groups[train.numpy()]
    return ArrayDataset(
        dataset.name, x[train], y[train], x[test], y[test], dataset.num_classes, source, groups
    )


def as_dataset(data: Any, rng: np.random.Generator) -> ArrayDataset:
    """What ``taciturn.run(data=...)`` and a ``data.factory`` accept, as an ArrayDataset: one, four
    tensors, a (train, test) pair of torch or HF datasets, an HF DatasetDict with "train" and
    "test", or a single torch / HF dataset (a seeded 10% is held out for evaluation)."""
    if isinstance(data, ArrayDataset):
        return data
    if isinstance(data, tuple | list) and len(data) == 4:
        return from_tensors(*data)
    if isinstance(data, tuple | list) and len(data) == 2:
        train, test = data
        return from_hf(train, test) if _is_hf(train) else from_torch(train, test)
    if _is_hf(data) and hasattr(data, "keys"):  # a DatasetDict
        if not {"train", "test"} <= set(data.keys()):
            raise DataError(f"a DatasetDict needs 'train' and 'test' splits, it has {', '.join(data.keys())}")
        return from_hf(data["train"], data["test"])
    if _is_hf(data):
        return held_out(from_hf(data, data.select(range(1))), rng)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        x, y = _stack(data, "data")
        return held_out(from_tensors(x, y, x[:1], y[:1], name=type(data).__name__), rng)
    raise DataError(
        f"cannot use a {type(data).__name__} as data: give taciturn.data.from_tensors(...), a torch "
        "Dataset of (x, y) items, a (train, test) pair of them, or a Hugging Face dataset"
    )
