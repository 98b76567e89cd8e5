"""``taciturn run`` for federated Q-learning (config ``type = "fedq"``): config, loop, checkpoints, resume.

One run is one sample path: M agents running FedQ-Hoeffding or FedQ-Bernstein on one tabular
MDP for a budget of episodes per agent. The MDP has its own seed, so runs that differ only in
``seed`` are sample paths on the same MDP. The run directory is the one every experiment type
writes: config.toml, metrics.jsonl (one row per round), ledger.csv, checkpoints/, plots/,
report.html, plus mdp.safetensors (the MDP itself, so the run is self-contained).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taciturn.algorithms.base import StrictModel
from taciturn.core.channel import Channel
from taciturn.core.codec import decode, encode
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.rng import SERVER, Streams
from taciturn.core.state_store import MemoryStateStore
from taciturn.experiments import checkpoint, memory
from taciturn.experiments.config import (
    ChannelConfig,
    CheckpointConfig,
    ConfigError,
    RunName,
    load_run_config,
    to_toml,
)
from taciturn.experiments.progress import human_bytes
from taciturn.report.fedq import MDP_FILE, summary, write_fedq_comparison
from taciturn.report.rundir import RunDir
from taciturn.rl.federation import FedQFederation, RoundRecord
from taciturn.rl.fedq import FedQ, FedQState
from taciturn.rl.mdp import TabularMDP, random_mdp

log = logging.getLogger("taciturn")

RoundCallback = Callable[[int, dict[str, Any]], None]


class RandomMdpConfig(StrictModel):
    """The FedQ papers' generator: r ~ U[0, 1], P_h(.|x, a) ~ Dirichlet(1), first state uniform."""

    kind: Literal["random"] = "random"
    states: int = Field(3, ge=1)
    actions: int = Field(2, ge=1)
    horizon: int = Field(5, ge=1)
    seed: int = Field(0, ge=0, description="the MDP's own seed: runs differing only in `seed` share the MDP")


class FileMdpConfig(StrictModel):
    """Your own MDP: a safetensors file with transitions (H,S,A,S), rewards (H,S,A), initial (S)."""

    kind: Literal["file"]
    path: Path


class FedQAlgorithmConfig(StrictModel):
    bonus: Literal["hoeffding", "bernstein"] = "hoeffding"
    c: float = Field(1.0, gt=0, description="bonus constant (c, or c' for Bernstein); the papers use 1")
    iota: float = Field(1.0, gt=0, description="the log factor iota; the papers' experiments use 1")


class FedQRunConfig(StrictModel):
    """Federated Q-learning: M agents, FedQ-Hoeffding or FedQ-Bernstein, on a tabular MDP."""

    type: Literal["fedq"]
    name: RunName = "fedq"
    seed: int = Field(0, ge=0, description="drives the agents' trajectories and the channel's drops")
    agents: int = Field(10, ge=1, description="M")
    episodes: int = Field(30000, ge=1, le=10**9, description="episodes per agent (the papers' T / H)")
    mdp: Annotated[RandomMdpConfig | FileMdpConfig, Field(discriminator="kind")] = RandomMdpConfig()
    algorithm: FedQAlgorithmConfig = FedQAlgorithmConfig()
    channel: ChannelConfig = ChannelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(every=100)

    @model_validator(mode="before")
    @classmethod
    def _default_mdp_kind(cls, tree: Any) -> Any:
        if isinstance(tree, dict) and isinstance(tree.get("mdp"), dict) and "kind" not in tree["mdp"]:
            tree = {**tree, "mdp": {"kind": "random", **tree["mdp"]}}
        return tree

    @model_validator(mode="after")
    def _agents_can_act(self) -> FedQRunConfig:
        if self.channel.drop_down >= 1.0:
            raise ValueError("channel.drop_down = 1 loses every broadcast, so no agent ever acts; use < 1")
        return self


@dataclass
class Experiment:
    config: FedQRunConfig
    rundir: RunDir
    mdp: TabularMDP
    fedq: FedQ
    ledger: Ledger
    federation: FedQFederation


