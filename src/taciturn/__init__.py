"""taciturn: federated and collaborative learning that speaks only when it must.

Use it from Python with ``taciturn.run(config, model=..., data=...)`` (see docs/guide.md), or
from the command line with ``taciturn run CONFIG.toml``.

Layers (imports point downward only)::

    cli / experiments   configs, runner, run directory, resume
    report              plots and the HTML report, read from a run directory
    engine              round loop and executors
    algorithms          FedAvg and the methods that share its shape
    tasks / data        datasets, partitioners, models, losses
    core                Message, codec, Channel, Ledger, RNG streams, client-state store
"""

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Result", "data", "export", "resume", "run"]


def __getattr__(name: str) -> Any:
    """``taciturn.run`` and friends, imported on first use (``import taciturn`` stays light)."""
    if name in ("run", "resume", "export", "Result"):
        return getattr(importlib.import_module("taciturn.api"), name)
    if name == "data":
        return importlib.import_module("taciturn.data")
    raise AttributeError(f"module 'taciturn' has no attribute {name!r}")
