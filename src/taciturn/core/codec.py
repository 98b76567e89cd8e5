"""The one codec: Message <-> bytes, in the safetensors format.

safetensors is a length-prefixed JSON header followed by raw little-endian array data: nothing
on the wire or in a checkpoint is ever unpickled. Message metadata travels as one JSON string
under the header's ``__metadata__`` (safetensors metadata must be str -> str).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import safetensors.numpy

from taciturn.core.errors import TaciturnError
from taciturn.core.message import MAX_META_BYTES, Message

_META_KEY = "taciturn"
_SUPPORTED_KINDS = "biuf"  # bool, signed int, unsigned int, float


class CodecError(TaciturnError, ValueError):
    """Bytes that are not a valid taciturn message."""


def _wire_array(name: str, array: np.ndarray) -> np.ndarray:
    if array.dtype.kind not in _SUPPORTED_KINDS:
        raise TypeError(
            f"array {name!r} has dtype {array.dtype}, which has no safetensors encoding; "
            "convert it to a bool, integer or float dtype"
        )
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array if array.flags.c_contiguous else array.copy(order="C")  # ascontiguousarray makes 0-d 1-d


def encode(message: Message) -> bytes:
    meta = json.dumps(dict(message.meta), sort_keys=True, separators=(",", ":"))
    if len(meta) > MAX_META_BYTES:
        raise ValueError(
            f"message metadata is {len(meta)} bytes (limit {MAX_META_BYTES}); put data in arrays"
        )
    arrays = {name: _wire_array(name, a) for name, a in message.arrays.items()}
    return safetensors.numpy.save(arrays, metadata={_META_KEY: meta})


def decode(data: bytes) -> Message:
    if len(data) < 8:
        raise CodecError(f"a message is at least 8 bytes (the header length), got {len(data)}")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise CodecError(f"header length {header_len} exceeds the {len(data) - 8} bytes that follow")
    try:
        header = json.loads(data[8 : 8 + header_len])
        meta = json.loads(header.get("__metadata__", {}).get(_META_KEY, "{}"))
        arrays = safetensors.numpy.load(bytes(data))
    except Exception as error:  # any parse failure means the bytes are not a message
        raise CodecError(f"cannot decode message: {error}") from error
    if not isinstance(meta, dict):
        raise CodecError("message metadata must be a JSON object")
    # safetensors returns the arrays in hash order, which changes from process to process; a
    # fixed order keeps everything that walks a message (norms, flattening, grouping) reproducible.
    return Message(arrays={name: arrays[name] for name in sorted(arrays)}, meta=meta)
