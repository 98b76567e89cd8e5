"""Data that comes per client: each client's own records, with no partition drawn by the run seed.

A silo (a hospital, a bank, a phone) holds its own records and nothing else: whatever it holds is
its clients' data, of any size. ``[data] dataset = "clients"`` (experiments/config.py) reads it:

* ``path``: a folder of ``.npz`` files, one per client in sorted name order (client 0, 1, ...), or
  one ``.npz`` file (one client). Each holds ``x_train`` and ``y_train`` and, optionally, the
  client's own held-out split ``x_test`` and ``y_test``. Read with ``allow_pickle=False``: a file
  that sent pickled objects is refused, not executed.
* ``factory``: a function returning one item per client: a mapping with those keys, or a tuple
  ``(x_train, y_train)`` or ``(x_train, y_train, x_test, y_test)``.

The same loaders serve the simulation (every client in one process) and a deployed node (its own
clients only; deploy/client_app.py), so a silo deployment and its simulation read the same arrays.
Targets follow taciturn.data.user: integers are class labels, floats regression targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taciturn.data.datasets import ArrayDataset, DataError
from taciturn.data.federated import FederatedData
from taciturn.data.user import _tensor

KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class ClientSet:
    """One client's own data: a training set and a held-out split (possibly empty)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass(frozen=True)
class Schema:
    """What every client's data must share, and what the model is built for."""

    input_shape: tuple[int, ...]
    classes: int  # class labels 0 .. classes - 1; 0: floating regression targets
    target_shape: tuple[int, ...]  # () for class labels

    def fields(self) -> list[int]:
        """As a flat list of integers (a Flower ConfigRecord carries it): see ``from_fields``."""
        return [
            len(self.input_shape),
            *self.input_shape,
            self.classes,
            len(self.target_shape),
            *self.target_shape,
        ]

    @classmethod
    def from_fields(cls, values: Sequence[int]) -> Schema:
        values = list(values)
        n = values[0]
        shape, rest = tuple(values[1 : 1 + n]), values[1 + n :]
        classes, m = rest[0], rest[1]
        if len(rest) != 2 + m:
            raise DataError(f"a data schema of {values} is malformed")
        return cls(shape, classes, tuple(rest[2 : 2 + m]))


def client_set(raw: Any, what: str) -> ClientSet:
    """One client's data from a mapping (``KEYS``; the held-out split optional) or a tuple of 2 or 4."""
    if isinstance(raw, Mapping) or hasattr(raw, "files"):  # an NpzFile is mapping-like
        names = set(raw.files if hasattr(raw, "files") else raw.keys())
        missing = [k for k in ("x_train", "y_train") if k not in names]
        if missing or ("x_test" in names) != ("y_test" in names):
            raise DataError(
                f"{what} holds {sorted(names)}: a client's data is x_train and y_train, with x_test "
                "and y_test for its held-out split (both or neither)"
            )
        arrays = [raw[k] if k in names else None for k in KEYS]
    elif isinstance(raw, tuple | list) and len(raw) in (2, 4):
        arrays = [*raw, None, None][:4]
    else:
        raise DataError(
            f"{what} is a {type(raw).__name__}: give a mapping with x_train, y_train (x_test, y_test), "
            "or a tuple (x_train, y_train) or (x_train, y_train, x_test, y_test)"
        )
    x, y = _tensor(arrays[0], f"{what} x_train"), _tensor(arrays[1], f"{what} y_train")
    if arrays[2] is None:
        x_test, y_test = x[:0], y[:0]
    else:
        x_test, y_test = _tensor(arrays[2], f"{what} x_test"), _tensor(arrays[3], f"{what} y_test")
    for split, a, b in (("train", x, y), ("test", x_test, y_test)):
        if a.ndim == 0 or len(a) != len(b):
            raise DataError(f"{what}: x_{split} has {len(a) if a.ndim else 0} samples but y_{split} {len(b)}")
    if len(x) == 0:
        raise DataError(f"{what} has no training samples")
    if x.shape[1:] != x_test.shape[1:] or y.shape[1:] != y_test.shape[1:]:
        raise DataError(f"{what}: its training and held-out samples differ in shape")
    labels = not y.is_floating_point() and not y.is_complex() and y.ndim == 1
    if labels:
        y, y_test = y.long(), y_test.long()
        low = min(int(t.min()) for t in (y, y_test) if len(t))
        if low < 0:
            raise DataError(f"{what}: class labels must be 0, 1, ...; found {low}")
    else:
        y, y_test = y.float(), y_test.float()
    return ClientSet(
        x.float() if x.is_floating_point() else x,
        y,
        x_test.float() if x_test.is_floating_point() else x_test,
        y_test,
    )


