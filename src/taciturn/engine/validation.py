"""Server-side checks: a malformed uplink is never averaged in, and a non-finite aggregate never
becomes the model.

An uplink must carry exactly the arrays the server expects, each with the expected shape and the
expected dtype (a float64 update would silently change the global model's dtype; an integer or
boolean one would break the arithmetic), and every float value must be finite. Even finite
updates can sum to Inf in float32 (two values of 3e38): an update with a value so large that the
weighted sum of the population's updates could overflow is rejected, and named, on its own
(``overflow_problem``), so that one client sending huge finite values does not get every round
skipped without being singled out. The new server state is checked too (``state_problem``): a
round whose aggregate is non-finite all the same is skipped and the model kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from taciturn.algorithms.base import ArraySpec
from taciturn.core.message import Message


def uplink_problem(message: Message, spec: Mapping[str, ArraySpec]) -> str | None:
    """The reason to reject ``message`` against the expected arrays, or None.

    A ``None`` in a shape accepts any length along that axis (variable-size payloads such as
    Ferret's coordinates, whose count depends on the update).
    """
    names, expected = set(message.arrays), set(spec)
    if names != expected:
        parts = []
        if missing := sorted(expected - names):
            parts.append(f"missing arrays {missing}")
        if extra := sorted(names - expected):
            parts.append(f"unexpected arrays {extra}")
        return "; ".join(parts)
    for name, (shape, dtype) in spec.items():
        array = message.arrays[name]
        if len(array.shape) != len(shape) or any(
            want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
        ):
            return f"array {name!r} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        if array.dtype != dtype:
            return f"array {name!r} has dtype {array.dtype}, expected {np.dtype(dtype)}"
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            return f"array {name!r} has {bad} non-finite values (NaN/Inf)"
    return None


def overflow_problem(message: Message, total_weight: float) -> str | None:
    """The reason to reject an uplink one of whose float values exceeds ``dtype max / W``, W the
    population's total weight (the largest sum of weights any round can give its updates): below
    that bound no weighted sum of the round's updates can overflow, above it the update is no
    training step but an attack or a fault."""
    for name, array in message.arrays.items():
        if array.dtype.kind != "f" or not array.size:
            continue
        limit = float(np.finfo(array.dtype).max) / max(total_weight, 1.0)
        if (largest := float(np.abs(array).max())) > limit:
            return (
                f"array {name!r} has a value of magnitude {largest:.3g}: above {limit:.3g}, the weighted "
                "sum of the round's updates could overflow"
            )
    return None


def _tensors(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{path}.{key}" if path else str(key))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)


def state_problem(state: Any) -> str | None:
    """The reason a server state (a dataclass of tensors) is unusable, or None: any non-finite
    float value in any of its tensors."""
    for path, tensor in _tensors(state, ""):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int(tensor.numel() - torch.isfinite(tensor).sum())
            return f"the aggregate made {path} non-finite ({bad} NaN/Inf values)"
    return None
