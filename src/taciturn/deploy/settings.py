"""What a deployed run reads from Flower's run config (server and nodes) and node config (nodes).

Run config (``[tool.flwr.app.config]`` of the app folder, or ``flwr run --run-config``):
    taciturn-config   the taciturn run config, as TOML text (the nodes read the same text)
    out               the run directory the ServerApp writes (on the server's machine)
    overwrite         start afresh in ``out`` if it holds an earlier run (default false)
    resume            continue the run in ``out`` from its last checkpoint (default false), e.g.
                      after the server stopped: ``flwr run . --run-config resume=true``
    round-timeout     seconds the server waits for a round's replies; a client that has not
                      replied by then counts as dropped (default 120)
    min-nodes         at the start of each round the server waits (up to round-timeout) until
                      this many SuperNodes are connected (default 1)
Node config (``flower-supernode --node-config``):
    clients           the client (partition) ids this node hosts, e.g. "0,1" or "3"
    state-dir         where the node keeps its clients' persistent state (survives restarts), one
                      folder per taciturn run in it (``run_folder``), so runs never share state
    data.<key>        where this node finds its data, replacing the run's ``[data] <key>``, e.g.
                      data.path="/srv/fmnist" or data.kwargs.path="/srv/site.npz" (a factory's
                      argument): each node reads its own copy of the run's dataset
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taciturn.core.errors import TaciturnError
from taciturn.experiments.config import RunConfig, set_dotted, validate


class DeployError(TaciturnError):
    """A deployment that cannot run: a missing or malformed run or node setting."""


def _require(config: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in config:
        raise DeployError(f"{where} lacks '{key}' (see taciturn/deploy/settings.py)")
    return config[key]


def run_config_of(text: str, data: tuple[tuple[str, Any], ...] = ()) -> RunConfig:
    """The taciturn config carried as TOML text, validated, fit for a deployment; ``data``: a
    node's own ``data.*`` settings (NodeSettings), applied before validation."""
    import tomllib

    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise DeployError(f"run config 'taciturn-config' is not valid TOML: {error}") from None
    for key, value in data:
        set_dotted(tree, key, value)
    config = validate(
        tree, "<run config taciturn-config>" + (" with the node's data settings" if data else "")
    )
    if config.channel.drop_up or config.channel.drop_down:
        raise DeployError(
            "[channel] drop_up / drop_down simulate lost messages; in a deployment the network "
            "decides what is lost: remove them"
        )
    if config.privacy.enabled and config.privacy.mode == "local":
        raise DeployError(
            "[privacy] mode = 'local' adds noise in the simulated client pipeline, which deployed nodes "
            "do not run yet: use mode = 'central' (noise added on the server)"
        )
    if config.attack.active:
        raise DeployError("[attack] simulates malicious clients; a deployment has only real ones: remove it")
    if config.analysis.enabled:
        raise DeployError("[analysis] needs every client's model in one process; it does not deploy")
    return config


def run_folder(run_config: Mapping[str, Any]) -> str:
    """The folder of a node's state-dir that holds one run's client states: named after the run's
    config and run directory, not Flower's run id, since a resumed run is a new Flower run."""
    import hashlib

    key = f"{run_config.get('taciturn-config', '')}\0{run_config.get('out', '')}"
    return "run-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def checked_min_nodes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DeployError(f"min-nodes must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class ServerSettings:
    config: RunConfig
    out: Path
    overwrite: bool
    round_timeout: float
    min_nodes: int = 1
    resume: bool = False

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ServerSettings:
        where = "the Flower run config"
        timeout = float(run_config.get("round-timeout", 120.0))
        if timeout <= 0:
            raise DeployError(f"round-timeout must be positive, got {timeout}")
        min_nodes = checked_min_nodes(run_config.get("min-nodes", 1))
        overwrite, resume = bool(run_config.get("overwrite", False)), bool(run_config.get("resume", False))
        if overwrite and resume:
            raise DeployError("overwrite and resume are both true: start afresh, or continue; not both")
        return cls(
            run_config_of(str(_require(run_config, "taciturn-config", where))),
            Path(str(_require(run_config, "out", where))),
            overwrite,
            timeout,
            min_nodes,
            resume,
        )


@dataclass(frozen=True)
class NodeSettings:
    clients: tuple[int, ...]
    state_dir: Path
    data: tuple[tuple[str, Any], ...] = ()  # ("data.path", "/srv/fmnist"), ...

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> NodeSettings:
        where = "the node config (flower-supernode --node-config)"
        raw = str(_require(node_config, "clients", where))
        try:
            clients = tuple(sorted({int(part) for part in raw.replace(" ", "").split(",") if part}))
        except ValueError:
            raise DeployError(f"node config clients={raw!r}: expected client ids like '0,1'") from None
        if not clients or min(clients) < 0:
            raise DeployError(f"node config clients={raw!r}: name one or more ids >= 0")
        data = tuple(sorted((k, v) for k, v in node_config.items() if k.startswith("data.")))
        return cls(clients, Path(str(_require(node_config, "state-dir", where))), data)