def build_mdp(config: FedQRunConfig) -> TabularMDP:
    spec = config.mdp
    if spec.kind == "random":
        # the transitions P_h(.|x, a): H x S x A x S float64 (and their Dirichlet draw), checked first
        H, S, A = spec.horizon, spec.states, spec.actions
        memory.check_fits(
            f"[mdp] a random MDP of (H, S, A) = ({H}, {S}, {A})", 16 * H * S * A * S, "use a smaller one"
        )
        rng = Streams(spec.seed).numpy(0, SERVER, "mdp")
        return random_mdp(spec.states, spec.actions, spec.horizon, rng)
    if not spec.path.is_file():
        raise ConfigError(f"[mdp.path] {spec.path} does not exist")
    try:
        return TabularMDP.from_message(decode(spec.path.read_bytes()))
    except ValueError as error:
        raise ConfigError(f"[mdp.path] {spec.path}: {error}") from None


def prepare(config: FedQRunConfig, out: Path, mdp: TabularMDP, ledger: Ledger | None = None) -> Experiment:
    H, S, A, M = mdp.horizon, mdp.states, mdp.actions, config.agents
    # FedQ's tables (H x S x A: Q, counts, and Bernstein's sums) and the agents' local statistics
    # (M x H x S), float64 or int64
    memory.check_fits(
        f"FedQ with M = {M:,} agents on (H, S, A) = ({H}, {S}, {A})",
        8 * (6 * H * S * A + 4 * M * H * S),
        "use fewer agents or a smaller MDP",
    )
    streams = Streams(config.seed)
    fedq = FedQ(
        mdp.horizon,
        mdp.states,
        mdp.actions,
        config.agents,
        config.algorithm.bonus,
        config.algorithm.c,
        config.algorithm.iota,
    )
    ledger = ledger or Ledger()
    channel = Channel(ledger, streams, config.channel.drop_up, config.channel.drop_down)
    return Experiment(config, RunDir(out), mdp, fedq, ledger, FedQFederation(mdp, fedq, channel, streams))


def start(
    config: FedQRunConfig,
    out: Path,
    overwrite: bool = False,
    progress: bool = True,
    callbacks: tuple[RoundCallback, ...] = (),
) -> RunDir:
    """Run a new FedQ experiment into ``out`` (holding its lock)."""
    rundir = RunDir(out)
    with rundir.lock():
        rundir.check_free(overwrite)
        exp = prepare(config, out, build_mdp(config))  # a missing or malformed MDP file fails here
        rundir.reset(config, to_toml(config))
        rundir.write_bytes(MDP_FILE, encode(exp.mdp.to_message()))
        state = exp.fedq.init()
        counters = {"round": 0, "episodes": 0, "agent_episodes": 0, "regret": 0.0, "wall_s": 0.0}
        counters |= {"scalars_up": 0, "scalars_down": 0, "uploads_lost": 0}
        rundir.append_jsonl(rundir.metrics, _row(exp, counters, None, exp.federation.policy_gap(state)))
        return _loop(exp, state, counters, progress, callbacks)


def resume(path: Path, progress: bool = True, callbacks: tuple[RoundCallback, ...] = ()) -> RunDir:
    """Continue a FedQ run from its last checkpoint; it ends with the numbers of an uninterrupted run."""
    rundir = RunDir(path).require()
    with rundir.lock():
        config = load_run_config(rundir, FedQRunConfig)
        latest = rundir.latest_checkpoint()
        if latest is None:
            log.info("no checkpoint in %s: starting it again from round 0", path)
            return start(config, path, overwrite=True, progress=progress, callbacks=callbacks)
        round, folder = latest
        rundir.truncate_to(checkpoint.verify(folder))  # the MDP file is pinned by the manifest
        try:
            mdp = TabularMDP.from_message(decode(rundir.read_bytes(MDP_FILE)))
        except (ValueError, KeyError, TypeError) as error:
            raise checkpoint.CheckpointError(f"{rundir.path / MDP_FILE} is not an MDP ({error})") from None
        exp = prepare(config, path, mdp, ledger=rundir.read_ledger(up_to_round=round))
        state, counters = checkpoint.load(folder, exp.fedq.init(), MemoryStateStore())
        return _loop(exp, state, counters, progress, callbacks)


