"""What a deployed run reads from Flower's run config (server and nodes) and node config (nodes).

Run config (``[tool.flwr.app.config]`` of the app folder, or ``flwr run --run-config``):
    taciturn-config   the taciturn run config, as TOML text (the nodes read the same text)
    out               the run directory the ServerApp writes (on the server's machine)
    overwrite         start afresh in ``out`` if it holds an earlier run (default false)
    round-timeout     seconds the server waits for a round's replies; a client that has not
                      replied by then counts as dropped (default 120)
Node config (``flower-supernode --node-config``):
    clients           the client (partition) ids this node hosts, e.g. "0,1" or "3"
    state-dir         where the node keeps its clients' persistent state (survives restarts)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taciturn.core.errors import TaciturnError
from taciturn.experiments.config import RunConfig, validate


class DeployError(TaciturnError):
    """A deployment that cannot run: a missing or malformed run or node setting."""


def _require(config: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in config:
        raise DeployError(f"{where} lacks '{key}' (see taciturn/deploy/settings.py)")
    return config[key]


def run_config_of(text: str) -> RunConfig:
    """The taciturn config carried as TOML text, validated, fit for a deployment."""
    import tomllib

    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise DeployError(f"run config 'taciturn-config' is not valid TOML: {error}") from None
    config = validate(tree, "<run config taciturn-config>")
    if config.channel.drop_up or config.channel.drop_down:
        raise DeployError(
            "[channel] drop_up / drop_down simulate lost messages; in a deployment the network "
            "decides what is lost: remove them"
        )
    if config.secagg.enabled:
        raise DeployError(
            "[secagg] is taciturn's simulated secure aggregation; deployed runs do not run it yet "
            "(docs/deploy.md, 'Not there yet'): remove it"
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


@dataclass(frozen=True)
class ServerSettings:
    config: RunConfig
    out: Path
    overwrite: bool
    round_timeout: float

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ServerSettings:
        where = "the Flower run config"
        timeout = float(run_config.get("round-timeout", 120.0))
        if timeout <= 0:
            raise DeployError(f"round-timeout must be positive, got {timeout}")
        return cls(
            run_config_of(str(_require(run_config, "taciturn-config", where))),
            Path(str(_require(run_config, "out", where))),
            bool(run_config.get("overwrite", False)),
            timeout,
        )


@dataclass(frozen=True)
class NodeSettings:
    clients: tuple[int, ...]
    state_dir: Path

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
        return cls(clients, Path(str(_require(node_config, "state-dir", where))))
