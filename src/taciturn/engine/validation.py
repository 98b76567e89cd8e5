"""Server-side checks of an arrived uplink: a malformed or non-finite update is never averaged in."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from taciturn.core.message import Message


def uplink_problem(message: Message, spec: Mapping[str, tuple[int | None, ...]]) -> str | None:
    """The reason to reject ``message`` against the expected array names and shapes, or None.

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
    for name, shape in spec.items():
        array = message.arrays[name]
        if len(array.shape) != len(shape) or any(
            want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
        ):
            return f"array {name!r} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        if array.dtype.kind not in "fiub":
            return f"array {name!r} has dtype {array.dtype}"
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            return f"array {name!r} has {bad} non-finite values (NaN/Inf)"
    return None
