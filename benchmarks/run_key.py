"""Keys of cached benchmark runs, and the JSON-lines files that keep finished runs across sessions.

A finished run is reused only when its key is unchanged: a hash of what the caller says the run
depends on (its resolved config, and e.g. the model file) and of the library code a simulation
run executes, so a change to that code reruns everything that depends on it.

That code is the import closure of SIMULATION_ENTRY (the runner, every algorithm, the language
task the runner imports lazily), not all of src/taciturn: a benchmark's pieces are made over several
sessions, and a change to code no simulation run executes (bandits/, rl/, deploy/, the Ray
executor, the CLI) must not throw away hours of stored runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "taciturn"
SIMULATION_ENTRY = ("taciturn.experiments.runner", "taciturn.experiments.language", "taciturn.algorithms")


def simulation_modules() -> dict[str, Path]:
    """Every taciturn module that importing SIMULATION_ENTRY loads, by name, with its source file.

    Found in a fresh interpreter: this one may already hold modules a test or the caller imported."""
    probe = (
        f"import importlib, json, sys\nfor name in {SIMULATION_ENTRY!r}: importlib.import_module(name)\n"
        "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items()}))"
    )
    paths = [str(SRC.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}  # no empty entry: it would mean "cwd"
    found = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True)
    loaded = json.loads(found.stdout)
    return {n: Path(f) for n, f in sorted(loaded.items()) if n.split(".")[0] == "taciturn" and f}


def code_version(modules: dict[str, Path]) -> str:
    """sha256 over each module's name and source."""
    digest = hashlib.sha256()
    for name, path in modules.items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


CODE_VERSION = code_version(simulation_modules())


def run_key(*parts: str) -> str:
    """sha256 of the parts and CODE_VERSION, concatenated."""
    return hashlib.sha256(("".join(parts) + CODE_VERSION).encode()).hexdigest()


def read_runs(log: Path) -> dict[str, dict]:
    """Every record of a JSON-lines log by its "key" (a later line with the same key wins)."""
    if not log.exists():
        return {}
    return {row["key"]: row for row in map(json.loads, log.read_text().splitlines()) if row}


def append_run(log: Path, record: dict) -> None:
    """One record as one line, flushed at once: a run that finished survives a crash after it.
    Worker processes append to one log: the lock keeps two long lines whole even where a write is
    split or the file system does not make appends atomic (a network file system)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as sink:
        fcntl.flock(sink, fcntl.LOCK_EX)
        sink.write(json.dumps(record) + "\n")
