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
# The safetensors dtypes those kinds encode to: decode accepts exactly what encode writes.
_WIRE_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64"}
# Each array's header entry is well under 1 KiB; the cap bounds what a hostile header can make us parse.
MAX_HEADER_BYTES = MAX_META_BYTES + 1024 * 1024 * 64


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
    """The message in ``data``, or a CodecError saying what is wrong with the bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"a message is bytes, got {type(data).__name__}")
    if len(data) < 8:
        raise CodecError(f"a message is at least 8 bytes (the header length), got {len(data)}")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise CodecError(f"header length {header_len} exceeds the {len(data) - 8} bytes that follow")
    if header_len > MAX_HEADER_BYTES:
        raise CodecError(f"header of {header_len} bytes is over the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = json.loads(bytes(data[8 : 8 + header_len]))
    except ValueError as error:
        raise CodecError(f"cannot decode message: the header is not JSON ({error})") from None
    except RecursionError:  # a header nested deeper than the parser's stack (sent by a hostile node)
        raise CodecError("cannot decode message: the header nests too deeply") from None
    if not isinstance(header, dict):
        raise CodecError("cannot decode message: the header is not a JSON object")
    meta_text = header.get("__metadata__", {})
    meta_text = meta_text.get(_META_KEY, "{}") if isinstance(meta_text, dict) else None
    if not isinstance(meta_text, str):
        raise CodecError("cannot decode message: __metadata__ must map to strings")
    if len(meta_text) > MAX_META_BYTES:
        raise CodecError(f"message metadata is {len(meta_text)} bytes, over the {MAX_META_BYTES}-byte limit")
    for name, entry in header.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) and name != "__metadata__" else "BOOL"
        if dtype not in _WIRE_DTYPES:
            raise CodecError(
                f"array {name!r} has dtype {dtype!r}; a message holds only {sorted(_WIRE_DTYPES)}"
            )
    try:
        meta = json.loads(meta_text)
        arrays = safetensors.numpy.load(bytes(data))
        # safetensors returns the arrays in hash order, which changes from process to process; a
        # fixed order keeps everything that walks a message (norms, flattening, grouping) reproducible.
        return Message(arrays={name: arrays[name] for name in sorted(arrays)}, meta=meta)
    except Exception as error:  # any parse or validation failure means the bytes are not a message
        raise CodecError(f"cannot decode message: {error}") from None
