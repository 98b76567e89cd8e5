"""Where taciturn keeps files between runs (downloads, decoded datasets, executor probes)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/taciturn``, by default ``~/.cache/taciturn``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "taciturn"