def _row(exp: Experiment, counters: dict[str, Any], record: RoundRecord | None, policy_gap: float) -> dict:
    """One metrics row: cumulative counters and traffic, and what happened in this round."""
    up, down = exp.ledger.totals(Direction.UP), exp.ledger.totals(Direction.DOWN)
    return {
        "round": counters["round"],
        "episodes": counters["episodes"],
        "agent_episodes": counters["agent_episodes"],
        "regret": counters["regret"],
        "policy_gap": policy_gap,
        "round_episodes": 0 if record is None else record.episodes,
        "exploring": 0 if record is None else record.exploring,
        "triggered": False if record is None else record.triggered,
        "case1": 0 if record is None else record.case1,
        "case2": 0 if record is None else record.case2,
        "policy_changes": 0 if record is None else record.policy_changes,
        "uploads_lost": counters["uploads_lost"],
        "scalars_up": counters["scalars_up"],
        "scalars_down": counters["scalars_down"],
        "bytes_up": up.bytes_sent,
        "bytes_down": down.bytes_sent,
        "messages_up": up.messages_sent,
        "messages_down": down.messages_sent,
        "delivered_up": up.messages_delivered,
        "delivered_down": down.messages_delivered,
        "wall_s": round(counters["wall_s"], 3),
    }


def _loop(
    exp: Experiment,
    state: FedQState,
    counters: dict[str, Any],
    progress: bool,
    callbacks: tuple[RoundCallback, ...],
) -> RunDir:
    config, rundir = exp.config, exp.rundir
    handler = rundir.log_handler()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info(
        "run %s: FedQ-%s, M = %d, (H, S, A) = %s, episodes %d..%d per agent",
        config.name,
        config.algorithm.bonus,
        config.agents,
        (exp.mdp.horizon, exp.mdp.states, exp.mdp.actions),
        counters["episodes"] + 1,
        config.episodes,
    )
    bar = Progress(
        TextColumn("[bold]episodes/agent"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("round {task.fields[round]}  regret {task.fields[regret]}  up {task.fields[up]}"),
        TimeElapsedColumn(),
        disable=not progress,
    )
    task = bar.add_task(
        "fedq", total=config.episodes, completed=counters["episodes"], round=0, regret="0", up="0 B"
    )
    try:
        with bar:
            while counters["episodes"] < config.episodes:
                round = counters["round"] + 1
                started = time.perf_counter()
                state, record = exp.federation.run_round(state, round, config.episodes - counters["episodes"])
                counters["wall_s"] += time.perf_counter() - started
                rundir.append_ledger(exp.ledger, round)
                counters["round"] = round
                counters["episodes"] += record.episodes
                counters["agent_episodes"] += record.episodes * record.exploring
                counters["regret"] += record.regret
                counters["scalars_up"] += record.scalars_up
                counters["scalars_down"] += record.scalars_down
                counters["uploads_lost"] += record.uploads_lost
                row = _row(exp, counters, record, record.policy_gap)
                rundir.append_jsonl(rundir.metrics, row)
                finished = counters["episodes"] >= config.episodes
                if round % config.checkpoint.every == 0 or finished:
                    checkpoint.save(
                        rundir.checkpoint_dir(round),
                        state,
                        MemoryStateStore(),
                        counters,
                        rundir=rundir,
                        pinned=(MDP_FILE,),
                    )
                    rundir.prune_checkpoints(config.checkpoint.keep)
                bar.update(
                    task,
                    completed=counters["episodes"],
                    round=round,
                    regret=f"{counters['regret']:.1f}",
                    up=human_bytes(row["bytes_up"]),
                )
                for callback in callbacks:
                    callback(round, row)
        rundir.finished()
    finally:
        log.removeHandler(handler)
        handler.close()
    return rundir


def headline(rundir: RunDir) -> str:
    """The one line ``taciturn run`` prints when a FedQ run ends."""
    last = rundir.read_metrics()[-1]
    return (
        f"{last['episodes']} episodes per agent in {last['round']} rounds, regret {last['regret']:.1f}, "
        f"{last['bytes_up'] / 1e6:.3f} MB up, {last['bytes_down'] / 1e6:.3f} MB down, {last['wall_s']} s"
    )


def compare(rundirs: list[RunDir], out: Path) -> tuple[Path, dict[str, dict]]:
    """`taciturn compare` for FedQ runs: regret and rounds overlaid, and a row per run."""
    keys = ["agents M", "episodes per agent", "rounds", "regret (all agents)", "Regret / sqrt(M T)"]
    keys += ["MB up", "MB down"]
    rows = {str(r.path): summary(r) for r in rundirs}
    return write_fedq_comparison(rundirs, out), {run: {k: s[k] for k in keys} for run, s in rows.items()}
