"""Pack a state dataclass (server state, algorithm records) into a Message and back.

Fields may be tensors, NumPy arrays, dicts of tensors (parameters), JSON scalars or None. This is how server
states are checkpointed through the codec: tensors become arrays, scalars become metadata.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
import torch

from taciturn.core.device import place
from taciturn.core.message import Message

T = TypeVar("T")
_KIND = "__kind__/"  # metadata recording how each field was stored


def pack(state: Any) -> Message:
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if value is None:
            meta[_KIND + f.name] = "none"
        elif isinstance(value, torch.Tensor):
            meta[_KIND + f.name] = "tensor"
            arrays[f.name] = value.detach().cpu().numpy()
        elif isinstance(value, np.ndarray):
            meta[_KIND + f.name] = "array"
            arrays[f.name] = value
        elif isinstance(value, dict):
            meta[_KIND + f.name] = "dict"
            for key, tensor in value.items():
                arrays[f"{f.name}/{key}"] = tensor.detach().cpu().numpy()
        elif isinstance(value, str | int | float | bool):
            meta[_KIND + f.name] = "scalar"
            meta[f.name] = value
        else:
            raise TypeError(f"cannot pack field {f.name!r} of type {type(value).__name__}")
    return Message(arrays=arrays, meta=meta)


def unpack(cls: type[T], message: Message) -> T:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = message.meta.get(_KIND + f.name)
        if kind == "none":
            values[f.name] = None
        elif kind == "tensor":
            values[f.name] = place(torch.from_numpy(message.arrays[f.name]))
        elif kind == "array":
            values[f.name] = np.array(message.arrays[f.name])  # a writable copy
        elif kind == "dict":
            values[f.name] = message.tensors(prefix=f"{f.name}/")
        elif kind == "scalar":
            values[f.name] = message.meta[f.name]
        elif f.default is not dataclasses.MISSING:  # a field added since the checkpoint was written
            values[f.name] = f.default
        else:
            raise ValueError(f"checkpoint has no field {f.name!r} for {cls.__name__}")
    return cls(**values)
