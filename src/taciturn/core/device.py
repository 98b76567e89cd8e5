"""Where a run computes: ``engine.device = "auto" | "cpu" | "cuda" | "cuda:N" | "mps"``.

Messages and checkpoints stay device-free (the codec writes CPU bytes; ``Message.from_tensors``
copies device tensors to the host); what they decode to lands on the run's device, which this
module holds for the process. The runner places the model, the data and the test set there, so
algorithm state, batches and local steps follow without any code path of their own.
"""

from __future__ import annotations

import re

import torch

from taciturn.core.errors import TaciturnError

SPEC = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
_current = torch.device("cpu")


class DeviceError(TaciturnError, ValueError):
    """A device this machine does not have."""


def resolve(spec: str) -> torch.device:
    """The device ``spec`` names; ``auto`` is the first of cuda, mps and cpu that this machine has."""
    if not SPEC.match(spec):
        raise DeviceError(f"unknown device {spec!r}: use auto, cpu, cuda, cuda:N or mps")
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device {spec!r}: this PyTorch sees no CUDA GPU (torch.cuda.is_available() is False)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device {spec!r}: MPS is not available on this machine")
    return device


def use(device: torch.device) -> None:
    """Make ``device`` the one decoded tensors land on, in this process."""
    global _current
    _current = device


def current() -> torch.device:
    return _current


def place(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the run's device (itself when it is already there)."""
    return tensor if tensor.device == _current else tensor.to(_current)