def read_files(path: Path) -> list[ClientSet]:
    """A folder of ``.npz`` files (one client each, sorted by name) or one ``.npz`` file."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
        if not files:
            raise DataError(f"{path} holds no .npz files; put one file per client there")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{path} does not exist: give a folder of per-client .npz files, or one such file")
    clients = []
    for file in files:
        try:
            with np.load(file, allow_pickle=False) as arrays:
                clients.append(client_set(arrays, str(file)))
        except (OSError, ValueError) as error:  # not a .npz, damaged, or pickled objects
            raise DataError(f"{file} cannot be read as arrays ({error}); write it with numpy.savez") from None
    return clients


def schema_of(clients: Sequence[ClientSet], ids: Sequence[int] | None = None) -> Schema:
    """The shapes and classes the clients share; a client that differs is named by its id (``ids``:
    those of ``clients``, default 0, 1, ...)."""
    ids = list(range(len(clients))) if ids is None else list(ids)
    if not clients:
        raise DataError("no client data: give at least one client")
    head = clients[0]
    labels = head.y_train.dtype == torch.int64
    for client, data in zip(ids, clients, strict=True):
        if (
            data.x_train.shape[1:] != head.x_train.shape[1:]
            or data.y_train.shape[1:] != head.y_train.shape[1:]
        ):
            raise DataError(
                f"client {client}'s samples are {tuple(data.x_train.shape[1:])} -> "
                f"{tuple(data.y_train.shape[1:])}, client {ids[0]}'s {tuple(head.x_train.shape[1:])} -> "
                f"{tuple(head.y_train.shape[1:])}: every client's data must have the same shapes"
            )
        if (data.y_train.dtype == torch.int64) != labels:
            raise DataError(
                f"client {client} has {'float' if labels else 'integer'} targets, client {ids[0]} not"
            )
    classes = 0
    if labels:
        classes = max(2, 1 + max(int(t.max()) for c in clients for t in (c.y_train, c.y_test) if len(t)))
    return Schema(tuple(head.x_train.shape[1:]), classes, tuple(head.y_train.shape[1:]))


def merged(clients: Sequence[ClientSet], schema: Schema, name: str, source: str) -> FederatedData:
    """Every client's training set in one tensor, client i owning the i-th block (no copy per
    client afterwards, as for any FederatedData); the held-out splits concatenated likewise."""
    sizes = [len(c.y_train) for c in clients]
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    dataset = ArrayDataset(
        name,
        torch.cat([c.x_train for c in clients]),
        torch.cat([c.y_train for c in clients]),
        torch.cat([c.x_test for c in clients]),
        torch.cat([c.y_test for c in clients]),
        schema.classes,
        source,
    )
    return FederatedData.from_parts(dataset, [np.arange(cuts[i], cuts[i + 1]) for i in range(len(clients))])


def held_out(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's own held-out set: an ``.npz`` file with ``x_test`` and ``y_test`` (or ``x``, ``y``)."""
    try:
        with np.load(Path(path), allow_pickle=False) as arrays:
            names = set(arrays.files)
            keys = ("x_test", "y_test") if {"x_test", "y_test"} <= names else ("x", "y")
            if not set(keys) <= names:
                raise DataError(f"{path} holds {sorted(names)}: the held-out set is x_test and y_test")
            x, y = (_tensor(arrays[k], f"{path} {k}") for k in keys)
    except (OSError, ValueError) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"{path} cannot be read as arrays ({error}); write it with numpy.savez") from None
    if len(x) == 0 or len(x) != len(y):
        raise DataError(f"{path}: {len(x)} inputs and {len(y)} targets; the held-out set needs samples")
    return (x.float() if x.is_floating_point() else x), (y.float() if y.is_floating_point() else y.long())
