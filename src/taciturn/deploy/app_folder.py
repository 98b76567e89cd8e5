"""The Flower app folder ``flwr run`` sends to the SuperLink: taciturn's ServerApp and ClientApp,
and the run config (settings.py) with the taciturn config inside it as TOML text.

The folder holds only a pyproject.toml: the code is the installed taciturn (every machine installs
the same taciturn wheel, docs/deploy.md step 0, and server and nodes check that their versions
agree), so the FAB Flower ships is a few hundred bytes. ``out`` is written as given: it is a path on
the server, resolved there (settings.py), not on the machine that submits the run.
"""

from __future__ import annotations

import json
from pathlib import Path

from taciturn.deploy.settings import DeployError, checked_count, checked_min_nodes, run_config_of
from taciturn.experiments.config import RunConfig, to_toml

PYPROJECT = """\
# Written by `taciturn deploy app`: start it with `flwr run {folder} <connection>`.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "taciturn-{name}"
version = "1.0.0"
description = "taciturn run '{name}' on Flower's deployment runtime"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "taciturn"

[tool.flwr.app.components]
serverapp = "taciturn.deploy.server_app:app"
clientapp = "taciturn.deploy.client_app:{clientapp}"

[tool.flwr.app.config]
taciturn-config = {config}
out = {out}
overwrite = {overwrite}
resume = false
round-timeout = {timeout}
min-nodes = {min_nodes}
min-trained = {min_trained}
patience = {patience}
"""


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-") or "run"


def write_app(
    folder: Path,
    config: RunConfig,
    out: Path,
    round_timeout: float = 120.0,
    overwrite_run: bool = False,
    min_nodes: int = 1,
    overwrite: bool = False,
    min_trained: int = 1,
    patience: int = 3,
) -> Path:
    """Write the app folder for ``config`` whose ServerApp writes the run directory ``out``."""
    folder = Path(folder)
    text = to_toml(config)
    run_config_of(text)  # a config that cannot deploy fails here, before anything starts
    checked_min_nodes(min_nodes)
    checked_count(min_trained, "min-trained", 0)
    checked_count(patience, "patience")
    pyproject = folder / "pyproject.toml"
    if pyproject.exists() and not overwrite:
        raise DeployError(f"{pyproject} exists; pass --overwrite to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    pyproject.write_text(
        PYPROJECT.format(
            folder=folder,
            name=_slug(config.name),
            clientapp="secagg_app" if config.secagg.enabled else "app",  # SecAgg+: Flower's mod on
            config=json.dumps(text),  # a TOML basic string is a JSON string
            out=json.dumps(str(out)),
            overwrite="true" if overwrite_run else "false",
            timeout=float(round_timeout),
            min_nodes=int(min_nodes),
            min_trained=int(min_trained),
            patience=int(patience),
        )
    )
    return pyproject
