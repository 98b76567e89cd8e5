"""Run a bandits config: every method side by side on the same independent runs, into a run directory.

config.toml       the resolved config
metrics.jsonl     one row per (record, method): round (record index), t (steps), method, and per
                  repetition: regret, bytes/messages up and down (sent, delivered), f1, plus wall_s
ledger.csv        round, method, repetition, client, direction, messages and bytes (sent, delivered),
                  one row per record, agent and direction that saw traffic
checkpoints/      round_NNNNNN/{state.safetensors, progress.json}
plots/, report.html, run.log
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from taciturn.bandits import environments as envs
from taciturn.bandits import ratings
from taciturn.bandits.environments import Environment
from taciturn.bandits.exchange import FIELDS, Exchange
from taciturn.bandits.linucb import Confidence
from taciturn.bandits.rules import Bass, Club, DynUcb, Independent, Oracle, Pooled, Sclub, SharingRule
from taciturn.bandits.simulation import Problem, Simulation
from taciturn.core.codec import encode
from taciturn.core.folder import Folder
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams
from taciturn.experiments import checkpoint, memory
from taciturn.experiments.bandits_config import BanditsConfig, RatingsEnvironment, UnclusteredEnvironment
from taciturn.experiments.config import ConfigError, load_run_config, to_toml
from taciturn.report.bandits import summary_rows
from taciturn.report.rundir import RunDir

log = logging.getLogger("taciturn")
RecordCallback = Callable[[int, list[dict]], None]
LEDGER_COLUMNS = ("round", "method", "repetition", "client", "direction", *FIELDS)


def environment(config: BanditsConfig, seed: int) -> Environment:
    """The environment of the run with this seed (stream purpose "environment")."""
    env, rng = config.environment, Streams(seed).numpy(0, SERVER, "environment")
    if isinstance(env, RatingsEnvironment):
        if env.path is not None:
            matrix, attributes = ratings.movielens(env.path, env.num_agents, env.num_arms, env.rank)
            return ratings.ratings_environment(matrix, attributes, env.dim, env.noise, None)
        matrix, attributes, groups = ratings.synthetic(
            rng, env.num_agents, env.num_arms, env.rank, env.num_clusters
        )
        return ratings.ratings_environment(matrix, attributes, env.dim, env.noise, groups)
    if isinstance(env, UnclusteredEnvironment):
        return envs.unclustered(rng, env.num_agents, env.num_arms, env.dim, env.spread, env.noise)
    return envs.clustered(rng, env.num_agents, env.num_arms, env.dim, env.num_clusters, env.noise)


def rule(config: BanditsConfig, name: str, problem: Problem, confidence: Confidence) -> SharingRule:
    reps, agents = problem.repetitions, problem.agents
    if name == "bass":
        return Bass(reps, agents, dataclasses.replace(confidence, scale=config.bass.scale), config.bass.test)
    if name == "club":
        return Club(reps, agents, config.club.gamma)
    if name == "sclub":
        return Sclub(reps, agents, problem.dim, config.sclub.alpha)
    if name == "dynucb":
        k = config.dynucb_clusters
        initial = np.stack(
            [Streams(s).numpy(0, SERVER, "dynucb").integers(k, size=agents) for s in problem.seeds]
        )
        return DynUcb(initial, k)
    if name == "oracle":
        return Oracle(problem.labels)
    return {"independent": Independent, "pooled": Pooled}[name](reps, agents)


def check_memory(config: BanditsConfig) -> None:
    """What the simulations hold, before any is built: per method the agents' Gram matrices, their
    inverses and their pools (repetitions x agents x dim x dim, float64) and who shares with whom
    (agents x agents); per repetition the arms' features and rewards, the clusters' parameters, the
    schedule and the noise."""
    env, reps = config.environment, config.repetitions
    agents, arms, dim = env.num_agents, env.num_arms, env.dim
    clusters = getattr(env, "num_clusters", 0)  # one parameter drawn per cluster, empty ones too
    per_method = reps * (3 * 8 * agents * dim * dim + agents * agents)
    shared = reps * (8 * agents * arms * (dim + 1) + 8 * clusters * dim + 16 * config.horizon)
    memory.check_fits(
        f"bandits: {len(config.methods)} methods x {reps} repetitions of {agents:,} agents, {arms:,} arms "
        f"in dimension {dim:,}, {config.horizon:,} steps",
        len(config.methods) * per_method + shared,
        "use fewer agents, arms, dimensions, repetitions or steps",
    )


def build(config: BanditsConfig) -> dict[str, Simulation]:
    """One simulation per method, all on the same environments, schedules and noise."""
    check_memory(config)
    environments = [environment(config, seed) for seed in config.seeds]
    problem = Problem.build(environments, config.seeds, config.horizon)
    c = config.linucb
    confidence = Confidence(
        lam=c.lam,
        noise_bound=environments[0].noise if c.noise_bound is None else c.noise_bound,
        # each repetition its own S: its numbers must not depend on the seeds run beside it
        norm_bound=np.array([e.norm_bound for e in environments]) if c.norm_bound is None else c.norm_bound,
        delta=c.delta,
        scale=c.alpha,
    )
    return {
        name: Simulation(
            problem,
            rule(config, name, problem, confidence),
            confidence,
            Exchange(config.seeds, config.channel.drop_up, config.channel.drop_down, config.record_every),
        )
        for name in config.methods
    }


def start(
    config: BanditsConfig,
    out: Path,
    overwrite: bool = False,
    progress: bool = True,
    callbacks: tuple[RecordCallback, ...] = (),
) -> RunDir:
    rundir = RunDir(out)
    with rundir.lock():
        rundir.check_free(overwrite)
        try:
            simulations = build(config)  # everything that can fail on the config or the data fails here
        except ConfigError:
            raise
        except (ratings.RatingsNotFound, ValueError) as error:
            raise ConfigError(f"[environment] {error}") from None
        rundir.reset(config, to_toml(config))
        with rundir.fs.open(rundir.rel(rundir.ledger), "w", newline="") as f:
            csv.writer(f).writerow(LEDGER_COLUMNS)
        wall = dict.fromkeys(simulations, 0.0)
        _write_records(rundir, 0, simulations, wall)
        return _loop(config, rundir, simulations, 0, wall, progress, callbacks)


def resume(path: Path, progress: bool = True, callbacks: tuple[RecordCallback, ...] = ()) -> RunDir:
    """Continue from the last checkpoint; the run ends with the numbers of an uninterrupted one."""
    rundir = RunDir(path).require()
    with rundir.lock():
        config = load_run_config(rundir, BanditsConfig)
        latest = rundir.latest_checkpoint()
        if latest is None:
            return start(config, path, overwrite=True, progress=progress, callbacks=callbacks)
        done, folder = latest
        rundir.truncate_to(checkpoint.verify(folder))
        simulations = build(config)
        state = checkpoint.load_message(folder / "state.safetensors").arrays
        expected = {
            f"{name}/{k}": np.asarray(v) for name, s in simulations.items() for k, v in s.state().items()
        }
        wrong = sorted(
            k
            for k in expected.keys() | state.keys()
            if k not in state or k not in expected or state[k].shape != expected[k].shape
        )
        if wrong:
            raise checkpoint.CheckpointError(
                f"{folder / 'state.safetensors'} does not fit this run's config "
                f"(arrays {', '.join(wrong[:4])})"
            )
        for name, simulation in simulations.items():
            simulation.load({k.split("/", 1)[1]: v for k, v in state.items() if k.split("/", 1)[0] == name})
        wall = checkpoint.read_progress(folder)["wall_s"]
        return _loop(config, rundir, simulations, done, wall, progress, callbacks)


def _loop(config, rundir, simulations, done, wall, progress, callbacks) -> RunDir:
    handler = rundir.log_handler()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info(
        "bandits run %s: %s, steps %d..%d",
        config.name,
        ", ".join(simulations),
        done * config.record_every,
        config.horizon,
    )
    rounds = -(-config.horizon // config.record_every)
    columns = (
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[regret]}"),
    )
    try:
        with Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), disable=not progress) as bar:
            task = bar.add_task(
                "run",
                total=config.horizon,
                completed=min(done * config.record_every, config.horizon),
                regret="",
            )
            for index in range(done + 1, rounds + 1):
                for name, simulation in simulations.items():
                    started = time.perf_counter()
                    simulation.advance(config.record_every)
                    wall[name] += time.perf_counter() - started
                rows = _write_records(rundir, index, simulations, wall)
                if index % config.checkpoint.every == 0 or index == rounds:
                    _save_checkpoint(rundir, index, simulations, wall)
                    rundir.prune_checkpoints(config.checkpoint.keep)
                regret = "  ".join(f"{r['method']} {np.mean(r['regret']):.0f}" for r in rows)
                bar.update(task, completed=rows[0]["t"], regret=f"regret: {regret}")
                for callback in callbacks:
                    callback(index, rows)
        rundir.finished()
    finally:
        log.removeHandler(handler)
        handler.close()
    if progress:
        _print_table(rundir)
    return rundir


def _write_records(
    rundir: RunDir, index: int, simulations: dict[str, Simulation], wall: dict[str, float]
) -> list[dict]:
    rows = []
    with rundir.fs.open(rundir.rel(rundir.ledger), "a", newline="") as f:
        writer = csv.writer(f)
        for name, simulation in simulations.items():
            record, ledger_rows = simulation.record()
            rows.append({"round": index, "method": name, **record, "wall_s": round(wall[name], 3)})
            for rep, block in enumerate(ledger_rows):
                for r in block:
                    writer.writerow([index, name, rep, r["client"], r["direction"], *(r[f] for f in FIELDS)])
    for row in rows:
        rundir.append_jsonl(rundir.metrics, row)
    return rows


def _save_checkpoint(
    rundir: RunDir, index: int, simulations: dict[str, Simulation], wall: dict[str, float]
) -> None:
    arrays = {f"{name}/{k}": np.asarray(v) for name, s in simulations.items() for k, v in s.state().items()}

    def write(tmp: Folder) -> None:
        tmp.write_bytes("state.safetensors", encode(Message(arrays=arrays)))
        tmp.write_text("progress.json", json.dumps({"round": index, "wall_s": wall}, indent=1))

    checkpoint.commit(rundir.checkpoint_dir(index), write, rundir)


def _print_table(rundir: RunDir) -> None:
    table = Table(title=f"{rundir.path.name}: final numbers (mean over repetitions)")
    rows = summary_rows(rundir.read_metrics())
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console(stderr=True).print(table)
