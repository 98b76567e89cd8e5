"""Message: named arrays plus small metadata, the only thing that crosses a wire.

Arrays are NumPy (framework-neutral, like Flower's ArrayRecord); torch code converts with
``from_tensors`` / ``tensors`` without copying. Metadata holds JSON scalars only (str, int,
float, bool) and stays small: it is for counts and flags, not payloads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from taciturn.core.device import place

MetaValue = str | int | float | bool
MAX_META_BYTES = 64 * 1024


@dataclass(frozen=True)
class Message:
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    meta: Mapping[str, MetaValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, array in self.arrays.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"message array names must be non-empty strings, got {name!r}")
            if name == "__metadata__":
                raise ValueError("'__metadata__' is reserved by the codec; rename the array")
            if not isinstance(array, np.ndarray):
                raise TypeError(
                    f"message array {name!r} is a {type(array).__name__}; use Message.from_tensors "
                    "for torch tensors or np.asarray for other array types"
                )
        for key, value in self.meta.items():
            if not isinstance(key, str):
                raise TypeError(f"metadata keys must be strings, got {key!r}")
            if not isinstance(value, str | int | float | bool):
                raise TypeError(
                    f"metadata {key!r} is a {type(value).__name__}; metadata holds str, int, float or bool "
                    "(put arrays in Message.arrays)"
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"metadata {key!r} is {value}; metadata must be finite (JSON has no NaN)")

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], **meta: MetaValue) -> Message:
        """Wrap torch tensors (detached, on the CPU) without copying them."""
        arrays = {name: t.detach().cpu().numpy() for name, t in tensors.items()}
        return cls(arrays=arrays, meta=meta)

    def tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The arrays whose names start with ``prefix`` (prefix stripped), as torch tensors on the run's
        device (core/device.py; on the CPU they share memory with the arrays)."""
        return {
            name[len(prefix) :]: place(torch.from_numpy(array))
            for name, array in self.arrays.items()
            if name.startswith(prefix)
        }

    @property
    def payload_bytes(self) -> int:
        """Bytes of array data alone (the encoded message adds a small header)."""
        return sum(a.nbytes for a in self.arrays.values())
