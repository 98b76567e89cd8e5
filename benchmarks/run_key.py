"""Keys of cached benchmark runs, and the JSON-lines files that keep finished runs across sessions.

A finished run is reused only when its key is unchanged: a hash of what the caller says the run
depends on (its resolved config, and e.g. the model file) and of the code of src/taciturn, so any
change to the library reruns everything that depends on it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "taciturn"
CODE_VERSION = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(SRC.rglob("*.py")))).hexdigest()


def run_key(*parts: str) -> str:
    """sha256 of the parts and CODE_VERSION, concatenated."""
    return hashlib.sha256(("".join(parts) + CODE_VERSION).encode()).hexdigest()


def read_runs(log: Path) -> dict[str, dict]:
    """Every record of a JSON-lines log by its "key" (a later line with the same key wins)."""
    if not log.exists():
        return {}
    return {row["key"]: row for row in map(json.loads, log.read_text().splitlines()) if row}


def append_run(log: Path, record: dict) -> None:
    """One record as one line, flushed at once: a run that finished survives a crash after it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as sink:
        sink.write(json.dumps(record) + "\n")
