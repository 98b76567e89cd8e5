"""Saving a matplotlib figure the same way in every report (a PNG beside report.html)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from taciturn.core.folder import Folder


@dataclass(frozen=True)
class Png:
    """A figure as written: where it is, and its bytes (report.html inlines them)."""

    path: Path
    data: bytes


def save(fig, folder: Folder, rel: str) -> Png:
    """Write ``fig`` as ``rel`` inside ``folder`` (core/folder.py: never through a link)."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    data = buffer.getvalue()
    folder.write_bytes(rel, data)  # makes the folders above it too, none through a link
    return Png(folder.where(rel), data)
