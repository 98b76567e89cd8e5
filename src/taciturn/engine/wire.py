"""A round's part between processes: a JSON header and codec blobs, nothing pickled.

The parallel executor sends these through pipes, the Ray executor through Ray's object store; both
carry one reduced partial aggregate per worker per round (``algorithm.accumulate``), its ledger
rows and its report, never one update per client.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from taciturn.algorithms.base import ArraySpec, Arrival
from taciturn.core.codec import decode, encode
from taciturn.core.message import Message
from taciturn.core.packing import pack, unpack
from taciturn.engine.pipeline import RoundPart


def encode_spec(spec: Mapping[str, ArraySpec]) -> dict[str, list]:
    """The uplink spec as JSON: each name's shape and dtype."""
    return {k: [list(v.shape), v.dtype.str] for k, v in spec.items()}


def decode_spec(spec: Mapping[str, list]) -> dict[str, ArraySpec]:
    return {k: ArraySpec(tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in spec.items()}


def encode_part(part: RoundPart, ledger_rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[bytes]]:
    partial, blobs = _encode_partial(part.accumulated)
    header = {
        "partial": partial,
        "blobs": len(blobs),
        "ledger": ledger_rows,
        "accepted": part.accepted,
        "rejected": part.rejected,
        "failed": part.failed,
        "losses": part.losses,
        "client_info": {str(c): info for c, info in part.client_info.items()},
        "heard": part.heard,
        "settled": part.settled,
    }
    return header, blobs


def decode_part(header: dict[str, Any], blobs: list[bytes]) -> RoundPart:
    """The part ``encode_part`` wrote (its ledger rows stay in ``header["ledger"]``)."""
    return RoundPart(
        _decode_partial(header["partial"], [decode(blob) for blob in blobs]),
        list(header["accepted"]),
        [tuple(r) for r in header["rejected"]],
        [tuple(f) for f in header["failed"]],
        list(header["losses"]),
        {int(c): info for c, info in header["client_info"].items()},
        heard=list(header["heard"]),
        settled=list(header["settled"]),
    )


def _encode_partial(partial: Any) -> tuple[dict[str, Any], list[bytes]]:
    if isinstance(partial, list):  # the default accumulation: the arrivals themselves
        return {"kind": "arrivals", "clients": [a.client for a in partial]}, [
            encode(a.message) for a in partial
        ]
    if dataclasses.is_dataclass(partial):
        cls = type(partial)
        return {"kind": "packed", "class": f"{cls.__module__}:{cls.__qualname__}"}, [encode(pack(partial))]
    raise TypeError(f"cannot send a partial aggregate of type {type(partial).__name__} between processes")


def _decode_partial(header: dict[str, Any], messages: list[Message]) -> Any:
    if header["kind"] == "arrivals":
        return [Arrival(c, m) for c, m in zip(header["clients"], messages, strict=True)]
    module, name = header["class"].split(":")
    if not module.startswith("taciturn."):
        raise ValueError(f"refusing to build {header['class']}: partial aggregates come from taciturn")
    return unpack(getattr(importlib.import_module(module), name), messages[0])
