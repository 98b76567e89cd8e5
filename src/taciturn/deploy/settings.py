"""What a deployed run reads from Flower's run config (server and nodes) and node config (nodes).

Run config (``[tool.flwr.app.config]`` of the app folder, or ``flwr run --run-config``):
    taciturn-config   the taciturn run config, as TOML text (the nodes read the same text)
    out               the run directory the ServerApp writes, a path on the server's machine
                      (relative: to the folder the SuperLink was started in), resolved there
    overwrite         start afresh in ``out`` if it holds an earlier run (default false)
    resume            continue the run in ``out`` from its last checkpoint (default false), e.g.
                      after the server stopped: ``flwr run . --run-config resume=true``
    round-timeout     seconds the server waits for a round's replies; a client that has not
                      replied by then counts as dropped (default 120)
    min-nodes         at the start of each round the server waits (up to round-timeout) until
                      this many SuperNodes are connected (default 1)
    min-trained       the floor: a round in which fewer of the picked clients trained (replied
                      with an update or stayed silent on purpose) falls short (default 1) ...
    patience          ... and after this many short rounds in a row the run stops with an error
                      naming why the clients were missing (default 3)
Node config (``flower-supernode --node-config``):
    clients           the client ids this node hosts, e.g. "0,1" or "3": with per-client data
                      ([data] dataset = "clients") the ids of its own clients, in the order of its
                      data; otherwise partition ids of the run's dataset
    state-dir         where the node keeps its clients' persistent state (survives restarts), one
                      folder per taciturn run in it (``run_folder``), so runs never share state
    data.<key>        this node's own data, replacing the run's ``[data] <key>`` on this node:
                      data.path="/srv/site-1" (a folder of per-client .npz files, or one file),
                      data.factory="pkg.mod:load" with data.kwargs.<arg>=...; or, for a run over a
                      shared dataset, where its copy is (data.path="/srv/fmnist")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taciturn.experiments.config import ConfigError, RunConfig, set_dotted, validate


class DeployError(ConfigError):
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
    refuse_undeployable(config)
    return config


def refuse_undeployable(config: RunConfig) -> None:
    """What a deployed run cannot do, refused from the config alone: when the app folder is made,
    when the server and each node read the run config, and when the runner starts a deployed run
    (before the server asks the nodes for anything, a per-client-data run's census included)."""
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
    compression = config.compression
    initial = (
        getattr(config.algorithm, "start", None) == "common"
        or getattr(config.algorithm, "uplink", None) == "change"
    )
    if compression.enabled or initial:
        raise DeployError(
            "[compression], algorithm.start = 'common' and algorithm.uplink = 'change' run in simulation "
            "only: a deployed node does not compress or build the initial model yet"
        )
    if getattr(config.model, "buffers", "federated") == "local":
        raise DeployError("[model.buffers] 'local' is not supported by deployed runs yet; use 'federated'")
    if config.eval.clients:
        raise DeployError(
            "[eval.clients] deployed runs keep each client's data on its node; client-side evaluation "
            "runs in simulation only for now (leave eval.clients at 0)"
        )
    if config.secagg.enabled and config.data.dataset == "clients" and config.data.test is None:
        raise DeployError(
            "[secagg] with per-client data and no data.test: federated evaluation would send each "
            "client's exact score on its own held-out split to the server in the clear, beside the "
            "updates SecAgg+ hides from it; give the server a held-out set (data.test)"
        )


def run_folder(run_config: Mapping[str, Any]) -> str:
    """The folder of a node's state-dir that holds one run's client states: named after the run's
    config and run directory, not Flower's run id, since a resumed run is a new Flower run."""
    import hashlib

    key = f"{run_config.get('taciturn-config', '')}\0{run_config.get('out', '')}"
    return "run-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def checked_count(value: Any, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DeployError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def checked_min_nodes(value: Any) -> int:
    return checked_count(value, "min-nodes")


def same_version(theirs: str, who: str) -> None:
    """Server and nodes run the same taciturn: the app folder holds no code, the installed package
    is the code, and two versions may not compute alike. ``who``: the other end, "server" or "node N"."""
    from taciturn import __version__

    if theirs != __version__:
        raise DeployError(
            f"taciturn versions differ: {__version__} here, {theirs} on the {who}; install the same "
            "version on the server and every node (docs/deploy.md, step 0)"
        )


@dataclass(frozen=True)
class ServerSettings:
    config: RunConfig
    out: Path
    overwrite: bool
    round_timeout: float
    min_nodes: int = 1
    resume: bool = False
    min_trained: int = 1
    patience: int = 3

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
            Path(str(_require(run_config, "out", where))).expanduser().resolve(),  # on the server
            overwrite,
            timeout,
            min_nodes,
            resume,
            checked_count(run_config.get("min-trained", 1), "min-trained", 0),
            checked_count(run_config.get("patience", 3), "patience"),
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
